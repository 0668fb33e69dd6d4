"""Feature cache: a frozen encoder's annotation grids of every image, computed once and stored on disk.

A cache is a folder:
  meta.json      what made the features: encoder config, weights (name and SHA-256), preprocessing,
                 grid (h, w), D, dtype, cache format, code version, checked_finite (rows checked before storing)
  index.json     the image ids (and files) in row order
  grids.npy      (N, L, D) float16, read memory-mapped; row k holds image index.json["image_ids"][k]
  progress.json  rows written so far and the images that could not be read (rewritten after every batch)

`extract_features` writes a cache and continues an interrupted one where it stopped (or one stopped by a failed
write: see extract_features); it never stores a grid holding NaN or inf. `FeatureCache.open` reads one and refuses
a cache made by another encoder, one not finished, or files that are not what they should be (feature_meta.py: JSON
types, grids.npy's layout, sampled rows finite), with a clear message; every row read is checked finite too.
meta.json is data: its encoder config is only compared with the model's, never built or imported (SECURITY.md).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from captioning import __version__
from captioning.base.files import write_error
from captioning.base.lock import LOCK_NAME
from captioning.data.captions import SplitView
from captioning.data.disk import check_free_space
from captioning.data.feature_meta import (
    CACHE_FORMAT,
    HOW_TO_EXTRACT,
    check_grids_file,
    check_index,
    check_meta,
    check_progress,
    check_sample,
    differences,
    not_finite,
    read_cache_json,
    read_optional,
)
from captioning.data.images import ImageError, load_image
from captioning.data.jsonio import write_json_atomic
from captioning.data.records import ImageRecord
from captioning.models.encoder import Encoder

logger = logging.getLogger(__name__)

# Weights are identified by their hash, not by how they were obtained (a checkpoint stores pretrained=false).
_NOT_COMPARED = ("pretrained", "fine_tune")


def weights_digest(module: nn.Module) -> str:
    """SHA-256 of a module's parameters and buffers (names, shapes, bytes)."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fingerprint(encoder: Encoder, encoder_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What decides the features an encoder computes; two caches are interchangeable iff these are equal."""
    plain = OmegaConf.to_container(encoder_cfg, resolve=True) if isinstance(encoder_cfg, DictConfig) else encoder_cfg
    cfg = {k: v for k, v in dict(cast(Mapping[str, Any], plain)).items() if k not in _NOT_COMPARED}
    return {"format": CACHE_FORMAT, "code_version": __version__, "encoder": cfg,
            "weights_sha256": weights_digest(encoder), "transform": repr(encoder.transform()), "dim": encoder.out_dim}


def check_frozen(encoder: Encoder) -> None:
    """A cache holds fixed features: refuse an encoder that training would change."""
    if any(p.requires_grad for p in encoder.parameters()):
        raise ValueError(f"a feature cache needs a frozen encoder, but {type(encoder).__name__} has trainable "
                         "parameters; use a pretrained VGG/ResNet with encoder.fine_tune=none, or set "
                         "dataset.features=null to encode images on the fly")


def _weights_name(encoder: Encoder) -> str:
    """Human-readable origin of the weights, recorded in meta.json (not compared: the hash is)."""
    arch = getattr(encoder, "arch", None)
    if arch is None or not getattr(encoder, "pretrained", False):
        return "random initialisation (seeded by the run's `seed`)"
    import torchvision

    return str(torchvision.models.get_model_weights(arch).DEFAULT)


