"""Build the vocabulary and split data sets from a `dataset` config group.

The files are read by the reader `dataset.reader` names (conf/dataset/reader/: karpathy or coco), after the
data set's `generate` step if it has one (conf/dataset/shapes.yaml). Both are `_target_`s looked up in the registry
(captioning/factory/registry.py), never imported: a checkpoint's stored dataset section is rebuilt the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from captioning.data.dataset import CachedGrids, CaptionDataset
from captioning.data.prepared.arrays import CaptionTable, caption_counts
from captioning.data.prepared.store import open_or_prepare
from captioning.data.readers.records import SPLITS, ImageRecord, collector_paused
from captioning.data.vocab import Vocabulary
from captioning.factory import registry

logger = logging.getLogger(__name__)
LEGACY_FORMATS = ("karpathy", "coco")  # `dataset.format` of a dataset section written before dataset.reader


def _plain(dataset_cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(dataset_cfg, DictConfig):
        return OmegaConf.to_container(dataset_cfg, resolve=True)  # type: ignore[return-value]
    return dict(dataset_cfg)


def _legacy_reader(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The reader of a dataset section stored before `dataset.reader` (an older checkpoint's): `format` named it."""
    fmt = cfg.get("format", "karpathy")
    if fmt == "karpathy":
        return {"_target_": "karpathy", "annotations": cfg.get("annotations"),
                "image_root": cfg.get("image_root")}
    if fmt == "coco":
        return {"_target_": "coco", "image_root": cfg.get("image_root"),
                **(cfg.get("coco") or {})}
    raise ValueError(f"dataset.format must be one of {LEGACY_FORMATS}, got {fmt!r} (or set dataset.reader)")


def _generate(spec: Any, within: Path | None) -> None:
    """Run a `dataset.generate` step; with `within` (a checkpoint's data set) it may write only under that folder:
    elsewhere the data set must already be there, made with the same settings."""
    generator, kwargs = registry.resolve("generator", spec, "dataset.generate")
    root = Path(str(kwargs.get("root")))
    writable = within is None or root.resolve().is_relative_to(within.resolve())
    try:
        generator(**kwargs, writable=writable)
    except ValueError as err:
        if writable:
            raise
        raise ValueError(f"{err}: the checkpoint's dataset.generate.root {root} is outside data_dir {within}, the "
                         "only folder where a checkpoint's data set is generated; pass dataset=NAME (your config's "
                         "data set) or data_dir=FOLDER") from None


def _reader(cfg: Mapping[str, Any],
            within: Path | None = None) -> tuple[Callable[..., Any], dict[str, Any], dict[str, Any]]:
    """Run the data set's `generate` step if it has one (under `within` only, if given: see _generate); the reader
    `dataset.reader` names, its arguments, its spec."""
    if cfg.get("generate") is not None:
        _generate(cfg["generate"], within)
    spec = cfg["reader"] if cfg.get("reader") is not None else _legacy_reader(cfg)
    reader, kwargs = registry.resolve("reader", spec, "dataset.reader")
    return reader, kwargs, dict(spec)


def load_records(dataset_cfg: DictConfig | Mapping[str, Any], splits: Sequence[str],
                 within: Path | None = None) -> dict[str, list[ImageRecord]]:
    """Run the data set's `generate` step if it has one (writing only under `within` if given), then read the splits
    with the reader `dataset.reader` names."""
    reader, kwargs, _ = _reader(_plain(dataset_cfg), within)
    with collector_paused():
        return reader(splits=list(splits), **kwargs)


def all_records(dataset_cfg: DictConfig | Mapping[str, Any]) -> list[ImageRecord]:
    """Every image of the train, val and test splits (what a feature cache for the data set holds)."""
    records = load_records(dataset_cfg, SPLITS)
    return [r for s in SPLITS for r in records[s]]


