"""Shared pytest fixtures: a tiny captioner, a tiny generated `shapes` data set and a tiny trained run (plain
helpers: fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixtures import TINY_MODEL, compose_tiny_train

from captioning.data.shapes import build_shapes
from captioning.models.captioner import Captioner, build_captioner
from captioning.training.run import train


@pytest.fixture
def tiny_model() -> Captioner:
    """A small captioner over a 12-word vocabulary (8x8 grid for 32 px images)."""
    torch.manual_seed(0)
    return build_captioner(TINY_MODEL, vocab_size=12)


@pytest.fixture(scope="session")
def shapes_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small shapes data set shared by the tests that need real files."""
    root = tmp_path_factory.mktemp("shapes")
    return build_shapes(root, seed=1, num_train=48, num_val=12, num_test=12, image_size=32)


@pytest.fixture(scope="session")
def trained_run(shapes_json: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model trained for 4 epochs on the `shapes_json` set (about 10 s): its run folder, with
    checkpoints/best.pt and metrics.json (test split, beam 3, BLEU / ROUGE-L / CIDEr)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    train(compose_tiny_train(shapes_json, "trainer.max_epochs=4", "eval.num_figures=0",
                             "eval.metrics=[bleu,rouge,cider]"), out)
    return out
