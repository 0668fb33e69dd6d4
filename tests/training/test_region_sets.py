"""Region sets through the pipeline (issue 44, item 9): a data source whose images hold different numbers of regions
(the bottom-up region features of the next issue) is batched with zero padding and a mask, and the mask reaches
every attention in training (both objectives), decoding, beam search and evaluation. The source here is generated:
each image id gets its own seeded (L_i, D) set."""

from __future__ import annotations

import json
from unittest import mock

import pytest
import torch
from family import ATTENTIONS, DECODERS, D, build, refusal
from fixtures import TINY_CHANNELS, compose_tiny_train

from captioning.data.dataset import CaptionDataset, collate, pad_regions
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import Vocabulary
from captioning.evaluation.split import decode_split
from captioning.factory.load import load_model
from captioning.models.captioner import Captioner
from captioning.models.encoder import SmallCNN
from captioning.train import train
from captioning.training.losses import MovingAverageBaseline
from captioning.training.objectives import CrossEntropy, LossContext, SelfCritical


class GeneratedSets:
    """A region source: image `i` holds 2 + (5 i mod 7) regions of `dim` seeded values (a CachedGrids with sets)."""

    sets = True

    def __init__(self, dim: int, empty: int | None = None):
        self.dim, self.empty = dim, empty

    def __getitem__(self, image_id: int) -> torch.Tensor:
        count = 0 if image_id == self.empty else 2 + (5 * image_id) % 7
        return torch.randn(count, self.dim, generator=torch.Generator().manual_seed(image_id))

    def require(self, records) -> None:
        """Holds every image."""


def _captioner(decoder: str, attention: str) -> Captioner:
    return Captioner(SmallCNN(channels=(D,), num_pools=0), build(decoder, attention)).eval()


def _batch(counts=(5, 2, 7), fill: float = 0.0) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Region sets of these sizes, padded (padding filled with `fill`), and their mask."""
    torch.manual_seed(3)
    sets = [torch.relu(torch.randn(n, D)) for n in counts]
    a, mask = pad_regions(sets)
    return sets, a.masked_fill(~mask.unsqueeze(-1), fill), mask


def test_collate_pads_region_sets_and_masks_the_padding(shapes_json):
    records = read_karpathy(shapes_json, "val")[:4]
    vocab = Vocabulary.build(c for r in records for c in r.captions)
    ds = CaptionDataset(records, vocab, transform=None, features=GeneratedSets(6, empty=records[1].image_id))
    batch = collate([ds[i] for i in range(4)])
    counts = [ds.features[records[i].image_id].shape[0] for i in (0, 2, 3)]
    assert batch.indices == [0, 2, 3] and batch.images.shape == (3, max(counts), 6)
    assert batch.mask.sum(1).tolist() == counts and batch.mask.dtype == torch.bool
    assert (batch.images[~batch.mask] == 0).all()  # zero padding
    assert batch.skipped == [f"image {records[1].image_id} has no regions in its feature set"]  # counted, not fed
    odd = dict(ds[0], image=torch.zeros(3, 5))  # another D cannot join the batch: left out with its reason
    assert "becomes a tensor of shape (3, 5)" in collate([ds[2], odd]).skipped[0]
    assert collate([ds[0]]).mask.all()  # one set alone: all real, still a mask (a row of regions, not a grid)
    assert batch.to("cpu").mask is not None


@pytest.mark.parametrize("decoder", DECODERS)
def test_every_attention_decodes_a_padded_set_as_it_decodes_it_alone(decoder):
    """Greedy and beam search over a batch of differently sized sets: padding gets exactly zero weight, and each
    image's caption, score and maps are those it gets alone (up to float summation order)."""
    sets, a, mask = _batch()
    for attention in [a for a in ATTENTIONS if refusal(decoder, a) is None]:
        model = _captioner(decoder, attention)
        for beam in (1, 2):
            batched, grid = model.generate(a, beam, 6, mask=mask)
            assert grid == (1, a.shape[1])
            for i, regions in enumerate(sets):
                alone, _ = model.generate(regions.unsqueeze(0), beam, 6, mask=torch.ones(1, len(regions), dtype=bool))
                where = f"{decoder} + {attention}, beam {beam}, image {i}"
                assert batched.tokens[i] == alone.tokens[0], where
                maps = batched.alphas[i]  # (T, L)
                assert (maps[:, len(regions):] == 0).all(), where
                torch.testing.assert_close(maps[:, :len(regions)], alone.alphas[0], atol=1e-5, rtol=1e-4, msg=where)
                torch.testing.assert_close(batched.scores[i], alone.scores[0], atol=1e-5, rtol=1e-5, msg=where)


def _context(model, samples_regions=False) -> LossContext:
    return LossContext(model, model, torch.device("cpu"), None, MovingAverageBaseline(0.9), samples_regions)


