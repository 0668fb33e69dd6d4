"""captioning-train as a user runs it: Ctrl-C saves the run and prints the command that continues it; a launch that
fails on its config leaves no run folder behind."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures import tiny_overrides

pytestmark = pytest.mark.integration  # every test here starts a subprocess

BIN = Path(sys.executable).parent
TINY = ["dataset.batch_size=4", "eval.num_figures=0", "eval.report=false", "device=cpu"]  # and debug=tiny


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}


def test_ctrl_c_saves_the_run_and_the_printed_command_continues_it(shapes_json, tmp_path):
    run = tmp_path / "run"
    cmd = [str(BIN / "captioning-train"), *tiny_overrides(shapes_json.parent, *TINY), "trainer.max_epochs=40",
           "trainer.patience=40", f"hydra.run.dir={run}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (run / "history.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the first epoch has ended: Ctrl-C lands in the second (or its validation)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    assert "captioning-train: error" not in err, err[-3000:]  # a deliberate stop, not an error
    (line,) = [ln for ln in err.splitlines() if ln.startswith("captioning-train: stopped by Ctrl-C (SIGINT) in epoch")]
    assert "continue it with: " in line
    continue_cmd = shlex.split(line.split("continue it with: ", 1)[1])
    assert continue_cmd[0] == "captioning-train" and continue_cmd[-2:] == [f"hydra.run.dir={run}", "resume=auto"]
    assert (run / "checkpoints" / "last.pt").is_file() and (run / "curves.png").is_file()
    assert not (run / "metrics.json").exists()
    history = json.loads((run / "history.json").read_text())
    # The printed command, with a smaller budget so the test stays short, continues the same run to its end.
    done = subprocess.run([*continue_cmd, f"trainer.max_epochs={len(history) + 1}"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    after = json.loads((run / "history.json").read_text())
    assert after[: len(history)] == history and len(after) == len(history) + 1
    assert json.loads((run / "metrics.json").read_text())["epochs"] == len(history) + 1


def test_a_launch_with_a_bad_config_leaves_no_folder(tmp_path):
    outputs = tmp_path / "outputs"
    for bad in (["trainer.max_epochs=-1"], ["optim.lr=-0.1"]):
        proc = subprocess.run([str(BIN / "captioning-train"), *bad, f"hydra.run.dir={outputs}/run"], cwd=tmp_path,
                              env=_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not (outputs / "run").exists()
