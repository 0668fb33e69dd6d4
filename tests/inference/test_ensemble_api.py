"""captioning.load([...]): a test-time ensemble through the Python API. A list of one checkpoint and two copies of
one give that checkpoint's captions; two different models give the library ensemble's captions, with the chosen
model's maps and the beam's alternatives; what cannot be ensembled is one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from shapes_checkpoints import LUONG_MODEL, shapes_checkpoint, shapes_vocabulary

import captioning
from captioning.data.images import load_image
from captioning.data.readers.karpathy import read_karpathy
from captioning.models.ensemble import Ensemble


@pytest.fixture(scope="module")
def checkpoints(shapes_json: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("api-ensemble")
    return (shapes_checkpoint(folder / "sat.pt", shapes_json),
            shapes_checkpoint(folder / "luong.pt", shapes_json, LUONG_MODEL, seed=1))


@pytest.fixture(scope="module")
def images(shapes_json: Path) -> list[Path]:
    return [r.path for r in read_karpathy(shapes_json, "test")][:4]


def test_one_checkpoint_in_a_list_and_two_copies_caption_as_the_checkpoint(checkpoints, images):
    a, _ = checkpoints
    alone = captioning.load(a, device="cpu").caption(images, beam_size=3, max_len=8, alternatives=2)
    listed = captioning.load([a], device="cpu").caption(images, beam_size=3, max_len=8, alternatives=2)
    twice = captioning.load([a, a], device="cpu")
    assert isinstance(twice.model, Ensemble)
    doubled = twice.caption(images, beam_size=3, max_len=8, alternatives=2)
    for x, y, z in zip(alone, listed, doubled, strict=True):
        assert x.to_dict() == y.to_dict() and np.array_equal(x.attention, y.attention)
        assert z.words == x.words and np.array_equal(z.attention, x.attention)
        assert z.log_prob == pytest.approx(x.log_prob, abs=1e-5)
        assert [w.words for w in z.alternatives] == [w.words for w in x.alternatives]


@pytest.mark.parametrize("maps_from, grid", [(0, (8, 8)), (1, (4, 4))])
def test_two_models_caption_as_the_library_ensemble(checkpoints, images, maps_from, grid):
    a, b = checkpoints
    model = captioning.load([a, b], device="cpu", ensemble_mean="logprob", maps_from=maps_from)
    assert isinstance(model.model, Ensemble) and model.model.mean == "logprob"
    results = model.caption(images, beam_size=3, max_len=8, alternatives=2)
    batch = torch.stack([model.transform(load_image(p)) for p in images])
    decoded, got_grid = model.model.generate(batch, beam_size=3, max_len=8, n_best=2)
    assert got_grid == grid
    for r, toks, score in zip(results, decoded.tokens, decoded.scores.tolist(), strict=True):
        assert r.words == model.vocab.decode(toks) and r.log_prob == pytest.approx(score, abs=1e-6)
        assert r.attention.shape == (len(r.words), *grid)
        np.testing.assert_allclose(r.attention.sum(axis=(1, 2)), 1.0, atol=1e-5)
        assert 1 <= len(r.alternatives) <= 2 and r.alternatives[0].words == tuple(r.words)


def test_what_cannot_be_ensembled_is_one_line(checkpoints, shapes_json, tmp_path):
    a, b = checkpoints
    smaller = shapes_checkpoint(tmp_path / "small.pt", shapes_json, vocab=shapes_vocabulary(shapes_json, max_size=5))
    for call, words in ((lambda: captioning.load([], device="cpu"), "at least one checkpoint"),
                        (lambda: captioning.load([a, smaller], device="cpu"), "another vocabulary"),
                        (lambda: captioning.load([a, b], device="cpu", maps_from=3), "maps_from=3 names no model"),
                        (lambda: captioning.load([a], device="cpu", maps_from=1), "maps_from=1 names no model")):
        with pytest.raises(ValueError, match=words) as err:
            call()
        assert "\n" not in str(err.value)
