"""Makes a Linux Python process look like Windows to captioning/base/lock.py (loaded as `sitecustomize` by the
processes of tests/base/test_lock_without_fcntl.py, whose PYTHONPATH starts with this folder).

`import fcntl` fails; `os.pread`, `os.pwrite` and `os.O_NOFOLLOW`, which Windows lacks, are gone; `msvcrt` is a
module whose `locking(fd, mode, nbytes)` keeps Windows' rules and checks them: it locks `nbytes` from the file's
current position (the region must not be locked already by this handle, an unlock must name exactly a locked
region), a taken lock is OSError EACCES, and a region may not cover the PID at the start of the file (Windows
keeps other processes from reading a locked range, and a refused process must read the holder's PID). Underneath,
`flock` on the descriptor gives what Windows gives a handle: exclusive per open file, in one process too, and
dropped by the OS when the process dies."""

import errno
import fcntl as _posix
import os
import subprocess  # noqa: F401  # imported before msvcrt exists: Python's subprocess takes an importable msvcrt for Windows
import sys
import types

LK_UNLCK, LK_LOCK, LK_NBLCK, LK_RLCK, LK_NBRLCK = 0, 1, 2, 3, 4
_held: dict[int, tuple[int, int]] = {}  # fd -> its locked region (start, length)


def locking(fd: int, mode: int, nbytes: int) -> None:
    region = (os.lseek(fd, 0, os.SEEK_CUR), nbytes)
    if mode == LK_UNLCK:
        if _held.get(fd) != region:
            raise OSError(errno.EACCES, f"unlocking {region}, which is not locked (locked: {_held.get(fd)})")
        _posix.flock(fd, _posix.LOCK_UN)
        del _held[fd]
        return
    if mode not in (LK_NBLCK, LK_LOCK):
        raise ValueError(f"locking mode {mode} is not emulated")
    if region[0] < 32:
        raise AssertionError(f"the lock region {region} covers the PID (bytes 0-31), which others must read")
    if fd in _held:
        raise OSError(errno.EACCES, "this handle holds a lock already")
    try:
        _posix.flock(fd, _posix.LOCK_EX | _posix.LOCK_NB)  # LK_LOCK's 10 one-second retries are not emulated
    except BlockingIOError:
        raise OSError(errno.EACCES, "Permission denied") from None
    _held[fd] = region


msvcrt = types.ModuleType("msvcrt")
msvcrt.LK_UNLCK, msvcrt.LK_LOCK, msvcrt.LK_NBLCK, msvcrt.LK_RLCK, msvcrt.LK_NBRLCK = (
    LK_UNLCK, LK_LOCK, LK_NBLCK, LK_RLCK, LK_NBRLCK)
msvcrt.locking = locking
sys.modules["msvcrt"] = msvcrt
sys.modules["fcntl"] = None  # type: ignore[assignment]  # `import fcntl` raises ImportError
for name in ("pread", "pwrite", "O_NOFOLLOW"):
    if hasattr(os, name):
        delattr(os, name)
