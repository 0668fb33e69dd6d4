"""Helpers the tests share (imported as `from fixtures import ...`; pytest fixtures stay in conftest.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from captioning.runtime import CONF_DIR

# Java runs coco-caption's PTB tokenizer and METEOR; tests that need them are skipped without it, and are in the
# integration tier (`@pytest.mark.integration` above `@needs_java`): each call starts a Java process, and a run of
# the in-process tier alone hides Java (conftest.py's no_jvm_in_process).
HAS_JAVA = shutil.which("java") is not None
needs_java = pytest.mark.skipif(not HAS_JAVA, reason="needs Java (the coco-caption PTB tokenizer and METEOR)")

# The tiny encoder: a SmallCNN of two conv blocks (8 and 16 channels) and two 2x2 pools (32 px -> 8 x 8 grid),
# as a spec's values and as Hydra overrides.
TINY_CHANNELS = [8, 16]
TINY_POOLS = 2
TINY_ENCODER = [f"encoder.channels=[{','.join(map(str, TINY_CHANNELS))}]", f"encoder.num_pools={TINY_POOLS}"]

# A captioner small enough for a test to build and train in seconds (8x8 grid for 32 px images).
TINY_MODEL = {
    "encoder": {"_target_": "captioning.models.encoder.SmallCNN", "channels": list(TINY_CHANNELS),
                "num_pools": TINY_POOLS},
    "attention": {"_target_": "captioning.models.attention.SoftAttention", "attention_dim": 16},
    "decoder": {"_target_": "captioning.models.decoder.ShowAttendTellDecoder", "embed_dim": 16, "hidden_dim": 32,
                "dropout": 0.0},
}


def tiny_overrides(root: str | os.PathLike, *extra: str, sizes: tuple[int, int, int] = (48, 12, 12),
                   batch_size: int = 8, object_scale: float | None = 1.0, epochs: int | None = None,
                   num_figures: int = 1) -> list[str]:
    """Hydra overrides of a tiny training run on a `shapes` set of 32 px images generated under `root` (seed 1),
    then `extra`: `sizes` = (train, val, test) images; `object_scale` None keeps the config's; `epochs` None
    keeps trainer.max_epochs. The tiny model of TINY_MODEL (attention_dim 16 unless `extra` picks an attention),
    no progress bar, BLEU and CIDEr. The defaults are the `shapes_json` fixture's set (seconds per epoch)."""
    num_train, num_val, num_test = sizes
    small_attention = [] if any(o.startswith("attention=") for o in extra) else ["attention.attention_dim=16"]
    return [f"dataset.root={root}", f"dataset.generate.num_train={num_train}", f"dataset.generate.num_val={num_val}",
            f"dataset.generate.num_test={num_test}", "dataset.generate.image_size=32", "dataset.generate.seed=1",
            *([] if object_scale is None else [f"dataset.generate.object_scale={object_scale}"]), *small_attention,
            f"dataset.batch_size={batch_size}", *TINY_ENCODER, "decoder.embed_dim=16", "decoder.hidden_dim=32",
            "trainer.progress=false", *([] if epochs is None else [f"trainer.max_epochs={epochs}"]),
            "eval.metrics=[bleu,cider]", f"eval.num_figures={num_figures}", *extra]


def compose_tiny_train(shapes_json: Path, *overrides: str) -> DictConfig:
    """The train config of a tiny run on the `shapes_json` fixture's data set (seconds per epoch), plus overrides."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=tiny_overrides(Path(shapes_json).parent, *overrides))
