"""Region features (bottom-up attention: each image its own set of regions, with their boxes) for `encoder=regions`.

Two sources, each read lazily with O(1) work per image, both a `CachedGrids` with `sets` (the data set pads a
batch's sets and gives their mask, which every attention honours):

* `RegionCache`, this toolkit's format, converted once from the TSV files (captioning/features/regions_tsv.py,
  `captioning-convert-regions`). A folder:
    meta.json      format, dim, dtype, number of images and regions (written last: a cache without it is unfinished)
    index.json     image ids in row order, each image's region count and (height, width)
    features.bin   all regions' features, (regions, dim) float16, image after image (memory-mapped)
    boxes.bin      their boxes, (regions, 4) float32, x0 y0 x1 y1 in the image's pixels
    progress.json  during conversion: what is written so far (the conversion continues from it)
* `RegionFolder`, the per-image files of ruotianluo's conversion: `<folder>/<image id>.npz` with key `feat`
  (regions, dim) (or `<image id>.npy`), and the boxes `<image id>.npy` (regions, 4) in the folder `dataset.boxes`
  names, or else in the sibling folder whose name ends in `_box` instead of `_att` (cocobu_att -> cocobu_box), if it
  exists. Without boxes, one warning says what is not drawn and how to give them.
* `GridFolder`, the same per-image files holding a grid instead of a set: `feat` an (h, w, dim) array, the same
  (h, w) for every image, its rows top to bottom, its cells left to right, covering the whole image. The cells keep
  their layout (the data set gives (h w, dim) grids, as a feature cache does), so every attention that reads the
  grid (local, location, monotonic) works on it, and the maps are drawn over the image as a grid encoder's are.

Every image's features are checked as they are read: a 2-D array of `dim` columns and finite values, else one
ValueError naming the file (a file from someone else is data: SECURITY.md; npz files are read without pickle).
"""

from __future__ import annotations

import logging
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captioning.base.jsonio import is_id
from captioning.data.images import ImageError
from captioning.data.prepared.arrays import SplitView
from captioning.data.readers.records import ImageRecord
from captioning.features.checks import read_cache_json, read_optional, shown

logger = logging.getLogger(__name__)
REGION_FORMAT = "captioning-regions/v1"
HOW_TO_CONVERT = "captioning-convert-regions --tsv FILE [FILE ...] --out PATH"


class RegionError(ValueError):
    """A region source that is not what it should be (one line naming the file and what to do)."""


def check_regions(features: np.ndarray, dim: int, where: str) -> np.ndarray:
    """An image's regions as float32 (L, dim), refused unless 2-D with `dim` columns, at least one row and finite."""
    if features.ndim != 2 or features.shape[1] != dim or features.dtype.kind not in "fiu":
        raise RegionError(f"{where} holds {features.dtype} {'x'.join(map(str, features.shape))}, not regions x {dim} "
                          f"numbers (encoder.dim={dim})")
    out = np.asarray(features, dtype=np.float32)
    if not np.isfinite(out).all():
        raise RegionError(f"{where} holds NaN or inf")
    return out


