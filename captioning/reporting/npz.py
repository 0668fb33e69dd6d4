"""Opening an .npz that may be a stranger's (attention.npz) without letting it ask for more memory than it holds.

An .npz is a zip of .npy files, and each .npy header declares a shape that `np.load` allocates before it reads a
byte: a 2 MB file whose deflated member declares a (20000, 20000, 196) float32 array asks for 292 GiB. `open_npz`
reads every member's header first (a few hundred bytes each, never the data) and refuses, in one line naming the file
and the member, anything but an array of plain numbers whose size the zip confirms, within MAX_BYTES in all.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npy_format

from captioning.base.messages import one_line

# The most memory one file's arrays may ask for: the sum over its members of prod(shape) * max(itemsize, 8), that is
# their size once read and widened to float64 (as the report holds its maps). 2 GiB is generous: the maps of COCO's
# 5000 test images, 20 words each over 14 x 14 cells, take about 150 MB as float64.
MAX_BYTES = 2 * 1024**3
NUMBER_KINDS = "biuf"  # bool, signed and unsigned integers, floats: no objects, strings, records or datetimes


class UnsafeNpzError(ValueError):
    """An .npz refused before loading: not a regular file, not a zip of .npy arrays of plain numbers, or too big."""


@dataclass(frozen=True)
class Member:
    """One array of an .npz as its header declares it."""

    name: str  # the key np.load gives it (the zip member's name without .npy)
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def label(self) -> str:
        """The member as an error message names it: its file name, quoted (repr: no line break can hide in it)."""
        return repr(self.name + ".npy")

    @property
    def loaded_bytes(self) -> int:
        """Its size once read and widened to float64 (what MAX_BYTES counts)."""
        return math.prod(self.shape) * max(self.dtype.itemsize, 8)


def _open_regular(path: Path) -> BinaryIO:
    """The file opened for reading; a FIFO, device or folder is refused (opening a FIFO would wait for a writer)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"file not found: {path}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeNpzError(f"{path} is not a regular file (a FIFO, device or folder); refusing to read it")
    return os.fdopen(fd, "rb")


def _member(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Member:
    """The header of one member, checked against the zip's record of its size."""
    where = f"{path}: member {info.filename!r}"
    if not info.filename.endswith(".npy"):
        raise UnsafeNpzError(f"{where} is not an .npy array; refusing to load the file")
    with archive.open(info) as f:
        version = npy_format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise UnsafeNpzError(f"{where} has .npy format version {version}, not 1.0 or 2.0; refusing to load it")
        read_header = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
        shape, _fortran_order, dtype = read_header(f)
        offset = f.tell()  # where the data starts in the uncompressed member
    if any(n < 0 for n in shape):
        raise UnsafeNpzError(f"{where} declares the shape {shape}; refusing to load the file")
    if dtype.hasobject or dtype.kind not in NUMBER_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise UnsafeNpzError(f"{where} holds {dtype}, not plain numbers; refusing to load the file")
    expected = offset + math.prod(shape) * dtype.itemsize
    if info.file_size != expected:
        raise UnsafeNpzError(f"{where} declares a {shape} {dtype} array ({expected} bytes with its header) but the "
                             f"zip says it holds {info.file_size} bytes; refusing to load the file")
    return Member(info.filename[: -len(".npy")], tuple(shape), dtype)


def check_npz(path: str | os.PathLike, file: BinaryIO, max_bytes: int = MAX_BYTES,
              what: str = "an .npz file of .npy arrays") -> dict[str, Member]:
    """The members of the open .npz `file` (read from `path`: `what` it should be), each header checked (see the
    module docstring)."""
    path = Path(path)
    try:
        with zipfile.ZipFile(file) as archive:
            members = [_member(path, archive, info) for info in archive.infolist()]
    except UnsafeNpzError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError, NotImplementedError,
            ValueError, SyntaxError) as err:  # not a zip, encrypted, an unknown compression, a broken .npy header
        raise UnsafeNpzError(f"{path} is not {what}: {one_line(err)}") from err
    total = 0
    for m in members:
        total += m.loaded_bytes
        if total > max_bytes:
            raise UnsafeNpzError(f"{path}: member {m.label} declares a {m.shape} {m.dtype} array; the file's "
                                 f"arrays would take {total / 1024**3:.2f} GiB or more as float64, over the "
                                 f"{max_bytes / 1024**3:.2f} GiB limit; refusing to load it")
    return {m.name: m for m in members}


@contextlib.contextmanager
def open_npz(path: str | os.PathLike, max_bytes: int = MAX_BYTES, what: str = "an .npz file of .npy arrays"
             ) -> Iterator[tuple[np.lib.npyio.NpzFile, dict[str, Member]]]:
    """np.load of an .npz (pickles off) once check_npz has passed its headers, with those headers, for a `with`
    block. UnsafeNpzError (a ValueError) when refused, FileNotFoundError when missing."""
    with _open_regular(Path(path)) as file:
        members = check_npz(path, file, max_bytes, what)
        file.seek(0)
        with np.load(file, allow_pickle=False) as npz:
            yield npz, members
