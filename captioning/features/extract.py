"""Writing a feature cache: every image of some records encoded once by a frozen encoder, stored as float16 grids.

`extract_features` writes a cache (cache.py describes its files) and continues an interrupted one where it stopped
(or one stopped by a failed write); it never stores a grid holding NaN or inf.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from captioning import __version__
from captioning.base.files import write_error
from captioning.base.jsonio import write_json_atomic
from captioning.base.lock import LOCK_NAME
from captioning.data.images import ImageError, load_image
from captioning.data.readers.records import ImageRecord
from captioning.features.cache import FeatureCache
from captioning.features.checks import (
    CACHE_FORMAT,
    check_grids_file,
    check_index,
    check_meta,
    check_progress,
    differences,
    read_cache_json,
    read_optional,
)
from captioning.features.disk import check_free_space
from captioning.features.fingerprint import check_frozen, fingerprint, weights_name
from captioning.models.encoder import Encoder

logger = logging.getLogger(__name__)


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
        if done < len(image_ids):
            logger.info("resuming the feature cache %s at image %d of %d", out, done, len(image_ids))
        else:
            logger.info("the feature cache %s holds all %d images", out, done)
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


def _begin(out: Path, fp: dict[str, Any], encoder: Encoder, transform: Any, images: list[ImageRecord],
           overwrite: bool) -> tuple[int, dict[str, Any], np.memmap | None, tuple[int, ...] | None]:
    """Start a new cache or continue one: (first row to compute, meta.json's content, the grids written so far or
    None, the row shape (L, D) when known before the first batch). Space for the rows still to compute is checked
    before any file is written or image read."""
    start = _start(out, fp, [r.image_id for r in images], overwrite)
    # checked_finite: every row this code stores was checked finite (a resumed older cache keeps its meta.json)
    meta: dict[str, Any] = check_meta(out, read_cache_json(out / "meta.json")) if start else {
        "format": CACHE_FORMAT, "fingerprint": fp, "weights": weights_name(encoder), "dtype": "float16",
        "grid": None, "num_images": len(images), "code_version": __version__, "checked_finite": True}
    grids = None
    if start and (out / "grids.npy").is_file():  # a new cache starts without one (_start removed it)
        check_grids_file(out, meta, len(images))
        grids = np.load(out / "grids.npy", mmap_mode="r+")
    row_shape = tuple(grids.shape[1:]) if grids is not None else _row_shape(encoder, transform)  # (L, D)
    if row_shape is not None:  # before any file is written or image read; only the rows still to compute
        check_free_space(out, len(images) - start, row_shape)
    if not start:
        index = {"image_ids": [r.image_id for r in images], "paths": [str(r.path) for r in images]}
        write_json_atomic(out / "index.json", index, indent=1)
        write_json_atomic(out / "meta.json", meta, indent=1)
    return start, meta, grids, row_shape


def _store_batch(out: Path, fmap: torch.Tensor, rows: list[int], images: list[ImageRecord], grids: np.memmap | None,
                 check_space: bool, start: int, meta: dict[str, Any]) -> np.memmap:
    """Store a batch's encoded grids fmap (B, D, h, w) at their rows, flushed; the first batch of a new cache
    creates grids.npy (after the free-space check when the row shape was unknown before, `check_space`) and
    records the grid in meta.json. Returns the grids."""
    a = _as_stored(fmap, [images[row] for row in rows])  # (B, L, D) float16
    if grids is None:
        if check_space:
            check_free_space(out, len(images) - start, a.shape[1:])
        meta["grid"] = list(fmap.shape[-2:])
        write_json_atomic(out / "meta.json", meta, indent=1)
        grids = _create_grids(out / "grids.npy", (len(images), *a.shape[1:]))
    try:
        grids[rows] = a
        grids.flush()  # rows on disk before the progress marker says so
    except OSError as err:
        raise write_error(out / "grids.npy", err) from err
    return grids


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
    transform = encoder.transform()
    start, meta, grids, row_shape = _begin(out, fingerprint(encoder, encoder_cfg), encoder, transform, images,
                                           overwrite)
    failed = check_progress(out, read_cache_json(out / "progress.json"), image_ids)[1] if start else {}
    state: dict[str, Any] = {"rows_done": start, "failed": failed}
    device = next(encoder.parameters()).device
    loader = DataLoader(_ImageFiles(images, transform, start), batch_size=batch_size,
                        num_workers=num_workers, collate_fn=_collate_rows)
    for batch in tqdm(loader, desc=f"features -> {out}", disable=not progress, initial=-(-start // batch_size),
                      total=(len(images) + batch_size - 1) // batch_size):
        ok = [(row, x) for row, x, _ in batch if x is not None]
        if ok:
            grids = _store_batch(out, encoder(torch.stack([x for _, x in ok]).to(device)), [row for row, _ in ok],
                                 images, grids, row_shape is None, start, meta)
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
