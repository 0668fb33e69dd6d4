"""Build the vocabulary and split data sets from a `dataset` config group."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig

from captioning.data.coco_captions import read_coco_captions
from captioning.data.features import FeatureCache
from captioning.data.karpathy import CaptionDataset, ImageRecord, read_karpathy
from captioning.data.vocab import Vocabulary

logger = logging.getLogger(__name__)
FORMATS = ("karpathy", "coco")  # dataset.format: a Karpathy split file, or raw COCO caption files


def prepare_annotations(dataset_cfg: DictConfig) -> Path:
    """Generate the data set if its config has a `generate` step, and return the annotation file."""
    if dataset_cfg.get("generate") is not None:
        return Path(instantiate(dataset_cfg.generate))
    path = Path(dataset_cfg.annotations)
    if not path.is_file():
        raise FileNotFoundError(f"annotation file not found: {path} (set dataset.annotations=...)")
    return path


def load_records(dataset_cfg: DictConfig, splits: Sequence[str]) -> dict[str, list[ImageRecord]]:
    """Read the requested splits' image records with the reader `dataset.format` names (karpathy | coco)."""
    fmt = dataset_cfg.get("format", "karpathy")
    if fmt == "karpathy":
        ann = prepare_annotations(dataset_cfg)
        root = dataset_cfg.get("image_root")
        return {s: read_karpathy(ann, s, image_root=root) for s in splits}
    if fmt == "coco":
        c = dataset_cfg.get("coco")
        if c is None:
            raise ValueError("dataset.format=coco needs a dataset.coco section with the caption files "
                             "(see conf/dataset/coco.yaml)")
        return read_coco_captions(c.train_captions, c.val_captions, splits, dataset_cfg.image_root,
                                  c.get("train_images", "train2014"), c.get("val_images", "val2014"),
                                  c.get("split_file"), int(c.get("num_val", 5000)), int(c.get("num_test", 5000)))
    raise ValueError(f"dataset.format must be one of {FORMATS}, got {fmt!r}")


def build_vocab(records: Sequence[ImageRecord], min_freq: int, max_size: int | None) -> Vocabulary:
    """Vocabulary from training captions only."""
    vocab = Vocabulary.build((c for r in records for c in r.captions), min_freq=min_freq, max_size=max_size)
    logger.info("vocabulary: %d words (min_freq=%d, max_size=%s)", len(vocab), min_freq, max_size)
    return vocab


def build_datasets(dataset_cfg: DictConfig, transform: Callable, splits: Sequence[str] = ("train", "val", "test"),
                   vocab: Vocabulary | None = None,
                   features: FeatureCache | None = None) -> tuple[Vocabulary, dict[str, CaptionDataset]]:
    """Datasets for the splits; the vocabulary is built from `train` unless one is given (e.g. a checkpoint's).

    With a feature cache the data sets yield cached annotation grids instead of images.
    """
    wanted = list(splits) if vocab is not None or "train" in splits else ["train", *splits]
    records = load_records(dataset_cfg, wanted)
    if vocab is None:
        vocab = build_vocab(records["train"], dataset_cfg.min_word_freq, dataset_cfg.get("max_vocab"))
    max_len = int(dataset_cfg.max_caption_len)
    data: dict[str, Any] = {s: CaptionDataset(records[s], vocab, transform, max_len, features=features)
                            for s in splits}
    for s, d in data.items():
        logger.info("%s split: %d images, %d captions", s, len(d), sum(len(c) for c in d.encoded))
    return vocab, data