class RegionCache:
    """A converted region cache: `cache[image_id]` is the image's regions (L_i, dim) float32, `boxes(image_id)` their
    boxes (L_i, 4) and `size(image_id)` the image's (height, width)."""

    sets = True

    def __init__(self, root: Path, meta: dict[str, Any], image_ids: list[int], counts: list[int],
                 sizes: list[tuple[int, int]], failed: dict[str, str] | None = None):
        self.root, self.meta, self.dim, self.failed = root, meta, int(meta["dim"]), failed or {}
        self.row = {i: k for k, i in enumerate(image_ids)}
        self.offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        self.sizes = sizes
        self._maps: tuple[np.ndarray, np.ndarray] | None = None  # mapped lazily: each DataLoader worker maps its own

    @classmethod
    def open(cls, root: str | os.PathLike, dim: int | None = None) -> RegionCache:
        """Open a finished cache, its files checked against each other (sizes, counts); with `dim`, refuse another
        width. The features are checked finite as each image is read."""
        root = Path(root)
        meta = read_optional(root / "meta.json", None)
        if meta is None:
            progress = "; rerun the same command to finish it" if (root / "progress.json").exists() else ""
            raise FileNotFoundError(f"no finished region cache at {root} (meta.json missing){progress}; convert the "
                                    f"TSV files with {HOW_TO_CONVERT}")
        if not isinstance(meta, dict) or meta.get("format") != REGION_FORMAT:
            raise RegionError(f"{root / 'meta.json'} is not a region cache of format {REGION_FORMAT!r}; convert the "
                              f"TSV files again with {HOW_TO_CONVERT}")
        if not (is_id(meta.get("dim")) and meta["dim"] > 0):
            raise RegionError(f"{root / 'meta.json'} gives dim {shown(meta.get('dim'))}, not a positive integer")
        if dim is not None and meta["dim"] != dim:
            raise RegionError(f"the region cache {root} holds {meta['dim']} values per region, but encoder.dim={dim}; "
                              f"set encoder.dim={meta['dim']}")
        index = read_cache_json(root / "index.json")
        ids, counts, sizes = _check_index(root, index)
        failed = index.get("failed") or {}
        if not isinstance(failed, dict) or not all(isinstance(v, str) for v in failed.values()):
            raise RegionError(f"{root / 'index.json'}: failed must map image ids to the reason they were skipped")
        cache = cls(root, meta, ids, counts, sizes, failed)
        for name, width, dtype in (("features.bin", cache.dim, np.float16), ("boxes.bin", 4, np.float32)):
            want = int(cache.offsets[-1]) * width * np.dtype(dtype).itemsize
            have = (root / name).stat().st_size if (root / name).is_file() else None
            if have != want:
                raise RegionError(f"{root / name} is {have} bytes but index.json's {int(cache.offsets[-1])} regions x "
                                  f"{width} values need {want}; convert the TSV files again with {HOW_TO_CONVERT}")
        return cache

    def _mapped(self) -> tuple[np.ndarray, np.ndarray]:
        if self._maps is None:
            total = int(self.offsets[-1])
            self._maps = (np.memmap(self.root / "features.bin", np.float16, "r", shape=(total, self.dim)),
                          np.memmap(self.root / "boxes.bin", np.float32, "r", shape=(total, 4)))
        return self._maps

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": None}  # never pickle the mapped arrays

    def __len__(self) -> int:
        return len(self.row)

    def __contains__(self, image_id: int) -> bool:
        return image_id in self.row or str(image_id) in self.failed

    def _span(self, image_id: int) -> slice:
        k = self.row[image_id]
        return slice(int(self.offsets[k]), int(self.offsets[k + 1]))

    def __getitem__(self, image_id: int) -> torch.Tensor:
        """The image's regions (L_i, dim) float32; an ImageError (a counted skip) for an image the TSV gave no
        usable regions."""
        if str(image_id) in self.failed:
            raise ImageError(f"image {image_id} has no regions in {self.root}: {self.failed[str(image_id)]}")
        span = self._span(image_id)
        where = f"{self.root / 'features.bin'} (image {image_id}, regions {span.start}-{span.stop - 1})"
        return torch.from_numpy(check_regions(np.asarray(self._mapped()[0][span]), self.dim, where))

    def boxes(self, image_id: int) -> np.ndarray:
        """The image's region boxes (L_i, 4): x0, y0, x1, y1 in its pixels."""
        return np.array(self._mapped()[1][self._span(image_id)])

    def size(self, image_id: int) -> tuple[int, int]:
        """The image's (height, width), as the TSV gave it."""
        return self.sizes[self.row[image_id]]

    def require(self, records: Sequence[ImageRecord]) -> None:
        _require(self, records, self.root)


def _check_index(root: Path, index: Any) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """index.json's image ids, region counts and image sizes, each list as long as the ids; else one RegionError."""
    path = root / "index.json"
    ids, counts, sizes = (index.get(k) if isinstance(index, dict) else None for k in ("image_ids", "counts", "sizes"))
    if not (isinstance(ids, list) and isinstance(counts, list) and isinstance(sizes, list)
            and len(ids) == len(counts) == len(sizes) > 0):
        raise RegionError(f"{path} needs the lists image_ids, counts and sizes, of one length; convert again with "
                          f"{HOW_TO_CONVERT}")
    if not all(is_id(i) for i in ids) or len(set(ids)) != len(ids):
        raise RegionError(f"{path}: image_ids must be distinct integers")
    if not all(is_id(n) and n > 0 for n in counts):
        raise RegionError(f"{path}: every region count must be a positive integer")
    if not all(isinstance(s, list) and len(s) == 2 and all(is_id(v) and v > 0 for v in s) for s in sizes):
        raise RegionError(f"{path}: every size must be [height, width], positive integers")
    return ids, counts, [(int(h), int(w)) for h, w in sizes]


