"""Convert bottom-up attention TSV files (peteanderson80/bottom-up-attention) into a region cache, once.

Each TSV line is one image: `image_id, image_w, image_h, num_boxes, boxes, features`, tab-separated, the last two
base64 of float32 arrays (num_boxes x 4 and num_boxes x D). The cache (captioning/features/regions.py) keeps the
features as float16 and the boxes as float32, image after image, so any image is read in O(1) by its offset.

The conversion shows a progress bar over the files' bytes, checks the free space first (the cache takes about 3/8 of
the TSV's size: float16 instead of base64 float32), and writes progress.json every `flush_every` images; started
again with the same files and folder it continues after the last images written (whatever was appended after them
is cut off first). meta.json is written last: until then `RegionCache.open` calls the cache unfinished. A malformed
line (wrong field count, bad base64, sizes that do not match) stops the conversion with one line naming the file and
line; an image without regions, or whose numbers are not finite, is a counted skip (index.json's `failed`).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from tqdm import tqdm

from captioning.base.files import write_text_atomic
from captioning.features.checks import read_optional
from captioning.features.disk import MARGIN_BYTES, NotEnoughSpaceError, free_bytes, gigabytes
from captioning.features.regions import REGION_FORMAT, RegionError

FIELDS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
CACHE_SHARE = 3 / 8  # bytes of cache per byte of TSV: 2 bytes of float16 where base64 float32 takes 16 / 3


@dataclass
class Progress:
    """What a conversion has written: the images in order, their region counts and sizes, the skipped ones."""

    sources: list[str]
    rows_done: int = 0
    dim: int | None = None
    image_ids: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    sizes: list[list[int]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def regions(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class Row:
    image_id: int
    size: tuple[int, int]  # (height, width)
    boxes: np.ndarray  # (n, 4) float32
    features: np.ndarray  # (n, D) float32


def _floats(text: str, where: str, name: str) -> np.ndarray:
    try:
        return np.frombuffer(base64.b64decode(text, validate=True), dtype=np.float32)
    except (binascii.Error, ValueError) as err:
        raise RegionError(f"{where}: field {name!r} is not base64 of float32 numbers ({err})") from None


def parse_line(line: bytes, where: str) -> Row:
    """One TSV line as a Row; a RegionError naming `where` (file:line) for anything malformed."""
    fields = line.rstrip(b"\r\n").split(b"\t")
    if len(fields) != len(FIELDS):
        raise RegionError(f"{where}: {len(fields)} tab-separated fields, not the {len(FIELDS)} of the bottom-up TSV "
                          f"({', '.join(FIELDS)})")
    try:
        image_id, width, height, count = (int(f) for f in fields[:4])
    except ValueError:
        raise RegionError(f"{where}: image_id, image_w, image_h and num_boxes must be integers") from None
    if width <= 0 or height <= 0 or count < 0:
        raise RegionError(f"{where}: image {image_id} has size {width}x{height} and {count} boxes")
    boxes = _floats(fields[4].decode("ascii", "replace"), where, "boxes")
    features = _floats(fields[5].decode("ascii", "replace"), where, "features")
    if boxes.size != 4 * count or (count and features.size % count) or (not count and features.size):
        raise RegionError(f"{where}: image {image_id} gives {count} boxes but {boxes.size} box values and "
                          f"{features.size} feature values")
    dim = features.size // count if count else 0
    return Row(image_id, (height, width), boxes.reshape(count, 4), features.reshape(count, dim))


def _lines(paths: Sequence[Path], skip: int, bar: tqdm) -> Iterator[tuple[bytes, str]]:
    """Every line of the files in order after the first `skip`, with its file:line; the bar advances by bytes."""
    seen = 0
    for path in paths:
        with open(path, "rb") as f:
            for number, line in enumerate(f, 1):
                bar.update(len(line))
                if seen >= skip and line.strip():
                    yield line, f"{path}:{number}"
                seen += bool(line.strip())


def _save(out: Path, progress: Progress) -> None:
    write_text_atomic(out / "progress.json", json.dumps(progress.__dict__))


def _resume(out: Path, sources: list[str]) -> Progress:
    """The progress of an earlier conversion into `out` from the same files, or a fresh one."""
    saved = read_optional(out / "progress.json", None)
    if saved is None:
        return Progress(sources)
    before = saved.get("sources") if isinstance(saved, dict) else saved
    if before != sources:
        raise RegionError(f"{out} holds a conversion of other files ({str(before)[:200]}); give the same --tsv files "
                          "to continue it, or another --out folder")
    try:
        return Progress(**saved)
    except TypeError as err:
        raise RegionError(f"{out / 'progress.json'} is not a conversion's progress ({err}); delete the folder"
                          ) from None


def _cut(path: Path, size: int) -> None:
    """Cut `path` back to `size` bytes (what progress.json accounts for), creating it if missing."""
    with open(path, "ab") as f:
        f.truncate(size)


def check_space(out: Path, paths: Sequence[Path], progress: Progress) -> int:
    """Refuse (NotEnoughSpaceError) unless the cache's remaining bytes fit on `out`'s file system; returns them."""
    total = sum(p.stat().st_size for p in paths)
    written = progress.regions * ((progress.dim or 0) * 2 + 16)
    need = max(0, int(total * CACHE_SHARE) - written) + MARGIN_BYTES
    free = free_bytes(out)
    if need > free:
        raise NotEnoughSpaceError(f"not enough free space for the region cache at {out}: the {gigabytes(total)} of TSV "
                                  f"need about {gigabytes(need)} more (3/8 of their size), but only {gigabytes(free)} "
                                  "are free there; choose --out on a larger disk")
    return need


def convert_tsv(tsv: Sequence[str | os.PathLike], out: str | os.PathLike, progress_bar: bool = True,
                flush_every: int = 1000) -> dict[str, Any]:
    """Convert the TSV files (in order) into a region cache at `out`, or continue an interrupted conversion there;
    returns meta.json's content (images, regions, dim, skipped images)."""
    paths, root = [Path(p) for p in tsv], Path(out)
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"no TSV file at {path}")
    if (root / "meta.json").exists():
        raise RegionError(f"{root} already holds a finished region cache; delete it to convert again")
    root.mkdir(parents=True, exist_ok=True)
    state = _resume(root, [str(p.absolute()) for p in paths])
    check_space(root, paths, state)
    _cut(root / "features.bin", state.regions * (state.dim or 0) * 2)
    _cut(root / "boxes.bin", state.regions * 16)
    seen = set(state.image_ids) | {int(i) for i in state.failed}
    total = sum(p.stat().st_size for p in paths)
    with tqdm(total=total, unit="B", unit_scale=True, disable=not progress_bar, desc="regions") as bar, \
            open(root / "features.bin", "ab") as feats, open(root / "boxes.bin", "ab") as boxes:
        for line, where in _lines(paths, state.rows_done, bar):
            _add(parse_line(line, where), where, state, seen, feats, boxes)
            if state.rows_done % flush_every == 0:
                _flush(root, state, feats, boxes)
        _flush(root, state, feats, boxes)
    if not state.image_ids:
        raise RegionError(f"the TSV files gave no image with regions ({len(state.failed)} skipped)")
    index = {"image_ids": state.image_ids, "counts": state.counts, "sizes": state.sizes, "failed": state.failed}
    write_text_atomic(root / "index.json", json.dumps(index))
    meta = {"format": REGION_FORMAT, "dim": state.dim, "dtype": "float16", "images": len(state.image_ids),
            "regions": state.regions, "skipped": len(state.failed), "sources": state.sources}
    write_text_atomic(root / "meta.json", json.dumps(meta, indent=1))
    (root / "progress.json").unlink()
    return meta


