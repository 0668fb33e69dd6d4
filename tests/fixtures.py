"""Helpers the tests share (imported as `from fixtures import ...`; pytest fixtures stay in conftest.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from captioning.runtime import CONF_DIR

# Java runs coco-caption's PTB tokenizer and METEOR; tests that need them are skipped without it.
HAS_JAVA = shutil.which("java") is not None
needs_java = pytest.mark.skipif(not HAS_JAVA, reason="needs Java (the coco-caption PTB tokenizer and METEOR)")

# A captioner small enough for a test to build and train in seconds (8x8 grid for 32 px images).
TINY_MODEL = {
    "encoder": {"_target_": "captioning.models.encoder.SmallCNN", "channels": [8, 16], "num_pools": 2},
    "attention": {"_target_": "captioning.models.attention.SoftAttention", "attention_dim": 16},
    "decoder": {"_target_": "captioning.models.decoder.ShowAttendTellDecoder", "embed_dim": 16, "hidden_dim": 32,
                "dropout": 0.0},
}


def compose_tiny_train(shapes_json: Path, *overrides: str) -> DictConfig:
    """The train config of a tiny run on the `shapes_json` fixture's data set (seconds per epoch), plus overrides."""
    root = Path(shapes_json).parent
    small_attention = [] if any(o.startswith("attention=") for o in overrides) else ["attention.attention_dim=16"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=[
            f"dataset.root={root}", "dataset.generate.num_train=48", "dataset.generate.num_val=12",
            "dataset.generate.num_test=12", "dataset.generate.image_size=32", "dataset.generate.seed=1",
            "dataset.generate.object_scale=1.0", *small_attention,
            "dataset.batch_size=8", "encoder.channels=[8,16]", "encoder.num_pools=2",
            "decoder.embed_dim=16", "decoder.hidden_dim=32", "trainer.progress=false", "eval.metrics=[bleu,cider]",
            "eval.num_figures=2", *overrides])
