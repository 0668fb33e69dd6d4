"""One writer per output folder: an OS lock on `<folder>/.lock`, held for the life of the work that writes there.

A run of captioning-train (its run folder), captioning-evaluate (its output folder) and captioning-extract-features
(the feature cache folder) each hold `fcntl.flock` on the folder's `.lock` file, its PID written inside. The OS
drops the lock when the process ends, however it ends (kill -9 included), so a dead run never blocks the next one;
a second launch into a folder in use is refused at once, naming the holder's PID, instead of two processes
interleaving their files (metrics from one, report.html from the other). Work that any number of processes may
ask for and only one should do (generating a synthetic data set, preparing captions, filling a feature cache)
waits for the lock instead (`FolderLock(..., wait=True)`), logging one line naming the holder; it then finds the
work done. Standard library only.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from pathlib import Path

from captioning.base.files import open_no_follow

__all__ = ["LOCK_NAME", "FolderInUseError", "FolderLock"]

LOCK_NAME = ".lock"
logger = logging.getLogger(__name__)


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
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                if not self.wait:
                    raise FolderInUseError(f"{self.path} is in use by another {self.what} (PID {holder}); wait for "
                                           f"it to end, or {self.elsewhere}") from None
                logger.info("waiting for PID %s's %s in %s to end", holder, self.what, self.path)
                fcntl.flock(fd, fcntl.LOCK_EX)
                waited = True
        except BaseException:  # refused, or Ctrl-C while waiting
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return waited

    def release(self) -> None:
        """Drop the lock (the OS also drops it when the process dies); the .lock file stays, empty."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        if self._fd is None:
            self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