def _add(row: Row, where: str, state: Progress, seen: set[int], feats: BinaryIO, boxes: BinaryIO) -> None:
    """Append one image (or count it as skipped) and advance the progress."""
    if row.image_id in seen:
        raise RegionError(f"{where}: image {row.image_id} appears a second time")
    seen.add(row.image_id)
    state.rows_done += 1
    if not len(row.features):
        state.failed[str(row.image_id)] = "the TSV gives it no regions"
        return
    if not (np.isfinite(row.features).all() and np.isfinite(row.boxes).all()):
        state.failed[str(row.image_id)] = "its features or boxes in the TSV hold NaN or inf"
        return
    if state.dim is None:
        state.dim = row.features.shape[1]
    elif row.features.shape[1] != state.dim:
        raise RegionError(f"{where}: image {row.image_id} has {row.features.shape[1]} values per region, the images "
                          f"before it {state.dim}")
    half = row.features.astype(np.float16)
    if not np.isfinite(half).all():
        state.failed[str(row.image_id)] = "its features exceed float16's range (65504)"
        return
    feats.write(half.tobytes())
    boxes.write(np.ascontiguousarray(row.boxes, dtype=np.float32).tobytes())
    state.image_ids.append(row.image_id)
    state.counts.append(len(row.features))
    state.sizes.append(list(row.size))


def _flush(root: Path, state: Progress, *files: BinaryIO) -> None:
    """Force the appended bytes to disk, then record them (a crash between the two leaves extra bytes, cut later)."""
    for f in files:
        f.flush()
        os.fsync(f.fileno())
    _save(root, state)
