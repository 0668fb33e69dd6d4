"""Checkpoints of untrained tiny models on the `shapes_json` fixture's data set, written in a fraction of a second
(imported as `from shapes_checkpoints import ...`): what tests of loading, evaluating and ensembling checkpoints need
when the weights do not matter."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from fixtures import TINY_MODEL

from captioning.checkpoint import save_checkpoint
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import Vocabulary
from captioning.factory.models import build_captioner

# Another architecture for the same images and vocabulary: Luong's decoder over a deeper SmallCNN (a 4 x 4 grid at
# 32 px, where TINY_MODEL's is 8 x 8); the same input transform.
LUONG_MODEL: dict[str, Any] = {
    "encoder": {**TINY_MODEL["encoder"], "channels": [8, 16, 16], "num_pools": 3},
    "attention": dict(TINY_MODEL["attention"]),
    "decoder": {"_target_": "luong", "embed_dim": 16, "hidden_dim": 32, "dropout": 0.0},
}


def shapes_vocabulary(shapes_json: Path, max_size: int | None = None) -> Vocabulary:
    """The vocabulary training builds from the set's train captions (its `max_size` most frequent words)."""
    return Vocabulary.build((c for r in read_karpathy(shapes_json, "train") for c in r.captions), max_size=max_size)


def shapes_checkpoint(path: Path, shapes_json: Path, model: dict[str, Any] = TINY_MODEL, seed: int = 0,
                      vocab: Vocabulary | None = None) -> Path:
    """A checkpoint of `model` with random weights (seeded), the set's vocabulary (or `vocab`) and the dataset
    section training writes for it (read from its files as they are: nothing generated)."""
    vocab = vocab or shapes_vocabulary(shapes_json)
    torch.manual_seed(seed)
    captioner = build_captioner(copy.deepcopy(model), len(vocab))
    root = str(Path(shapes_json).parent)
    dataset = {"name": "shapes", "root": root, "annotations": str(shapes_json), "image_root": root,
               "reader": {"_target_": "karpathy", "annotations": str(shapes_json), "image_root": root},
               "min_word_freq": 1, "max_vocab": 10000, "max_caption_len": 20, "batch_size": 8,
               "captions_per_image": 2, "num_workers": 0, "features": None, "generate": None}
    return save_checkpoint(path, captioner, vocab, {"model": copy.deepcopy(model), "dataset": dataset})
