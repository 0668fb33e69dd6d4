"""What a `.npy` file holds, read from its header alone: shape, dtype and where the data starts, checked against
the file's size before anything maps or reads the array (a file from someone else is data: SECURITY.md)."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

import numpy as np


def npy_layout(path: str | os.PathLike) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, data offset) of a C-ordered .npy file; ValueError naming the file if it is not a regular file,
    has no valid header, holds objects, is Fortran-ordered or is not exactly the size its header gives."""
    path = Path(path)
    try:
        info = path.stat()
    except OSError as err:
        raise FileNotFoundError(f"cannot read {path}: {err.strerror or err}") from None
    if not stat.S_ISREG(info.st_mode):  # a FIFO or device would block or stream forever
        raise ValueError(f"{path} is not a regular file")
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(f)
            offset = f.tell()
    except (ValueError, OSError, SyntaxError) as err:
        raise ValueError(f"{path} is not a readable .npy file ({err})") from None
    if dtype.hasobject or fortran:
        raise ValueError(f"{path} holds {'objects' if dtype.hasobject else 'a Fortran-ordered array'}, "
                         "not plain numbers")
    expected = offset + math.prod(shape) * dtype.itemsize
    if info.st_size != expected:
        raise ValueError(f"{path} is {info.st_size} bytes but its header describes {expected} "
                         f"({'x'.join(map(str, shape))} {dtype}); it is truncated or not what it says")
    return tuple(int(n) for n in shape), dtype, offset


def require_layout(path: Path, shape: tuple[int, ...], dtype: object, source: str, advice: str) -> None:
    """Refuse (one ValueError, ending in `advice`) a .npy file that is not a regular file of exactly `shape` and
    `dtype`, as `source` (e.g. "meta.json and index.json") describes it."""
    try:
        want = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError:
        raise ValueError(f"{path}: {source} name an unknown dtype {dtype!r}; {advice}") from None
    have, have_dtype, _ = npy_layout(path)
    if have != shape or have_dtype != want:
        raise ValueError(f"{path} holds {'x'.join(map(str, have))} {have_dtype} but {source} describe "
                         f"{'x'.join(map(str, shape))} {want}; {advice}")
