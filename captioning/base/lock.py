"""One writer per output folder: an OS lock on `<folder>/.lock`, held for the life of the work that writes there.

A run of captioning-train (its run folder), captioning-evaluate (its output folder) and captioning-extract-features
(the feature cache folder) each hold an OS lock on the folder's `.lock` file, its PID written inside. The OS
drops the lock when the process ends, however it ends (kill -9 included), so a dead run never blocks the next one;
a second launch into a folder in use is refused at once, naming the holder's PID, instead of two processes
interleaving their files (metrics from one, report.html from the other). Work that any number of processes may
ask for and only one should do (generating a synthetic data set, preparing captions, filling a feature cache)
waits for the lock instead (`FolderLock(..., wait=True)`), logging one line naming the holder; it then finds the
work done.

The lock is `fcntl.flock` on POSIX systems (Linux, macOS) and `msvcrt.locking` on Windows, which has no fcntl:
there it locks one byte past the PID (Windows keeps other processes from reading a locked range, and the PID
must stay readable), polled while waiting since msvcrt's blocking call gives up after 10 seconds. Both hold per
open file, so a second lock in the same process is refused too. The PID is read and written with lseek/read/write,
which both have. tests/base/test_lock_without_fcntl.py runs tests/base/test_lock.py on Linux with fcntl made
unimportable, msvcrt.locking emulated over flock. Standard library only.
"""

from __future__ import annotations

import errno
import importlib
import logging
import os
import time
from pathlib import Path
from types import ModuleType

from captioning.base.files import open_no_follow

_fcntl: ModuleType | None
_msvcrt: ModuleType | None
try:
    _fcntl, _msvcrt = importlib.import_module("fcntl"), None
except ImportError:  # Windows
    _fcntl, _msvcrt = None, importlib.import_module("msvcrt")

__all__ = ["LOCK_NAME", "FolderInUseError", "FolderLock"]

LOCK_NAME = ".lock"
PID_BYTES = 32  # the PID text at the start of the file; msvcrt locks the byte at this offset, after it
WAIT_POLL_S = 0.1  # how often a waiting lock retries under msvcrt
logger = logging.getLogger(__name__)
_TAKEN = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES, getattr(errno, "EDEADLOCK", errno.EDEADLK))


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock of the open file `fd` if it is free: whether it was taken."""
    try:
        if _fcntl is not None:
            _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
        elif _msvcrt is not None:
            os.lseek(fd, PID_BYTES, os.SEEK_SET)
            _msvcrt.locking(fd, _msvcrt.LK_NBLCK, 1)
    except OSError as err:
        if err.errno not in _TAKEN:
            raise
        return False
    return True


def _lock(fd: int) -> None:
    """Block until the exclusive lock of `fd` is taken."""
    if _fcntl is not None:
        _fcntl.flock(fd, _fcntl.LOCK_EX)
        return
    while not _try_lock(fd):
        time.sleep(WAIT_POLL_S)


def _unlock(fd: int) -> None:
    if _fcntl is not None:
        _fcntl.flock(fd, _fcntl.LOCK_UN)
    elif _msvcrt is not None:
        os.lseek(fd, PID_BYTES, os.SEEK_SET)
        _msvcrt.locking(fd, _msvcrt.LK_UNLCK, 1)


def _holder(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, PID_BYTES).decode(errors="replace").strip() or "unknown"


class FolderInUseError(OSError):
    """Another process holds the folder's lock: one line naming the folder and the holder's PID."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "folder in use"


class FolderLock:
    """`with FolderLock(path, "evaluation"):` takes the lock of `path` (created if missing) for the block.

    `what` names the kind of work in the refusal: `/x is in use by another evaluation (PID 123); wait for it to
    end, or write into another folder (hydra.run.dir=...)`. With `wait=True` a lock that is taken is waited for
    instead, after one log line: `waiting for PID 123's shapes generation in /x to end`.
    """

    def __init__(self, path: str | os.PathLike, what: str,
                 elsewhere: str = "write into another folder (hydra.run.dir=...)", *, wait: bool = False):
        self.path, self.what, self.elsewhere, self.wait = Path(path), what, elsewhere, wait
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """Take the lock and write this PID into it. If it is taken: FolderInUseError naming the holder's PID, or
        (`wait`) one log line naming it, then block until the holder ends (the OS frees the lock of a killed one).
        Returns whether it had to wait."""
        waited = False
        self.path.mkdir(parents=True, exist_ok=True)
        fd = open_no_follow(self.path / LOCK_NAME, os.O_RDWR)  # a symlink planted as .lock is replaced
        try:
            if not _try_lock(fd):
                holder = _holder(fd)
                if not self.wait:
                    raise FolderInUseError(f"{self.path} is in use by another {self.what} (PID {holder}); wait for "
                                           f"it to end, or {self.elsewhere}") from None
                logger.info("waiting for PID %s's %s in %s to end", holder, self.what, self.path)
                _lock(fd)
                waited = True
        except BaseException:  # refused, or Ctrl-C while waiting
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return waited

    def release(self) -> None:
        """Drop the lock (the OS also drops it when the process dies); the .lock file stays, empty."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            _unlock(self._fd)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        if self._fd is None:
            self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