class FeatureCache:
    """Read access to a finished cache: `cache[image_id]` is the image's annotation grid a (L, D), float32."""

    def __init__(self, root: Path, meta: dict[str, Any], image_ids: list[int], failed: dict[str, str]):
        self.root, self.meta, self.failed = root, meta, failed
        self.row = {int(i): k for k, i in enumerate(image_ids)}
        self.grid: tuple[int, int] = tuple(meta["grid"]) if meta.get("grid") else (0, 0)
        self._grids: np.ndarray | None = None  # opened lazily, so DataLoader workers each map the file

    @classmethod
    def open(cls, root: str | os.PathLike, encoder: Encoder | None = None,
             encoder_cfg: Mapping[str, Any] | None = None) -> FeatureCache:
        """Open a cache; with an encoder, refuse it unless that encoder (same config and weights) made it.

        Its JSON files and grids.npy's header are checked in full; of the grids, SAMPLE_ROWS rows spread over the
        file are checked finite (feature_meta.py: 6.4 MB read for COCO, whatever N), the others as they are read.
        """
        root = Path(root)
        if not ((root / "meta.json").exists() or (root / "meta.json").is_symlink()):
            raise FileNotFoundError(f"no feature cache at {root} (meta.json missing); create it with {HOW_TO_EXTRACT}")
        meta = check_meta(root, read_cache_json(root / "meta.json"))
        if encoder is not None:
            check_frozen(encoder)
            diff = differences(fingerprint(encoder, encoder_cfg or {}), meta["fingerprint"])
            if diff:
                raise ValueError(f"the feature cache {root} was made by a different encoder or code version, so its "
                                 f"features do not match this model ({'; '.join(diff)}). Extract a new cache with "
                                 f"{HOW_TO_EXTRACT} (another PATH), or use the encoder settings it was made with")
        image_ids = check_index(root, read_cache_json(root / "index.json"))
        done, failed = check_progress(root, read_optional(root / "progress.json", {"rows_done": 0}), image_ids)
        if done < len(image_ids) or meta["grid"] is None:
            raise ValueError(f"the feature cache {root} is unfinished ({done} of {len(image_ids)} "
                             f"images): rerun {HOW_TO_EXTRACT} with the same PATH to finish it")
        if meta["grid"][0] != meta["grid"][1]:
            raise ValueError(f"{root}: cached grids must be square to be fed to the captioner, got {meta['grid']}")
        check_grids_file(root, meta, len(image_ids))
        cache = cls(root, meta, image_ids, failed)
        check_sample(root, cache.grids, image_ids)
        return cache

    @property
    def grids(self) -> np.ndarray:
        """All grids (N, L, D) float16, memory-mapped read-only."""
        if self._grids is None:
            self._grids = np.load(self.root / "grids.npy", mmap_mode="r")
        return self._grids

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_grids": None}  # never pickle the mapped array

    def __len__(self) -> int:
        return len(self.row)

    def __contains__(self, image_id: int) -> bool:
        return image_id in self.row

    def __getitem__(self, image_id: int) -> torch.Tensor:
        """The (L, D) float32 grid of an image; an ImageError if it could not be read at extraction, a ValueError
        naming the row if the row holds NaN or inf."""
        if str(image_id) in self.failed:
            raise ImageError(f"image {image_id} has no cached features: {self.failed[str(image_id)]}")
        row = self.row[image_id]
        a = np.asarray(self.grids[row], dtype=np.float32)  # (L, D)
        # Measured on a COCO row (196 x 512 float16, page cache, one CPU thread): about 10 us on top of the 171 us
        # of reading and converting it (6%), far less than a training step.
        if not np.isfinite(a).all():
            raise not_finite(self.root, row, image_id)
        return torch.from_numpy(a)

    def require(self, records: Sequence[ImageRecord]) -> None:
        """Refuse records whose images the cache does not hold (it was extracted for other splits or data)."""
        ids = records.image_ids if isinstance(records, SplitView) else [r.image_id for r in records]
        missing = [i for i in ids if i not in self.row]
        if missing:
            raise ValueError(f"{len(missing)} of {len(records)} images are not in the feature cache {self.root} "
                             f"(e.g. image ids {missing[:5]}); extract the splits you use with {HOW_TO_EXTRACT}")


class _ImageFiles(Dataset):
    """Transformed images by row; an unreadable file gives its error message instead of a tensor."""

    def __init__(self, records: Sequence[ImageRecord], transform: Any, start: int):
        self.records, self.transform, self.start = records, transform, start

    def __len__(self) -> int:
        return len(self.records) - self.start

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor | None, str]:
        row = self.start + i
        try:
            return row, self.transform(load_image(self.records[row].path)), ""
        except ImageError as err:
            return row, None, str(err)


def _unique_images(records: Sequence[ImageRecord]) -> list[ImageRecord]:
    """One record per image id, in id order; the same id with two files is refused."""
    by_id: dict[int, ImageRecord] = {}
    for r in records:
        if r.image_id in by_id and by_id[r.image_id].path != r.path:
            raise ValueError(f"image id {r.image_id} names two files ({by_id[r.image_id].path}, {r.path}); "
                             "image ids must be unique across splits to cache features")
        by_id.setdefault(r.image_id, r)
    return [by_id[i] for i in sorted(by_id)]


