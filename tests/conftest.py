"""Shared pytest fixtures: a tiny captioner and a tiny generated `shapes` data set (plain helpers: fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixtures import TINY_MODEL

from captioning.data.shapes import build_shapes
from captioning.models.captioner import Captioner, build_captioner


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
