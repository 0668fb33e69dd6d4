"""Installed without a checkout: the wheel (built as `python -m build` builds it, through the source distribution)
carries every file of conf/, and from an empty folder its commands train, evaluate and caption.

The wheel goes into a fresh virtual environment that sees this environment's site-packages for the dependencies
(a .pth file of paths: torch is not installed again, and this environment's editable captioning is not on the path,
as a .pth's lines are added without running the .pth files they name); seconds instead of minutes. The user's own
config folder (hydra.searchpath, README "Your own configs") is used by the run."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from captioning.runtime import CONF_DIR

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration  # builds and installs in subprocesses, runs the installed commands

# Top-level folders the build does not need (and may be large): left out of the copy it is built from.
NOT_BUILT = {"data", "outputs", "multirun", "runs", "build", "dist", "tests", "notebooks", "experiments"}
PEP517 = "import sys; from setuptools import build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"
PRESET = """\
# @package _global_
# My own preset, kept next to my data: hard attention, stopping after 3 epochs without improvement.
defaults:
  - override /attention: hard
trainer:
  patience: 3
"""


def _run(*cmd: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CAPTIONING_DATA_DIR")}
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _copy_ignore(folder: str, names: list[str]) -> list[str]:
    top = Path(folder) == ROOT
    return [n for n in names if n == "__pycache__" or (top and (n.startswith(".") or n in NOT_BUILT
                                                                or n.endswith(".egg-info")))]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """sdist from a copy of the source tree, the wheel from the unpacked sdist, installed with --no-deps into a new
    virtual environment: the paths of the sdist, the wheel, the environment's bin/ and an empty folder."""
    tmp = tmp_path_factory.mktemp("install")
    shutil.copytree(ROOT, tmp / "src", ignore=_copy_ignore)
    dist = tmp / "dist"
    dist.mkdir()
    sdist = dist / _run(sys.executable, "-c", PEP517, "build_sdist", dist, cwd=tmp / "src").stdout.split()[-1]
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (unpacked,) = (tmp / "unpacked").iterdir()
    wheel = dist / _run(sys.executable, "-c", PEP517, "build_wheel", dist, cwd=unpacked).stdout.split()[-1]
    venv = tmp / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)
    (site_packages,) = (venv / "lib").glob("python*/site-packages")
    (site_packages / "test_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run(sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--no-deps", "--no-index",
         "--quiet", wheel, cwd=tmp)
    (tmp / "empty").mkdir()
    return {"sdist": sdist, "wheel": wheel, "bin": venv / "bin", "empty": tmp / "empty"}


def _conf_files() -> set[str]:
    return {p.relative_to(CONF_DIR).as_posix() for p in CONF_DIR.rglob("*") if p.is_file()}


def test_the_wheel_and_the_sdist_hold_every_file_of_conf(installed):
    with zipfile.ZipFile(installed["wheel"]) as whl:
        in_wheel = {n.removeprefix("captioning/conf/") for n in whl.namelist() if n.startswith("captioning/conf/")}
    with tarfile.open(installed["sdist"]) as tar:
        in_sdist = {n.split("/conf/", 1)[1] for n in tar.getnames() if "/conf/" in n and tar.getmember(n).isfile()}
    assert in_wheel == _conf_files() == in_sdist
    assert len(in_wheel) > 50


def test_the_installed_package_reads_its_own_conf(installed):
    out = _run(installed["bin"] / "python", "-c", "import captioning, captioning.runtime as r; "
               "print(captioning.__file__); print(r.CONF_DIR)", cwd=installed["empty"]).stdout.split()
    package = Path(out[0]).parent
    assert not package.is_relative_to(ROOT) and Path(out[1]) == package / "conf"


@pytest.mark.parametrize("command, args", [
    ("captioning-train", ["--help"]), ("captioning-train", ["--cfg", "job"]),
    ("captioning-train", ["--cfg", "job", "debug=tiny", "attention=hard"]),
    ("captioning-evaluate", ["--help"]), ("captioning-extract-features", ["--help"]),
    ("captioning-extract-features", ["--cfg", "job", "encoder=resnet50"]),
])
def test_help_and_the_composed_config_are_the_source_trees(installed, command, args):
    from_wheel = _run(installed["bin"] / command, *args, cwd=installed["empty"]).stdout
    from_source = _run(Path(sys.executable).parent / command, *args, cwd=ROOT).stdout  # this environment's: editable
    assert from_wheel == from_source and len(from_wheel.splitlines()) > 10


def test_train_evaluate_and_caption_from_the_wheel_with_an_own_preset(installed):
    """The README's install-without-a-checkout path: a one-epoch tiny run from an empty folder, its preset in the
    user's own config folder next to the data, then captioning-evaluate on its checkpoint and captioning-caption."""
    work, bin_ = installed["empty"], installed["bin"]
    (work / "my_conf" / "experiment").mkdir(parents=True)
    (work / "my_conf" / "experiment" / "mine.yaml").write_text(PRESET)
    run = _run(bin_ / "captioning-train", "hydra.searchpath=[file://my_conf]", "experiment=mine", "debug=tiny",
               "trainer.max_epochs=1", "hydra.run.dir=run", "device=cpu", cwd=work)
    log = run.stdout + run.stderr
    assert f"experiment=mine selects attention=hard ({work / 'my_conf' / 'experiment' / 'mine.yaml'})" in log
    saved = (work / "run" / "config.yaml").read_text()
    assert "attention:\n  _target_: hard\n" in saved and "  max_epochs: 1\n" in saved and "  patience: 3\n" in saved
    assert (work / "run" / "checkpoints" / "best.pt").is_file() and (work / "data" / "shapes-tiny").is_dir()
    _run(bin_ / "captioning-evaluate", "checkpoint=run/checkpoints/best.pt", "hydra.run.dir=eval", "device=cpu",
         "eval.beam_size=2", "eval.metrics=[bleu]", cwd=work)
    assert "Bleu_4" in (work / "eval" / "metrics.json").read_text()
    image = work / "data" / "shapes-tiny" / "images" / "test_00000.png"
    out = _run(bin_ / "captioning-caption", image, "--checkpoint", "run/checkpoints/best.pt", cwd=work).stdout
    assert out.startswith(f"{image.relative_to(work)}\t") or out.startswith(f"{image}\t"), out
