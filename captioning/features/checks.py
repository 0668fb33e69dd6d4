"""What a feature cache's files must hold before anything trusts them (a cache from someone else is data:
SECURITY.md): meta.json, index.json and progress.json are regular files of the expected JSON types and values,
grids.npy is what they describe, and its numbers are finite. Anything else is one line, a ValueError (or a
FileNotFoundError for a missing file) naming the file and what is wrong, ending with what to do.

A JSON file is checked to be a regular file before it is opened (a FIFO would block the reader forever).
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn, cast

import numpy as np

from captioning.base.jsonio import is_id, load_json
from captioning.features.npy import require_layout

CACHE_FORMAT = "captioning-features/v1"
HOW_TO_EXTRACT = "captioning-extract-features <the same overrides> dataset.features=PATH"
REDO = f"delete the cache folder and extract it again with {HOW_TO_EXTRACT}"
# Rows of grids.npy whose finiteness FeatureCache.open checks: a fixed number spread over the file, so opening costs
# the same for any N (32 COCO rows of 196 x 512 float16: 6.4 MB read, 10 ms from the page cache on one CPU core);
# every row is checked again when it is read.
SAMPLE_ROWS = 32


def shown(value: Any, width: int = 60) -> str:
    """repr(value) for a one-line message, cut to `width` characters (a stranger's value may be huge)."""
    text = repr(value)
    return text if len(text) <= width else f"{text[:width - 3]}..."


def differences(expected: Mapping[str, Any], found: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Keys whose values differ between two (nested) fingerprints, as 'key: cache X, model Y'."""
    out = []
    for k in sorted(set(expected) | set(found)):
        a, b = found.get(k), expected.get(k)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += differences(b, a, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: cache {short(a)}, now {short(b)}")
    return out


def short(value: Any) -> str:
    """A value for a fingerprint difference; hashes and transform listings are cut."""
    return f"{value[:12]}..." if isinstance(value, str) and len(value) > 40 else shown(value)


def _refuse(path: Path, what: str) -> NoReturn:
    raise ValueError(f"feature cache file {path} {what}; {REDO}")


def read_cache_json(path: Path) -> Any:
    """Parse one of a cache's JSON files: a missing file is a FileNotFoundError, one that is not a regular file
    (a FIFO, a directory), unreadable, not UTF-8 or not JSON a ValueError; each one line naming the file."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"feature cache file {path} is missing; {REDO}") from None
    except OSError as err:
        _refuse(path, f"is unreadable ({err.strerror or err})")
    if not stat.S_ISREG(mode):
        _refuse(path, f"is not a regular file (a {'directory' if stat.S_ISDIR(mode) else 'FIFO, socket or device'})")
    try:
        return load_json(path)
    except (OSError, ValueError, RecursionError) as err:  # RecursionError: JSON nested thousands deep
        _refuse(path, f"is unreadable ({str(err).splitlines()[0] if str(err) else type(err).__name__})")


def read_optional(path: Path, default: Any) -> Any:
    """read_cache_json, or `default` when nothing is at `path` (anything there, even a FIFO, is read and checked)."""
    return read_cache_json(path) if path.exists() or path.is_symlink() else default


def _positive_ints(value: Any, count: int) -> bool:
    return isinstance(value, list) and len(value) == count and all(is_id(n) and n > 0 for n in value)


def check_meta(root: Path, meta: Any) -> dict[str, Any]:
    """meta.json's content, refused unless it is an object of this format with a fingerprint whose "dim" is a
    positive integer, a "grid" that is null (nothing written yet) or [h, w] positive integers, and a float "dtype"."""
    path = root / "meta.json"
    if not isinstance(meta, dict):
        _refuse(path, f"holds {type(meta).__name__} {shown(meta, 30)}, not a JSON object")
    if meta.get("format") != CACHE_FORMAT:
        raise ValueError(f"{root} holds features in format {shown(meta.get('format'))}, not {CACHE_FORMAT!r}: "
                         f"extract them again with {HOW_TO_EXTRACT}")
    fp = meta.get("fingerprint")
    if not isinstance(fp, dict):
        _refuse(path, f'has no "fingerprint" object (found {shown(fp)}): nothing says what made the features')
    if not _positive_ints([fp.get("dim")], 1):
        _refuse(path, f'gives "fingerprint.dim" {shown(fp.get("dim"))}, not a positive integer')
    if meta.get("grid") is not None and not _positive_ints(meta["grid"], 2):
        _refuse(path, f'gives "grid" {shown(meta["grid"])}, not two positive integers [h, w]')
    dtype = meta.get("dtype")
    try:
        ok = isinstance(dtype, str) and np.dtype(dtype).kind == "f"
    except (TypeError, ValueError):
        ok = False
    if not ok:
        _refuse(path, f'gives "dtype" {shown(dtype)}, not the name of a float type such as "float16"')
    return meta


def check_index(root: Path, index: Any) -> list[int]:
    """index.json's image ids, refused unless "image_ids" is a non-empty list of distinct integer ids."""
    path = root / "index.json"
    if not isinstance(index, dict):
        _refuse(path, f"holds {type(index).__name__} {shown(index, 30)}, not a JSON object")
    ids = index.get("image_ids")
    if not isinstance(ids, list) or not ids:
        _refuse(path, f'gives "image_ids" {shown(ids)}, not a non-empty list of integer image ids')
    first: dict[int, int] = {}
    for k, i in enumerate(ids):
        if not is_id(i):
            _refuse(path, f'gives {shown(i)} as "image_ids"[{k}], not an integer image id')
        if first.setdefault(i, k) != k:
            _refuse(path, f'names image {i} twice in "image_ids" (entries {first[i]} and {k})')
    return ids


def check_progress(root: Path, progress: Any, image_ids: list[int]) -> tuple[int, dict[str, str]]:
    """progress.json's rows written and unreadable images, refused unless "rows_done" is an integer from 0 to the
    number of images and "failed" (if given) maps image ids of index.json to the reason they could not be read."""
    path = root / "progress.json"
    if not isinstance(progress, dict):
        _refuse(path, f"holds {type(progress).__name__} {shown(progress, 30)}, not a JSON object")
    rows = progress.get("rows_done")
    if not (is_id(rows) and 0 <= cast(int, rows) <= len(image_ids)):
        _refuse(path, f'gives "rows_done" {shown(rows)}, not an integer from 0 to {len(image_ids)} (the images of '
                "index.json)")
    failed = progress.get("failed", {})
    if not isinstance(failed, dict) or not all(isinstance(v, str) for v in failed.values()):
        _refuse(path, f'gives "failed" {shown(failed)}, not an object of image id -> why it could not be read')
    listed = {str(i) for i in image_ids} if failed else set()
    if (stray := next((k for k in failed if k not in listed), None)) is not None:
        _refuse(path, f'gives a reason in "failed" for image {shown(stray)}, which index.json does not list')
    return cast(int, rows), failed


def check_grids_file(root: Path, meta: dict[str, Any], num_images: int) -> None:
    """grids.npy must be what (checked) meta.json and index.json describe, read from its header before it is mapped:
    a regular file of (images, h x w, D) numbers of meta's dtype, exactly as long as that; else one ValueError."""
    if meta["grid"] is None:
        _refuse(root / "meta.json", "gives no grid, yet grids.npy exists")
    (h, w), dim = meta["grid"], meta["fingerprint"]["dim"]
    require_layout(root / "grids.npy", (num_images, h * w, dim), meta["dtype"], "meta.json and index.json",
                   f"extract the cache again with {HOW_TO_EXTRACT}")


def not_finite(root: Path, row: int, image_id: int) -> ValueError:
    """The refusal of a grid row holding NaN or inf (training on it, or scoring it, would give garbage numbers)."""
    return ValueError(f"{root / 'grids.npy'} row {row} (image {image_id}) holds NaN or inf, so the cache is damaged "
                      f"or was not made by this code; {REDO}")


def check_sample(root: Path, grids: np.ndarray, image_ids: list[int], rows: int = SAMPLE_ROWS) -> None:
    """Refuse grids (N, L, D) if any of `rows` rows spread evenly over them (first and last included) is not
    finite: a cost independent of N (see SAMPLE_ROWS); the rows left out are checked as they are read."""
    picks = np.unique(np.linspace(0, len(grids) - 1, num=min(rows, len(grids))).round().astype(int))
    finite = np.isfinite(grids[picks]).all(axis=(1, 2))  # (rows,)
    if not finite.all():
        row = int(picks[np.argmin(finite)])
        raise not_finite(root, row, image_ids[row])
