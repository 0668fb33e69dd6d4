"""The one way the project writes a file: into a temporary file beside it, flushed and fsync'ed, then renamed over it.

A write that fails (no space left, an I/O error, a folder made read-only mid-run) leaves the previous version of
the file exactly as it was and no temporary file behind, and raises a `WriteError`: an OSError whose message is one
line naming the file, `cannot write /x/checkpoints/last.pt: No space left on device`, and whose `errno` is the
cause's (`err.errno == errno.ENOSPC`). A kill (SIGKILL, power loss) between the write and the rename leaves at most
a hidden `.NAME.XXXX.tmp` beside the file; the file itself is never half-written.

Appending (a JSON Lines log) cannot be atomic by rename: `append_bytes` cuts a failed append back off instead.
Standard library only: every floor may import it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

__all__ = ["WriteError", "write_error", "atomic_file", "write_bytes_atomic", "write_text_atomic", "append_bytes",
           "open_no_follow", "open_append", "NoFollowFileHandler", "TMP_SUFFIX"]

TMP_SUFFIX = ".tmp"  # run_folder.py removes stale `*.tmp` files of a killed run's checkpoint writes


class WriteError(OSError):
    """A file that could not be written: `errno` and `strerror` are the cause's, `filename` the file's."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


def write_error(path: str | os.PathLike, err: BaseException) -> WriteError:
    """The one-line WriteError of `path` for the error `err` that stopped its write (kept as it is if one already)."""
    if isinstance(err, WriteError):
        return err
    reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
    return WriteError(getattr(err, "errno", None), " ".join(str(reason).split()), os.fspath(path))


class _Tracked:
    """The temporary file, remembering the first OSError of a write: some serializers report it as an error of their
    own (torch.save: a RuntimeError from its zip writer), and the caller is still told the file and the cause."""

    def __init__(self, file: BinaryIO):
        self._file = file
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self._file.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def flush(self) -> None:
        try:
            self._file.flush()
        except OSError as err:
            self.error = self.error or err
            raise

    def __getattr__(self, name: str) -> Any:  # tell, seek, fileno...: the file's own
        return getattr(self._file, name)


@functools.cache
def _umask() -> int:
    """The process's umask (read without changing it where Linux shows it, so no other thread sees a 0 umask)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _mode(path: Path) -> int:
    """The permissions a plain open() would leave: the old file's, or 0o666 less the umask for a new one."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _temporary(path: Path) -> tuple[BinaryIO, Path]:
    """A new, empty temporary file beside `path` (`.NAME.XXXX.tmp`, only this process's), open for writing."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        return open(fd, "wb"), Path(name)
    except BaseException:
        os.close(fd)
        os.unlink(name)
        raise


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, *, fsync: bool = True) -> Iterator[BinaryIO]:
    """A binary file to write `path`'s new content into; it replaces `path` when the block ends without an error.

    The content goes to a temporary file in the same folder (`.NAME.XXXX.tmp`), flushed and (with `fsync`) forced to
    the disk, then renamed over `path` (a symlink there is replaced, not followed). Any error in the block or in the
    write removes the temporary file and leaves `path` as it was; an OSError (one the block raises is taken as a
    failed write too) becomes a one-line WriteError naming `path`. `fsync=False` skips forcing the content to the
    disk (still atomic against a killed process): for many small files that can be made again, the shapes images.
    """
    path = Path(path)
    try:
        f, tmp = _temporary(path)
    except OSError as err:
        raise write_error(path, err) from err
    tracked = _Tracked(f)
    try:
        with f:
            yield cast(BinaryIO, tracked)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
            if hasattr(os, "fchmod"):  # Windows before Python 3.13 has none (and no POSIX permissions to keep)
                os.fchmod(f.fileno(), _mode(path))
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        cause = tracked.error if tracked.error is not None and isinstance(err, Exception) else err  # Ctrl-C stays
        if isinstance(cause, OSError):
            raise write_error(path, cause) from err
        raise


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, fsync: bool = True) -> Path:
    """Replace `path` with `data` atomically (see atomic_file); returns the path."""
    with atomic_file(path, fsync=fsync) as f:
        f.write(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Replace `path` with `text` atomically (see atomic_file); returns the path."""
    return write_bytes_atomic(path, text.encode(encoding))


def open_no_follow(path: str | os.PathLike, flags: int) -> int:
    """os.open(path, flags | O_CREAT) that never opens through a symlink: a symlink found at `path` is replaced by a
    new, empty file (as atomic_file replaces one), its target left untouched. Binary (no newline translation on
    Windows); where there is no O_NOFOLLOW (Windows), a symlink is looked for before the file is opened."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    flags |= os.O_CREAT | nofollow | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    if not nofollow and os.path.islink(path):
        os.unlink(path)
    try:
        return os.open(path, flags, 0o666)
    except OSError:
        if not os.path.islink(path):
            raise
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a symlink planted where the file goes
    return os.open(path, flags, 0o666)


def open_append(path: str | os.PathLike) -> int:
    """A file descriptor appending to `path` (created if missing; a symlink there is replaced: open_no_follow)."""
    return open_no_follow(path, os.O_WRONLY | os.O_APPEND)


def append_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Append `data` to `path` (created if missing; a symlink there is replaced, see open_append) and force it to the
    disk; a failed append is cut back off (the file keeps its earlier content, no part of `data`) and raises the
    one-line WriteError naming `path`."""
    try:
        fd = open_append(path)
    except OSError as err:
        raise write_error(path, err) from err
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException as err:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            if isinstance(err, OSError):
                raise write_error(path, err) from err
            raise
    finally:
        os.close(fd)


class NoFollowFileHandler(logging.FileHandler):
    """logging's FileHandler whose file is opened by open_append: a symlink planted at a run's `<job>.log` is
    replaced, never appended through (conf/*.yaml set it as Hydra's job log handler)."""

    def _open(self) -> Any:  # logging's own hook (a text stream)
        return open(open_append(self.baseFilename), "a", encoding=self.encoding, errors=self.errors)
