"""Data that several processes ask for at once (a parallel sweep's first jobs on an empty data folder): generating
`shapes`, preparing captions and filling a feature cache each happen once, under the folder's lock; the other
processes wait, say so in one log line, and proceed with the same files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fixtures import tiny_overrides

from captioning.data.shapes.generate import build_shapes

SHAPES = {"seed": 3, "num_train": 120, "num_val": 12, "num_test": 12, "image_size": 32, "object_scale": 1.0}
PROCESSES = 4

# A child waits for the go file (so that all start their work together, after their imports), then does one job.
CHILD = textwrap.dedent("""
    import logging, os, sys, time
    from pathlib import Path
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    job, go, root, overrides = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]

    def ready_then_wait():
        Path(f"{go}.ready-{os.getpid()}").touch()
        while not go.exists():
            time.sleep(0.005)

    if job == "shapes":
        from captioning.data.shapes.generate import build_shapes
        import json
        run = lambda: build_shapes(root, **json.loads(overrides[0]))
    else:
        from hydra import compose, initialize_config_dir
        from captioning.runtime import CONF_DIR
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("extract_features" if job == "features" else "train", overrides=overrides)
        if job == "features":
            from captioning.tools import extract_features as tool

            class ReleasedAtTheLock(tool.FolderLock):
                \"\"\"Extraction builds its encoder before it takes the folder's lock: released there, so that
                building it (its time varies with the load) cannot let one process finish before the others ask.\"\"\"

                def acquire(self):
                    ready_then_wait()
                    return super().acquire()

            tool.FolderLock = ReleasedAtTheLock
            run = lambda: tool.extract(cfg)
        else:
            from captioning.tools.prepare import prepare
            run = lambda: prepare(cfg.dataset)
    if job != "features":
        ready_then_wait()
    run()
""")


def _digests(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """SHA-256 of every file under `folder` by relative path (lock files and `skip` names left out)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.endswith(".lock") and p.name not in skip}


def _manifest_without_time(path: Path) -> dict:
    """A prepared set's manifest.json but its creation time."""
    return {k: v for k, v in json.loads(path.read_text()).items() if k != "created"}


def _together(tmp_path: Path, job: str, root: Path, *args: str, n: int = PROCESSES) -> list[str]:
    """Run `job` in n processes released at the same moment (feature extraction: at its lock); returns each one's
    log (all must succeed)."""
    go = tmp_path / f"go-{job}-{len(list(tmp_path.glob('go-*')))}"  # a new one for each call
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, job, str(go), str(root), *args], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(n)]
    deadline = time.monotonic() + 300
    while len(list(tmp_path.glob(f"{go.name}.ready-*"))) < n and all(p.poll() is None for p in procs):
        assert time.monotonic() < deadline, "the children did not get ready"
        time.sleep(0.01)  # every child has imported and built what it needs; they spin on the go file meanwhile
    go.touch()
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return logs


@pytest.mark.integration
def test_shapes_generated_by_four_processes_at_once_is_one_data_set(tmp_path: Path) -> None:
    alone = build_shapes(tmp_path / "alone", **SHAPES).parent
    logs = _together(tmp_path, "shapes", tmp_path / "together", json.dumps(SHAPES))
    assert sum("generated 144 shapes images" in log for log in logs) == 1, logs
    waited = [log for log in logs if "waiting for PID" in log]
    assert all(log.count("waiting for PID") == 1 and "shapes generation" in log for log in waited)
    assert _digests(tmp_path / "together") == _digests(alone)  # byte for byte, no temporary file left
    assert not list((tmp_path / "together").rglob("*.tmp"))


@pytest.mark.integration
def test_captions_prepared_by_four_processes_at_once_are_one_set(tmp_path: Path, shapes_json: Path) -> None:
    data = tmp_path / "data"
    overrides = [*tiny_overrides(shapes_json.parent), f"dataset.prepared={data}"]
    _together(tmp_path, "prepared", data, *overrides, n=1)
    alone = next(p for p in data.iterdir() if p.is_dir())
    (data / "once").mkdir()
    alone = alone.rename(data / "once" / alone.name)
    logs = _together(tmp_path, "prepared", data, *overrides)
    sets = [p for p in data.iterdir() if p.is_dir() and p.name != "once"]
    assert [p.name for p in sets] == [alone.name], sorted(p.name for p in data.iterdir())  # no temporary folder left
    assert sum("prepared captions: built" in log for log in logs) == 1, logs
    assert sum("prepared captions: opened" in log for log in logs) == PROCESSES - 1, logs
    assert _digests(sets[0], skip=("manifest.json",)) == _digests(alone, skip=("manifest.json",))
    manifests = [_manifest_without_time(p / "manifest.json") for p in (sets[0], alone)]
    assert manifests[0] == manifests[1]


@pytest.mark.integration
def test_a_feature_cache_filled_by_four_processes_at_once_is_one_cache(tmp_path: Path, shapes_json: Path) -> None:
    resnet = ["encoder=resnet50", "encoder.arch=resnet18", "encoder.pretrained=false", "encoder.fine_tune=none",
              "encoder.image_size=32", "encoder.grid_size=2", "batch_size=16", "dataset.prepared=null"]
    overrides = [o for o in tiny_overrides(shapes_json.parent) if not o.startswith("encoder.")] + resnet
    _together(tmp_path, "features", tmp_path, *overrides, f"dataset.features={tmp_path / 'once'}", n=1)
    logs = _together(tmp_path, "features", tmp_path, *overrides, f"dataset.features={tmp_path / 'together'}")
    assert sum("feature extraction" in log and "waiting for PID" in log for log in logs) >= 1, logs
    assert _digests(tmp_path / "together") == _digests(tmp_path / "once")


# The lock itself: tests/base/test_lock.py.
def test_generation_ignores_its_own_lock_file(tmp_path: Path) -> None:
    """A lock file left by a killed generator (nothing else in the folder) is not "other files" to refuse."""
    (tmp_path / "shapes").mkdir()
    (tmp_path / "shapes" / ".lock").write_text("12345\n")
    path = build_shapes(tmp_path / "shapes", seed=0, num_train=2, num_val=1, num_test=1, image_size=32)
    assert path.is_file()
