"""base/files.py, the one file writer: a write replaces the file whole or not at all; a failed one (disk full, I/O
error, read-only folder) leaves the previous version byte for byte, no temporary file, and one line naming the file."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
import torch
from fixtures import fail_writes

from captioning.base.files import (
    WriteError,
    append_bytes,
    atomic_file,
    write_bytes_atomic,
    write_error,
    write_text_atomic,
)
from captioning.base.jsonio import write_json_atomic

OLD = b"the previous version\n"
FAULTS = [(at, code) for at in ("create", "write", "fsync", "replace") for code in (errno.ENOSPC, errno.EIO)]


def _only(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def assert_write_failed(err: pytest.ExceptionInfo, path: Path, code: int) -> None:
    """The error a user sees: one line `cannot write PATH: REASON`, the cause's errno kept."""
    assert isinstance(err.value, OSError) and err.value.errno == code
    assert str(err.value) == f"cannot write {path}: {os.strerror(code)}"
    assert "\n" not in str(err.value)


def test_a_write_replaces_the_file_and_leaves_nothing_else(tmp_path):
    path = tmp_path / "out.json"
    write_json_atomic(path, {"a": [1, 2]}, indent=1)
    assert path.read_text() == '{\n "a": [\n  1,\n  2\n ]\n}\n'
    write_text_atomic(path, "ünïcode\n")
    assert path.read_bytes() == "ünïcode\n".encode()
    with atomic_file(path) as f:
        f.write(b"binary")
        f.write(b" in parts")
    assert path.read_bytes() == b"binary in parts" and _only(tmp_path) == ["out.json"]


def test_permissions_are_those_a_plain_open_gives(tmp_path):
    with open(tmp_path / "plain", "wb"):
        pass
    write_bytes_atomic(tmp_path / "new", b"x")
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode)
    (tmp_path / "private").write_bytes(b"x")
    (tmp_path / "private").chmod(0o600)
    write_bytes_atomic(tmp_path / "private", b"y")  # an existing file keeps its mode, as open("wb") keeps it
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600


def test_a_symlink_at_the_target_is_replaced_not_followed(tmp_path):
    (tmp_path / "elsewhere").write_bytes(OLD)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    write_bytes_atomic(tmp_path / "link", b"new")
    assert not (tmp_path / "link").is_symlink() and (tmp_path / "link").read_bytes() == b"new"
    assert (tmp_path / "elsewhere").read_bytes() == OLD


@pytest.mark.parametrize("at, code", FAULTS)
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch, at, code):
    path = tmp_path / "last.pt"
    path.write_bytes(OLD)
    failed = fail_writes(monkeypatch, code, at)
    with pytest.raises(OSError) as err:
        write_bytes_atomic(path, b"x" * 100_000)
    assert failed, "the fault was never reached"
    assert_write_failed(err, path, code)
    assert path.read_bytes() == OLD and _only(tmp_path) == ["last.pt"]


@pytest.mark.parametrize("at, code", [("write", errno.ENOSPC), ("write", errno.EIO), ("fsync", errno.EIO)])
def test_a_serializer_that_hides_the_os_error_still_gives_the_file_and_the_cause(tmp_path, monkeypatch, at, code):
    """torch.save's zip writer turns a failed write of its file object into a RuntimeError of its own."""
    path = tmp_path / "best.pt"
    torch.save({"w": torch.zeros(3)}, path)
    old = path.read_bytes()
    fail_writes(monkeypatch, code, at, room=1000)
    with pytest.raises(OSError) as err, atomic_file(path) as f:
        torch.save({"w": torch.zeros(100_000)}, f)
    assert_write_failed(err, path, code)
    assert path.read_bytes() == old and _only(tmp_path) == ["best.pt"]


@pytest.mark.parametrize("error", [ValueError("not serializable"), KeyboardInterrupt()])
def test_any_error_in_the_block_keeps_the_old_file_and_passes_through(tmp_path, error):
    path = tmp_path / "metrics.json"
    path.write_bytes(OLD)
    with pytest.raises(type(error)) as err, atomic_file(path) as f:
        f.write(b"half a file")
        raise error
    assert err.value is error
    assert path.read_bytes() == OLD and _only(tmp_path) == ["metrics.json"]


def test_a_missing_folder_or_a_folder_at_the_target_is_one_line(tmp_path):
    with pytest.raises(OSError) as err:
        write_bytes_atomic(tmp_path / "nowhere" / "x.json", b"{}")
    assert_write_failed(err, tmp_path / "nowhere" / "x.json", errno.ENOENT)
    (tmp_path / "folder").mkdir()
    with pytest.raises(OSError) as err:
        write_bytes_atomic(tmp_path / "folder", b"{}")
    assert str(err.value).startswith(f"cannot write {tmp_path / 'folder'}: ") and _only(tmp_path) == ["folder"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to read-only files and folders")
def test_a_folder_made_read_only_mid_run_keeps_the_old_file(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    write_bytes_atomic(folder / "last.pt", OLD)
    folder.chmod(0o555)
    try:
        with pytest.raises(OSError) as err:
            write_bytes_atomic(folder / "last.pt", b"new")
        assert_write_failed(err, folder / "last.pt", errno.EACCES)
        assert (folder / "last.pt").read_bytes() == OLD and _only(folder) == ["last.pt"]
    finally:
        folder.chmod(0o755)


def test_write_error_keeps_errno_and_survives_pickling(tmp_path):
    import pickle

    err = write_error(tmp_path / "x", OSError(errno.ENOSPC, "No space left on device", "/tmp/.x.abc.tmp"))
    assert isinstance(err, WriteError) and err.errno == errno.ENOSPC and err.filename == str(tmp_path / "x")
    assert str(pickle.loads(pickle.dumps(err))) == str(err) == f"cannot write {tmp_path / 'x'}: No space left on device"
    assert write_error(tmp_path / "y", err) is err  # already named: kept
    assert str(write_error(tmp_path / "z", OSError("two\nlines"))) == f"cannot write {tmp_path / 'z'}: two lines"


@pytest.mark.parametrize("at", ["write", "fsync"])
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_a_failed_append_is_cut_back_off(tmp_path, monkeypatch, at, code):
    path = tmp_path / "log.jsonl"
    append_bytes(path, b'{"n": 1}\n')
    inode, real_write, real_fsync = path.stat().st_ino, os.write, os.fsync

    def ours(fd: int) -> bool:
        return os.fstat(fd).st_ino == inode

    def partial(fd, data):  # the disk takes 5 bytes, then is full
        if not ours(fd):
            return real_write(fd, data)
        real_write(fd, bytes(data[:5]))
        raise OSError(code, os.strerror(code))

    def no_sync(fd):
        if ours(fd):
            raise OSError(code, os.strerror(code))
        return real_fsync(fd)

    monkeypatch.setattr(os, "write" if at == "write" else "fsync", partial if at == "write" else no_sync)
    with pytest.raises(OSError) as err:
        append_bytes(path, b'{"n": 2}\n{"n": 3}\n')
    assert_write_failed(err, path, code)
    assert path.read_bytes() == b'{"n": 1}\n'
    monkeypatch.undo()
    append_bytes(path, b'{"n": 2}\n')
    assert path.read_bytes() == b'{"n": 1}\n{"n": 2}\n'
