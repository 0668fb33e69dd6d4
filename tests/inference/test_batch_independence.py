"""An image's caption does not depend on its batch (issue 46, item 5): alone, beside other images and in any position
of the batch it gets the same words, log-probability and attention maps, for every decoder and attention with greedy
and beam search, through the Python API (images of different sizes) and through the exported runner.

The words must be identical. Log-probabilities and maps may differ in the last float32 bits: a batch of B rows goes
through other matrix-multiply blockings than one row. The tolerances below (1e-5) are four orders of magnitude
under the smallest gap between two words' log-probabilities that could change a choice on these models.
(Region sets of different sizes, padded in one batch, are tests/training/test_region_sets.py's.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from family import ATTENTIONS, DECODERS, D, build, refusal
from PIL import Image

import captioning
from captioning.data.shapes.generate import render_image
from captioning.export.exporter import export_checkpoint
from captioning.export.runner import Runner
from captioning.models.captioner import Captioner
from captioning.models.encoder import SmallCNN

ATOL = 1e-5
ORDERS = {"as given": [0, 1, 2, 3, 4], "reversed": [4, 3, 2, 1, 0], "shuffled": [2, 4, 0, 3, 1]}


def _images() -> torch.Tensor:
    """Five different 4 x 5 images: the family's grid (4, 5) through a SmallCNN without pooling."""
    torch.manual_seed(11)
    return torch.rand(5, 3, 4, 5)


@pytest.mark.parametrize("decoder", DECODERS)
def test_a_caption_is_the_same_alone_and_anywhere_in_a_batch(decoder):
    images = _images()
    for attention in [a for a in ATTENTIONS if refusal(decoder, a) is None]:
        model = Captioner(SmallCNN(channels=(D,), num_pools=0), build(decoder, attention)).eval()
        for beam in (1, 3):
            alone = [model.generate(images[i: i + 1], beam, 6)[0] for i in range(len(images))]
            for name, order in ORDERS.items():
                batched, grid = model.generate(images[order], beam, 6)
                assert grid == (4, 5)
                for position, i in enumerate(order):
                    where = f"{decoder} + {attention}, beam {beam}, image {i} at {position} ({name})"
                    assert batched.tokens[position] == alone[i].tokens[0], where
                    torch.testing.assert_close(batched.scores[position], alone[i].scores[0], atol=ATOL, rtol=0,
                                               msg=where)
                    torch.testing.assert_close(batched.alphas[position], alone[i].alphas[0], atol=ATOL, rtol=0,
                                               msg=where)


def _photos(count: int = 6) -> list[Image.Image]:
    """`shapes` scenes drawn at different sizes (the encoder resizes them to one)."""
    sizes = [(64, 64), (80, 48), (40, 72), (97, 97), (33, 50), (120, 64)]
    out = []
    for k in range(count):
        image, _ = render_image(np.random.default_rng(k), 64)
        out.append(image.resize(sizes[k % len(sizes)]))
    return out


def _same_results(batched, alone, where: str) -> None:
    assert batched.words == alone.words, where
    assert batched.log_prob == pytest.approx(alone.log_prob, abs=ATOL), where
    np.testing.assert_allclose(batched.attention, alone.attention, atol=ATOL, err_msg=where)


@pytest.mark.parametrize("beam", [1, 3])
def test_the_api_captions_an_image_alike_in_any_batch(trained_run: Path, beam):
    model = captioning.load(trained_run / "checkpoints" / "best.pt", device="cpu")
    photos = _photos()
    alone = [model.caption(p, beam_size=beam) for p in photos]
    for order, batch_size in (([0, 1, 2, 3, 4, 5], 6), ([5, 3, 1, 0, 2, 4], 4), ([2, 0, 5, 1, 4, 3], 3)):
        results = model.caption([photos[i] for i in order], beam_size=beam, batch_size=batch_size)
        for position, i in enumerate(order):
            _same_results(results[position], alone[i], f"beam {beam}, image {i} at {position} of {order}")


def test_the_exported_runner_captions_an_image_alike_in_any_batch(trained_run: Path, tmp_path):
    export_checkpoint(trained_run / "checkpoints" / "best.pt", tmp_path, optimize=False)
    runner = Runner(tmp_path)
    photos = [p.resize((32, 32)) for p in _photos()]  # the tiny model's export takes its 32 px images as they are
    for beam in (1, 3):
        alone = [runner.caption([p], beam_size=beam)[0] for p in photos]
        for order in ([0, 1, 2, 3, 4, 5], [5, 3, 1, 0, 2, 4]):
            got = runner.caption([photos[i] for i in order], beam_size=beam, batch_size=4)
            for position, i in enumerate(order):
                where = f"beam {beam}, image {i} at {position} of {order}"
                assert got[position].tokens == alone[i].tokens, where
                assert got[position].log_prob == pytest.approx(alone[i].log_prob, abs=ATOL), where
                np.testing.assert_allclose(got[position].alphas, alone[i].alphas, atol=ATOL, err_msg=where)