def load_table(dataset_cfg: DictConfig | Mapping[str, Any], write: bool = True,
               within: Path | None = None) -> CaptionTable | None:
    """Every split's captions from the prepared set under `dataset.prepared` (built first if none fits: see
    captioning/data/prepared/store.py), or None when dataset.prepared is not set. `write=False` never writes a set (a
    dataset section taken from a checkpoint: only one that already exists is opened; `within`: see load_records)."""
    cfg = _plain(dataset_cfg)
    if not cfg.get("prepared"):
        return None
    reader, kwargs, spec = _reader(cfg, within)
    return open_or_prepare(cfg["prepared"], reader, spec, lambda: reader(splits=list(SPLITS), **kwargs), write)


def build_vocab(records: Sequence[ImageRecord], min_freq: int, max_size: int | None) -> Vocabulary:
    """Vocabulary from training captions only."""
    vocab = Vocabulary.build((c for r in records for c in r.captions), min_freq=min_freq, max_size=max_size)
    logger.info("vocabulary: %d words (min_freq=%d, max_size=%s)", len(vocab), min_freq, max_size)
    return vocab


def _records(dataset_cfg: DictConfig, wanted: list[str], vocab: Vocabulary | None,
             within: Path | None) -> tuple[Vocabulary | None, Mapping[str, Sequence[ImageRecord]]]:
    """The wanted splits' records (views of the prepared set when there is one) and the vocabulary if it was None."""
    try:
        table = load_table(dataset_cfg, within is None, within)
    except ValueError:
        if set(wanted) >= set(SPLITS):
            raise
        # Prepared sets hold train, val and test; a file that lacks one can still give the splits asked for.
        logger.info("prepared captions need the train, val and test splits; reading %s directly", wanted)
        table = None
    if table is None:
        records: Mapping[str, Sequence[ImageRecord]] = load_records(dataset_cfg, wanted, within)
        if vocab is None:
            vocab = build_vocab(records["train"], dataset_cfg.min_word_freq, dataset_cfg.get("max_vocab"))
        return vocab, records
    if vocab is None:
        vocab = table.vocabulary(dataset_cfg.min_word_freq, dataset_cfg.get("max_vocab"))
        logger.info("vocabulary: %d words (min_freq=%d, max_size=%s)", len(vocab), dataset_cfg.min_word_freq,
                    dataset_cfg.get("max_vocab"))
    return vocab, {s: table.split(s) for s in wanted}


def build_datasets(dataset_cfg: DictConfig, transform: Callable, splits: Sequence[str] = ("train", "val", "test"),
                   vocab: Vocabulary | None = None, features: CachedGrids | None = None,
                   checkpoint_data: Path | None = None) -> tuple[Vocabulary, dict[str, CaptionDataset]]:
    """Datasets for the splits; the vocabulary is built from `train` unless one is given (e.g. a checkpoint's).

    With a feature cache the data sets yield cached annotation grids instead of images. The `train` split draws
    dataset.captions_per_image captions of an image each time it is read (evaluation splits need none drawn).
    With dataset.prepared the captions come from a prepared set (written there first); the data sets are the same,
    caption for caption. `checkpoint_data`: the section is a checkpoint's (someone else's), so its prepared set is
    only opened, never written, and its `generate` step writes only under this folder (the run's data_dir).
    """
    wanted = list(splits) if vocab is not None or "train" in splits else ["train", *splits]
    vocab, records = _records(dataset_cfg, wanted, vocab, checkpoint_data)
    assert vocab is not None
    max_len = int(dataset_cfg.max_caption_len)
    per_image = {"train": dataset_cfg.get("captions_per_image")}
    cache = bool(dataset_cfg.get("cache_images", False))
    data: dict[str, Any] = {s: CaptionDataset(records[s], vocab, transform, max_len, per_image.get(s), features, cache)
                            for s in splits}
    for s, d in data.items():
        logger.info("%s split: %d images, %d captions", s, len(d), int(caption_counts(d.encoded).sum()))
    return vocab, data