def _start(out: Path, fp: dict[str, Any], image_ids: list[int], overwrite: bool) -> int:
    """Prepare the folder; returns the first row still to compute (0 for a new cache)."""
    names = ("meta.json", "index.json", "progress.json", "grids.npy")
    if (out / "meta.json").is_file() and not overwrite:
        meta = check_meta(out, read_cache_json(out / "meta.json"))
        diff = differences(fp, meta["fingerprint"])
        same_images = (out / "index.json").is_file() and check_index(out, read_cache_json(out / "index.json")) == \
            image_ids
        if diff or not same_images:
            why = "; ".join(diff) if diff else "another list of images"
            raise ValueError(f"{out} already holds a feature cache made differently ({why}); choose another "
                             "folder or pass overwrite=true to replace it")
        done = check_progress(out, read_optional(out / "progress.json", {"rows_done": 0}), image_ids)[0]
        if meta.get("grid") and not (out / "grids.npy").is_file():
            done = 0  # grids were written once but the file is gone: start again rather than leave zeros
        if done == 0:
            for name in names[1:]:
                (out / name).unlink(missing_ok=True)
        logger.info("resuming the feature cache %s at image %d of %d", out, done, len(image_ids))
        return done
    if out.is_dir() and any(p.name != LOCK_NAME for p in out.iterdir()) and not overwrite and \
            not (out / "meta.json").is_file():  # the extraction's own lock file is not someone else's file
        raise ValueError(f"{out} exists and is not a feature cache; choose an empty or new folder")
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        (out / name).unlink(missing_ok=True)
    return 0


def _row_shape(encoder: Encoder, transform: Any) -> tuple[int, int] | None:
    """(L, D) of the encoder's grids, found on one blank image, when the transform gives every image one size."""
    sizes = {tuple(transform(Image.new("RGB", wh)).shape) for wh in ((48, 32), (32, 48))}  # (3, H, W) each
    if len(sizes) != 1:
        return None  # no fixed size (e.g. SmallCNN without image_size): known at the first batch
    fmap = encoder(torch.zeros(1, *sizes.pop(), device=next(encoder.parameters()).device))  # (1, D, h, w)
    return fmap.shape[-2] * fmap.shape[-1], fmap.shape[1]


def _create_grids(path: Path, shape: tuple[int, ...]) -> np.memmap:
    """A new grids.npy of `shape` (float16, sparse: space is taken as rows are written), mapped for writing."""
    try:
        return np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=shape)
    except OSError as err:
        raise write_error(path, err) from err


def _collate_rows(items: list[tuple[int, torch.Tensor | None, str]]) -> list[tuple[int, torch.Tensor | None, str]]:
    """Keep a batch as a list: unreadable images (None) are sorted out by the caller."""
    return items


def _as_stored(fmap: torch.Tensor, images: list[ImageRecord]) -> np.ndarray:
    """A batch's grids a (B, L, D) float16, refused before any is stored if one holds NaN or inf, naming the image."""
    with np.errstate(over="ignore"):  # an overflow is refused below, naming the image
        a = fmap.flatten(2).transpose(1, 2).cpu().numpy().astype(np.float16)  # (B, L, D)
    finite = np.isfinite(a).all(axis=(1, 2))  # (B,)
    if finite.all():
        return a
    k = int(np.argmin(finite))
    where = f"image {images[k].image_id} ({images[k].path})"
    if torch.isfinite(fmap[k]).all():
        raise ValueError(f"the encoder's features of {where} exceed float16's range (65504), so this encoder cannot "
                         "be cached as float16; set dataset.features=null to encode images on the fly")
    raise ValueError(f"the encoder gives NaN or inf for {where}, so nothing of its batch was stored; check that "
                     "image and the encoder's weights, then rerun the extraction: it resumes at that batch")