class RegionFolder:
    """Per-image region files (ruotianluo's cocobu_att): `folder[image_id]` reads `<id>.npz` (key `feat`) or
    `<id>.npy`; `boxes(image_id)` reads `<id>.npy` of the box folder (`boxes`, or the sibling `_box` folder; None
    without one)."""

    sets = True

    def __init__(self, folder: str | os.PathLike, dim: int, boxes: str | os.PathLike | None = None):
        self.root, self.dim = Path(folder), dim
        if not self.root.is_dir():
            raise FileNotFoundError(f"no region folder at {self.root}")
        if boxes is not None and not Path(boxes).is_dir():
            raise FileNotFoundError(f"dataset.boxes={boxes}: no such folder (the boxes <image id>.npy of the regions)")
        name = self.root.name
        box = Path(boxes) if boxes is not None else self.root.with_name(name[:-4] + "_box") \
            if name.endswith("_att") else None
        self.box_root = box if box is not None and box.is_dir() else None
        if self.box_root is None and self.sets:
            logger.warning("the regions in %s have no boxes (dataset.boxes=FOLDER of <image id>.npy, x0 y0 x1 y1 in "
                           "pixels): figures, the report's maps and attention correctness are skipped", self.root)

    def _file(self, image_id: int) -> Path:
        for suffix in (".npz", ".npy"):
            path = self.root / f"{image_id}{suffix}"
            if path.is_file():
                return path
        raise FileNotFoundError(f"no region file for image {image_id} in {self.root} ({image_id}.npz or .npy)")

    def __getitem__(self, image_id: int) -> torch.Tensor:
        path = self._file(image_id)
        return torch.from_numpy(check_regions(_load(path, "feat"), self.dim, str(path)))

    def boxes(self, image_id: int) -> np.ndarray | None:
        """The image's region boxes (L_i, 4), x0 y0 x1 y1 in its pixels; None without a box folder."""
        if self.box_root is None:
            return None
        path = self.box_root / f"{image_id}.npy"
        boxes = _load(path, "box")
        if boxes.ndim != 2 or boxes.shape[1] != 4 or not np.isfinite(boxes).all():
            raise RegionError(f"{path} holds {boxes.dtype} {'x'.join(map(str, boxes.shape))}, not finite boxes x 4")
        return boxes.astype(np.float32)

    def size(self, image_id: int) -> None:
        """Unknown here: the image file gives it."""
        return None

    def require(self, records: Sequence[ImageRecord]) -> None:
        held = {int(p.stem) for p in self.root.iterdir() if p.suffix in (".npz", ".npy") and p.stem.isdigit()}
        _require(held, records, self.root)


def _require(source: Any, records: Sequence[ImageRecord], where: Path) -> None:
    ids = records.image_ids if isinstance(records, SplitView) else [r.image_id for r in records]
    missing = [i for i in ids if i not in source]
    if missing:
        raise RegionError(f"{len(missing)} of {len(ids)} images have no regions in {where} (e.g. image ids "
                          f"{missing[:5]}); convert or download the features of the splits you use")


def _load(path: Path, key: str) -> np.ndarray:
    """An array from an .npy file or an .npz archive (its `key`, or its only array), without pickle."""
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                names = loaded.files
                if key not in names and len(names) != 1:
                    raise RegionError(f"{path} has no array {key!r} (it holds {names[:5]})")
                return np.asarray(loaded[key if key in names else names[0]])
        return np.asarray(loaded)
    except RegionError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise RegionError(f"{path} is not a readable .npy/.npz file ({str(err).splitlines()[0] if str(err) else err!r})"
                          ) from None


class GridFolder(RegionFolder):
    """Per-image grid files: `folder[image_id]` is `<id>.npz`'s (h, w, dim) array flattened to (h w, dim), rows
    first; every image's (h, w) is the first one's (`grid`). The grid covers the whole image (no boxes needed)."""

    sets = False

    def __init__(self, folder: str | os.PathLike, dim: int, grid: tuple[int, int]):
        super().__init__(folder, dim)
        self.grid = grid

    def __getitem__(self, image_id: int) -> torch.Tensor:
        path = self._file(image_id)
        a = _load(path, "feat")
        if a.ndim != 3 or tuple(a.shape[:2]) != self.grid:
            raise RegionError(f"{path} holds {'x'.join(map(str, a.shape))}, not the {self.grid[0]} x {self.grid[1]} "
                              f"x {self.dim} grid of the folder's other files")
        return torch.from_numpy(check_regions(a.reshape(-1, a.shape[2]), self.dim, str(path)))  # (h w, dim)

    def boxes(self, image_id: int) -> None:
        return None


def open_regions(path: str | os.PathLike, dim: int,
                 boxes: str | os.PathLike | None = None) -> RegionCache | RegionFolder | GridFolder:
    """The source at `path` for encoder=regions of width `dim`: a converted region cache (it has meta.json or
    progress.json), or a folder of per-image files: region sets (2-D arrays; their boxes in `boxes`) or grids
    (3-D arrays, judged by the first file)."""
    root = Path(path)
    if (root / "meta.json").exists() or (root / "progress.json").exists():
        return RegionCache.open(root, dim)
    first = next((p for p in sorted(root.iterdir()) if p.suffix in (".npz", ".npy") and p.stem.isdigit()), None) \
        if root.is_dir() else None
    shape = _load(first, "feat").shape if first is not None else ()
    if len(shape) == 3:
        if shape[0] != shape[1]:
            raise RegionError(f"{first} holds a {shape[0]} x {shape[1]} grid: grid features must be square (h = w)")
        return GridFolder(root, dim, (shape[0], shape[1]))
    return RegionFolder(root, dim, boxes)


def is_region_cache(path: str | os.PathLike) -> bool:
    """Whether `path` holds a region cache (finished or not), as opposed to a grid cache or anything else."""
    meta = Path(path) / "meta.json"
    if meta.is_file():
        try:
            return read_cache_json(meta).get("format") == REGION_FORMAT
        except (ValueError, AttributeError):
            return False
    return (Path(path) / "progress.json").is_file() and (Path(path) / "features.bin").exists()