@pytest.mark.parametrize("attention", ["soft", "hard", "local", "monotonic", "multilevel"])
def test_cross_entropy_never_reads_the_padding(attention):
    """The loss (with the doubly stochastic term over each caption's real regions) and every gradient are the same
    whatever the padding holds, and the padded annotations get exactly zero gradient."""
    from captioning.data.dataset import Batch

    captions = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0], [1, 9, 10, 2, 0], [1, 4, 2, 0, 0]])
    image_index = torch.tensor([0, 1, 2, 2])
    objective = CrossEntropy(attention_weight=1.0)
    results = []
    for fill in (0.0, 50.0):
        model = _captioner("sat", attention).train()
        _, a, mask = _batch(fill=fill)
        a.requires_grad_(True)
        torch.manual_seed(4)
        model.decoder.attention.begin_batch()
        terms, _ = objective.loss(_context(model, attention == "hard"), Batch(a, captions, image_index, [0, 1, 2],
                                                                               mask=mask))
        terms.total.backward()
        assert (a.grad[~mask] == 0).all()
        results.append((terms.total.detach(), terms.attention_reg.detach(),
                        [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (loss0, reg0, grads0), (loss1, reg1, grads1) = results
    torch.testing.assert_close(loss0, loss1)
    torch.testing.assert_close(reg0, reg1)
    if attention != "hard":  # the term counts each caption's own regions: the captions' mean of it alone
        sets, a, mask = _batch()
        model = _captioner("sat", attention)  # eval mode: monotonic attention's training noise is drawn per batch
        reg0 = objective.loss(_context(model), Batch(a, captions, image_index, [0, 1, 2], mask=mask))[0].attention_reg
        alone = []
        for i, regions in enumerate(sets):
            rows = (image_index == i).nonzero().squeeze(1)
            terms, _ = objective.loss(_context(model), Batch(regions.unsqueeze(0), captions[rows],
                                                             torch.zeros(len(rows), dtype=torch.long), [i],
                                                             mask=torch.ones(1, len(regions), dtype=torch.bool)))
            alone += [terms.attention_reg] * len(rows)
        torch.testing.assert_close(reg0, torch.stack(alone).mean())
    for g0, g1 in zip(grads0, grads1, strict=True):
        torch.testing.assert_close(g0, g1)


def test_self_critical_samples_and_scores_each_set_within_its_regions(shapes_json):
    from captioning.data.dataset import Batch

    records = read_karpathy(shapes_json, "train")[:3]
    vocab = Vocabulary.build(c for r in records for c in r.captions)
    objective = SelfCritical(samples_per_image=2, max_len=5, attention_weight=1.0)
    objective.prepare(CaptionDataset(records, vocab, transform=None, features=GeneratedSets(D)))
    out = []
    for fill in (0.0, -30.0):
        model = _captioner("sat", "soft").train()
        _, a, mask = _batch(fill=fill)
        a.requires_grad_(True)
        ctx = LossContext(objective.wrap(model), model, torch.device("cpu"), None, MovingAverageBaseline(0.9), False)
        torch.manual_seed(5)
        terms, stats = objective.loss(ctx, Batch(a, torch.zeros(3, 2, dtype=torch.long), torch.arange(3), [0, 1, 2],
                                                 mask=mask))
        terms.total.backward()
        assert (a.grad[~mask] == 0).all()
        out.append((terms.total.detach(), stats["sample_CIDEr"]))
        torch.manual_seed(5)  # the same draws again: the doubly stochastic term counts each sample's own regions
        with torch.no_grad():
            samples = ctx.forward(a, mask)
        coverage = (samples.alphas * samples.mask.unsqueeze(-1)).sum(1)  # (B n, L)
        real = mask.repeat_interleave(2, dim=0)
        torch.testing.assert_close(terms.attention_reg, ((1 - coverage) ** 2 * real).sum(1).mean())
    assert out[0] == out[1]


def test_train_and_evaluate_on_region_sets(shapes_json, tmp_path, caplog):
    """The tiny run end to end on a region source (dataset.features names it): it trains, validates, decodes the
    test split with each image's maps over its own regions, and says why no figure is drawn."""
    sets = GeneratedSets(TINY_CHANNELS[-1])
    cfg = compose_tiny_train(shapes_json, "trainer.max_epochs=2", "dataset.features=generated-sets")
    with mock.patch("captioning.factory.run.open_features", return_value=sets), caplog.at_level("WARNING"):
        metrics = train(cfg, tmp_path)
    assert metrics["num_images"] == 12 and "CIDEr" in metrics and "attention_correctness" not in metrics
    assert json.loads((tmp_path / "metrics.json").read_text())["CIDEr"] == metrics["CIDEr"]
    assert not list(tmp_path.glob("figures/*.png")) and "region sets without boxes carry no map over the image" in caplog.text
    model, vocab, _ = load_model(tmp_path / "checkpoints" / "best.pt")  # decodes the sets as the run did
    ds = CaptionDataset(read_karpathy(shapes_json, "test"), vocab, transform=None, features=sets)
    preds = decode_split(model, ds, beam_size=3, max_len=20, batch_size=5, progress=False)
    assert [json.loads((tmp_path / "results.json").read_text())[k]["caption"] for k in range(3)] == \
        [p.caption for p in preds[:3]]
    for p in preds:
        n = sets[p.image_id].shape[0]
        assert p.alphas.shape[1:] == (1, n)
        torch.testing.assert_close(p.alphas.sum((1, 2)), torch.ones(len(p.alphas)))
