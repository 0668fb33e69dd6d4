"""Disk space for feature caches: how big a cache is, and a refusal before extraction when it will not fit.

grids.npy is created as a sparse file of its full size, so the space is consumed only as rows are written:
what must be free is the rows still to compute, not the file's apparent size.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

# index.json and progress.json (the latter rewritten through a temporary copy, naming unreadable images).
MARGIN_BYTES, MARGIN_PER_ROW = 1_000_000, 512


class NotEnoughSpaceError(OSError):
    """The file system holding a feature cache has too little free space for it."""


def cache_bytes(num_images: int, grid: tuple[int, int], dim: int, itemsize: int = 2) -> int:
    """Size of grids.npy for num_images annotation grids of grid (h, w) x dim values of itemsize bytes."""
    return num_images * grid[0] * grid[1] * dim * itemsize


def free_bytes(path: str | os.PathLike) -> int:
    """Free bytes on the file system holding path (or its nearest existing parent folder)."""
    path = Path(path)
    existing = next((p for p in (path, *path.absolute().parents) if p.exists()), Path("/"))
    return shutil.disk_usage(existing).free


def gigabytes(n: int) -> str:
    """A byte count in GB (10^9), with enough decimals that a small figure is not shown as 0.00."""
    gb = n / 1e9
    digits = 2 if gb == 0 or gb >= 0.1 else 1 - math.floor(math.log10(gb))
    return f"{gb:.{digits}f} GB"


def check_free_space(folder: str | os.PathLike, rows: int, row_shape: tuple[int, ...], itemsize: int = 2) -> int:
    """Refuse (NotEnoughSpaceError) unless folder's file system can take `rows` more rows; returns bytes needed."""
    need = rows * math.prod(row_shape) * itemsize + MARGIN_BYTES + MARGIN_PER_ROW * rows
    free = free_bytes(folder)
    if need > free:
        values = " x ".join(str(n) for n in (rows, *row_shape))
        raise NotEnoughSpaceError(
            f"not enough free space for the feature cache at {folder}: the {rows} images still to extract need "
            f"{gigabytes(need)} ({values} values x {itemsize} bytes, plus the index files), but only "
            f"{gigabytes(free)} are free there. Free some space, choose a folder on a larger disk with "
            "dataset.features=PATH, or cache a smaller grid (encoder.grid_size=7 for a ResNet; "
            "encoder.image_size=112 for a VGG gives 7 x 7)")
    return need
