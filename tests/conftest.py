"""Shared fixtures: tiny model configs and a tiny generated `shapes` data set."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from captioning.data.shapes import build_shapes
from captioning.models.captioner import Captioner, build_captioner

# Java runs coco-caption's PTB tokenizer and METEOR; tests that need them are skipped without it.
HAS_JAVA = shutil.which("java") is not None
needs_java = pytest.mark.skipif(not HAS_JAVA, reason="needs Java (the coco-caption PTB tokenizer and METEOR)")

TINY_MODEL = {
    "encoder": {"_target_": "captioning.models.encoder.SmallCNN", "channels": [8, 16], "num_pools": 2},
    "attention": {"_target_": "captioning.models.attention.SoftAttention", "attention_dim": 16},
    "decoder": {"_target_": "captioning.models.decoder.ShowAttendTellDecoder", "embed_dim": 16, "hidden_dim": 32,
                "dropout": 0.0},
}


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
