"""One run per folder: an OS lock held for the run's life, and a folder that already holds a run is never clobbered."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures import compose_tiny_train

from captioning.train import train
from captioning.training.run_folder import LOCK_NAME, RunFolder, RunFolderError

BIN = Path(sys.executable).parent
# A process that holds a run folder's lock until it is killed (prints "locked" once it holds it).
HOLDER = """
import sys, time
from captioning.training.run_folder import RunFolder
folder = RunFolder(sys.argv[1])
folder.lock()
print("locked", flush=True)
time.sleep(600)
"""


def _cfg(shapes_json: Path, *extra: str):
    return compose_tiny_train(shapes_json, "trainer.max_epochs=1", "eval.num_figures=0", "eval.report=false",
                              "device=cpu", *extra)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of tmp_path/run; yields (folder, pid)."""
    folder = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    yield folder, proc
    proc.kill()
    proc.wait()


@pytest.fixture(autouse=True)
def no_curves(monkeypatch):
    monkeypatch.setattr("captioning.training.run_state.plot_history", lambda *a, **k: None)


@pytest.mark.integration
def test_a_second_run_into_a_locked_folder_stops_at_once_naming_the_pid(shapes_json, holder):
    folder, proc = holder
    started = time.monotonic()
    with pytest.raises(RunFolderError, match=rf"in use by another training run \(PID {proc.pid}\)"):
        train(_cfg(shapes_json), folder)
    assert time.monotonic() - started < 5  # before any data or model work
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]  # nothing written


@pytest.mark.integration
def test_the_console_command_prints_one_line_and_exit_status_2(shapes_json, holder, tmp_path):
    folder, proc = holder
    run = subprocess.run([str(BIN / "captioning-train"), f"dataset.root={shapes_json.parent}", "device=cpu",
                          f"hydra.run.dir={folder}"], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [run.stderr.strip()]
    assert f"PID {proc.pid}" in run.stderr and "captioning-train: error:" in run.stderr


@pytest.mark.integration
def test_the_lock_dies_with_its_process_even_by_kill_9(holder):
    folder, proc = holder
    with pytest.raises(RunFolderError):
        RunFolder(folder).lock()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with RunFolder(folder):  # taken at once: the OS dropped the dead process's lock
        assert (folder / LOCK_NAME).read_text().strip() == str(os.getpid())
    assert (folder / LOCK_NAME).read_text() == ""  # released on exit


def test_a_finished_run_is_never_replaced_without_being_asked(shapes_json, tmp_path):
    run = tmp_path / "run"
    train(_cfg(shapes_json), run)
    best = run / "checkpoints" / "best.pt"
    before = {p.name: _digest(p) for p in [best, run / "metrics.json", run / "history.json", run / "config.yaml"]}
    with pytest.raises(RunFolderError, match="already holds a run; continue it with resume=auto, replace it with "
                                             "overwrite=true"):
        train(_cfg(shapes_json, "optim.lr=0.5"), run)  # a different, worse run would have replaced best.pt
    assert {p: _digest(run / ("checkpoints" if p == "best.pt" else "") / p) for p in before} == before
    # resume=PATH of another run's checkpoint into this folder is refused as well
    other = tmp_path / "other.pt"
    other.write_bytes(best.read_bytes())
    with pytest.raises(RunFolderError, match="may only continue from its own checkpoints"):
        train(_cfg(shapes_json, f"resume={other}"), run)


def test_overwrite_moves_the_old_run_aside_and_starts_anew(shapes_json, tmp_path):
    run = tmp_path / "run"
    train(_cfg(shapes_json), run)
    old_best = _digest(run / "checkpoints" / "best.pt")
    train(_cfg(shapes_json, "overwrite=true", "seed=1"), run)
    (aside,) = tmp_path.glob("run.replaced-*")
    assert _digest(aside / "checkpoints" / "best.pt") == old_best  # the old run is kept whole
    assert (aside / "metrics.json").is_file() and (run / "metrics.json").is_file()
    assert _digest(run / "checkpoints" / "best.pt") != old_best
    with pytest.raises(RunFolderError, match="choose one"):
        train(_cfg(shapes_json, "overwrite=true", "resume=auto"), run)


def test_resume_auto_with_nothing_to_resume_says_so(shapes_json, tmp_path, caplog):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)  # a finished run whose last.pt was deleted: results would be lost
    (run / "checkpoints" / "best.pt").write_bytes(b"weights")
    with pytest.raises(RunFolderError, match="nothing to resume .* no checkpoints/last.pt.*overwrite=true"):
        train(_cfg(shapes_json, "resume=auto"), run)
    assert (run / "checkpoints" / "best.pt").read_bytes() == b"weights"
    # a run that died before its first checkpoint: nothing to lose, it starts again and says so
    died = tmp_path / "died"
    (died / "checkpoints").mkdir(parents=True)
    (died / "config.yaml").write_text("seed: 0\n")
    (died / "checkpoints" / "last.pt.tmp").write_bytes(b"half a checkpoint")
    with caplog.at_level("INFO", logger="captioning.training.run_folder"):
        train(_cfg(shapes_json, "resume=auto"), died)
    assert "nothing to resume" in caplog.text and "starting the run from the beginning" in caplog.text
    (aside,) = tmp_path.glob("died.replaced-*")
    assert (aside / "config.yaml").read_text() == "seed: 0\n" and (died / "metrics.json").is_file()
    # an empty folder: resume=auto starts the run (a job script may always pass it), and says so
    fresh = tmp_path / "fresh"
    with caplog.at_level("INFO", logger="captioning.training.run_folder"):
        train(_cfg(shapes_json, "resume=auto"), fresh)
    assert "holds no run yet, so a new run starts there" in caplog.text
    assert (fresh / "checkpoints" / "last.pt").is_file()


def test_stale_tmp_files_are_removed_when_a_run_claims_its_folder(tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    (ckpts / "last.pt").write_bytes(b"x")
    (ckpts / "last.pt.tmp").write_bytes(b"half")
    (ckpts / "best.pt.tmp").write_bytes(b"half")
    folder = RunFolder(tmp_path)
    assert folder.claim("auto", overwrite=False) == ckpts / "last.pt"
    folder.release()
    assert sorted(p.name for p in ckpts.iterdir()) == ["last.pt"]