@torch.no_grad()
def extract_features(records: Sequence[ImageRecord], encoder: Encoder, encoder_cfg: Mapping[str, Any],
                     out_dir: str | os.PathLike, batch_size: int = 32, num_workers: int = 0,
                     overwrite: bool = False, progress: bool = True) -> FeatureCache:
    """Encode every image of `records` once with a frozen encoder into a cache at out_dir; resumes an unfinished one.

    The encoder runs in eval mode on the device of its parameters; grids are stored as float16. Unreadable
    images are recorded (reading their features later gives an ImageError, counted like an unreadable image).

    Writes: the JSON files are replaced atomically; grids.npy is a memory map written a batch of rows at a time and
    flushed before progress.json counts those rows. A write of it that fails with an OSError (EIO, ENOSPC from the
    flush) raises one line `cannot write OUT/grids.npy: REASON` with progress.json still at the last flushed batch,
    so the same call again resumes there. Storing into a memory map on a full disk can instead end the process with
    SIGBUS (Linux sends no error code for it); the free-space check before any row is computed refuses a disk
    without room for the rows still to compute, and if the disk fills meanwhile the rows progress.json counts are
    still on the disk, so a rerun resumes all the same.
    """
    check_frozen(encoder)
    encoder.eval()
    out, images = Path(out_dir), _unique_images(records)
    if not images:
        raise ValueError("no images to extract features for")
    image_ids = [r.image_id for r in images]
    fp = fingerprint(encoder, encoder_cfg)
    start = _start(out, fp, image_ids, overwrite)
    # checked_finite: every row this code stores was checked finite (a resumed older cache keeps its meta.json)
    meta: dict[str, Any] = check_meta(out, read_cache_json(out / "meta.json")) if start else {
        "format": CACHE_FORMAT, "fingerprint": fp, "weights": _weights_name(encoder), "dtype": "float16",
        "grid": None, "num_images": len(images), "code_version": __version__, "checked_finite": True}
    grids = None
    if start and (out / "grids.npy").is_file():  # a new cache starts without one (_start removed it)
        check_grids_file(out, meta, len(images))
        grids = np.load(out / "grids.npy", mmap_mode="r+")
    transform = encoder.transform()
    row_shape = tuple(grids.shape[1:]) if grids is not None else _row_shape(encoder, transform)  # (L, D)
    if row_shape is not None:  # before any file is written or image read; only the rows still to compute
        check_free_space(out, len(images) - start, row_shape)
    if not start:
        index = {"image_ids": image_ids, "paths": [str(r.path) for r in images]}
        write_json_atomic(out / "index.json", index, indent=1)
        write_json_atomic(out / "meta.json", meta, indent=1)
    failed = check_progress(out, read_cache_json(out / "progress.json"), image_ids)[1] if start else {}
    state: dict[str, Any] = {"rows_done": start, "failed": failed}
    device = next(encoder.parameters()).device
    loader = DataLoader(_ImageFiles(images, transform, start), batch_size=batch_size,
                        num_workers=num_workers, collate_fn=_collate_rows)
    for batch in tqdm(loader, desc=f"features -> {out}", disable=not progress, initial=-(-start // batch_size),
                      total=(len(images) + batch_size - 1) // batch_size):
        ok = [(row, x) for row, x, _ in batch if x is not None]
        if ok:
            fmap = encoder(torch.stack([x for _, x in ok]).to(device))  # (B, D, h, w)
            a = _as_stored(fmap, [images[row] for row, _ in ok])  # (B, L, D) float16
            if grids is None:
                if row_shape is None:
                    check_free_space(out, len(images) - start, a.shape[1:])
                meta["grid"] = list(fmap.shape[-2:])
                write_json_atomic(out / "meta.json", meta, indent=1)
                grids = _create_grids(out / "grids.npy", (len(images), *a.shape[1:]))
            try:
                grids[[row for row, _ in ok]] = a
                grids.flush()  # rows on disk before the progress marker says so
            except OSError as err:
                raise write_error(out / "grids.npy", err) from err
        state["failed"].update({str(image_ids[row]): err for row, x, err in batch if x is None})
        state["rows_done"] = batch[-1][0] + 1
        write_json_atomic(out / "progress.json", state, indent=1)
    if grids is None:
        example = next(iter(state["failed"].values()))
        raise ValueError(f"none of the {len(images)} images could be read (e.g. {example})")
    if state["failed"]:
        logger.warning("%d images could not be read and have no features (they are skipped and counted): %s",
                       len(state["failed"]), "; ".join(list(state["failed"].values())[:5]))
    logger.info("feature cache %s: %d images, grid %s x %d, float16", out, len(images), meta["grid"], encoder.out_dim)
    return FeatureCache.open(out)  # written with this encoder's fingerprint `fp`: no second hash of its weights


def open_features(path: str | os.PathLike | None, encoder: Encoder,
                  encoder_cfg: Mapping[str, Any]) -> FeatureCache | None:
    """The cache `dataset.features` names, checked against the model's encoder; None when it is not set."""
    return FeatureCache.open(path, encoder, encoder_cfg) if path else None
