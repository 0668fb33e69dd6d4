"""The folder lock (captioning/base/lock.py): refused at once naming the holder, waited for with one log line, freed
by the OS when its holder dies however it dies, exclusive within one process, a planted symlink replaced.

tests/base/test_lock_without_fcntl.py runs this file again with fcntl made unimportable (the Windows path)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from captioning.base import lock as lock_module
from captioning.base.lock import LOCK_NAME, FolderInUseError, FolderLock

WINDOWS_PATH = os.environ.get("CAPTIONING_TEST_LOCK_WITHOUT_FCNTL") == "1"  # set by test_lock_without_fcntl.py


def _holder(folder: Path, then: str) -> subprocess.Popen[str]:
    """A process that takes the lock of `folder`, prints 'held' and then runs `then` (its environment is this one's:
    under test_lock_without_fcntl.py it has no fcntl either)."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from captioning.base.lock import FolderLock
        lock = FolderLock({str(folder)!r}, "test")
        lock.acquire()
        print("held", flush=True)
        {then}
    """)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_the_lock_is_the_platforms_own() -> None:
    if WINDOWS_PATH:
        assert lock_module._fcntl is None and lock_module._msvcrt is not None
    else:
        assert lock_module._fcntl is not None and lock_module._msvcrt is None


def test_a_held_lock_holds_the_pid_and_an_ended_one_an_empty_file(tmp_path: Path) -> None:
    lock = FolderLock(tmp_path / "run", "training")
    assert lock.acquire() is False and lock.held
    assert (tmp_path / "run" / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    lock.release()
    assert not lock.held and (tmp_path / "run" / LOCK_NAME).read_bytes() == b""  # the file stays, empty
    with FolderLock(tmp_path / "run", "training"):  # free again
        pass


def test_a_second_lock_is_refused_naming_the_holder(tmp_path: Path) -> None:
    proc = _holder(tmp_path, "time.sleep(60)")
    try:
        with pytest.raises(FolderInUseError) as err:
            FolderLock(tmp_path, "evaluation").acquire()
        assert str(err.value) == (f"{tmp_path} is in use by another evaluation (PID {proc.pid}); wait for it to end, "
                                  "or write into another folder (hydra.run.dir=...)")
        assert (tmp_path / LOCK_NAME).read_text() == f"{proc.pid}\n"  # the refused one changed nothing
    finally:
        proc.kill()
        proc.wait()


def test_the_lock_is_exclusive_within_one_process_too(tmp_path: Path) -> None:
    with FolderLock(tmp_path / "cache", "feature extraction"):
        with pytest.raises(FolderInUseError, match="in use by another feature extraction"):
            FolderLock(tmp_path / "cache", "feature extraction").acquire()
    with FolderLock(tmp_path / "cache", "feature extraction"):  # released at the end of the block
        pass


def test_a_waiting_lock_waits_for_the_holder_then_takes_it(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    holder = _holder(tmp_path, "time.sleep(1.0); lock.release()")
    with pytest.raises(FolderInUseError, match=rf"in use by another test \(PID {holder.pid}\)"):
        FolderLock(tmp_path, "test").acquire()
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="captioning.base.lock"):
        lock = FolderLock(tmp_path, "shapes generation", wait=True)
        assert lock.acquire() is True  # it had to wait
    assert holder.wait(timeout=30) == 0 and time.monotonic() - start > 0.2
    assert [r.getMessage() for r in caplog.records] == [
        f"waiting for PID {holder.pid}'s shapes generation in {tmp_path} to end"]
    assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    lock.release()
    again = FolderLock(tmp_path, "test", wait=True)
    assert again.acquire() is False  # free: taken at once
    again.release()


def test_a_killed_holder_never_blocks(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "time.sleep(60)")
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(holder.pid)  # a stale PID stays in the file
    lock = FolderLock(tmp_path, "shapes generation", wait=True)
    assert lock.acquire() is False
    lock.release()


def test_a_symlink_planted_as_the_lock_file_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LOCK_NAME).symlink_to(target)
    with FolderLock(tmp_path / "run", "training"):
        assert not (tmp_path / "run" / LOCK_NAME).is_symlink()
        assert (tmp_path / "run" / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    assert target.read_text() == "keep me\n"
