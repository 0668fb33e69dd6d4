"""dataset.length_buckets: batches of similar caption lengths, still a pure function of (seed, epoch, rank), so
runs stay resumable (a bucketed run stopped mid-epoch and resumed: tests/training/test_resume.py)."""

from __future__ import annotations

import numpy as np
import pytest

from captioning.data.dataset import CaptionDataset, CaptionPairs, item_lengths
from captioning.data.vocab import Vocabulary
from captioning.training.randomness import epoch_batches


def _lengths(n: int = 1000) -> np.ndarray:
    return np.random.default_rng(0).integers(6, 25, n).astype(np.float64)  # words, as COCO's spread


def _spread(batches, lengths) -> float:
    """Mean over batches of (longest - shortest) caption length in the batch."""
    return float(np.mean([np.ptp([lengths[i] for i, _ in b]) for b in batches]))


@pytest.mark.parametrize("buckets", [1, 4, 50])
def test_buckets_visit_every_item_once_with_its_seed_in_batches_of_similar_length(buckets):
    lengths = _lengths()
    plain = epoch_batches(1000, 32, seed=3, epoch=2)
    bucketed = epoch_batches(1000, 32, seed=3, epoch=2, lengths=lengths, buckets=buckets)
    assert sorted(k for b in bucketed for k in b) == sorted(k for b in plain for k in b)  # same items, same seeds
    assert len(bucketed) == len(plain) and sum(len(b) < 32 for b in bucketed) == 1  # one short batch, as before
    assert bucketed == epoch_batches(1000, 32, seed=3, epoch=2, lengths=lengths, buckets=buckets)  # pure
    assert bucketed != epoch_batches(1000, 32, seed=3, epoch=3, lengths=lengths, buckets=buckets)  # per epoch
    if buckets == 1:  # a pool of one batch: the same batches, each sorted, in another order
        assert sorted(map(sorted, bucketed)) == sorted(map(sorted, plain))
        assert _spread(bucketed, lengths) == _spread(plain, lengths)
    else:
        assert _spread(bucketed, lengths) < _spread(plain, lengths) / 3
        firsts = [lengths[b[0][0]] for b in bucketed]  # the batches themselves are shuffled, not sorted
        assert firsts != sorted(firsts)


def test_buckets_need_every_items_length():
    with pytest.raises(ValueError, match="length"):
        epoch_batches(10, 4, 0, 0, lengths=np.ones(9), buckets=2)


def test_item_lengths_of_images_and_of_caption_pairs():
    vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>", "a", "b"])
    records = [type("R", (), {"captions": caps, "image_id": i, "path": f"{i}.png"})()
               for i, caps in enumerate([[["a"] * 3, ["b"] * 5], [], [["a", "b"] * 6]])]
    images = CaptionDataset(records, vocab, transform=None, max_len=10)  # the 12-word caption is cut to 10
    assert item_lengths(images).tolist() == [4.0, 0.0, 10.0]  # the mean of each image's captions
    assert item_lengths(CaptionPairs(images)).tolist() == [3.0, 5.0, 10.0]
