"""Commands that answer at once: `--help`, a misspelt override, a bad option and a checkpoint that is missing or no
checkpoint are answered by every console command without importing torch, torchvision or the models.

Each case runs a command's entry point (as pyproject.toml's [project.scripts] names it) in a fresh interpreter (this
test process has torch loaded by conftest) and reads back its exit status, what it printed and which of the heavy
modules ended up in `sys.modules`. How long that takes is measured by experiments/bench_cli_startup.py, not here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from PIL import Image

pytestmark = pytest.mark.integration  # every test here starts a subprocess

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
HYDRA_APPS = ("captioning-train", "captioning-evaluate", "captioning-extract-features")
HEAVY = ("torch", "torchvision", "captioning.factory.registry", "captioning.models")

# Runs one console entry point with the given argv; its last stdout line: exit status and the heavy modules loaded.
SCRIPT = """
import importlib, json, sys
prog, target, *args = sys.argv[1:]
module, func = target.split(":")
sys.argv = [prog, *args]
try:
    status = getattr(importlib.import_module(module), func)()
except SystemExit as exit_:
    status = exit_.code
sys.stdout.flush()
print("\\n" + json.dumps({"status": status or 0, "heavy": [m for m in HEAVY if m in sys.modules]}))
""".replace("HEAVY", repr(HEAVY))


def start(script: str, *args: str | Path, cwd: Path) -> tuple[int, str, str, list[str]]:
    """Run `script`'s entry point in a fresh interpreter: its exit status, stdout, stderr and the heavy modules."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT, script, SCRIPTS[script], *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    *out, last = proc.stdout.rstrip("\n").split("\n")
    report = json.loads(last)
    return report["status"], "\n".join(out), proc.stderr, report["heavy"]


def one_error_line(err: str, script: str) -> str:
    """The single stderr line `script: error: ...` (asserted), without its prefix."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: error: "), err[-2000:]
    return lines[0].removeprefix(f"{script}: error: ")


def test_every_console_command_is_covered():
    assert len(SCRIPTS) == 12 and set(HYDRA_APPS) <= set(SCRIPTS)


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_help_imports_no_torch(script, tmp_path):
    status, out, err, heavy = start(script, "--help", cwd=tmp_path)
    assert status == 0 and "Traceback" not in err, err[-2000:]
    assert script in out and ("usage" in out.lower() or "Examples:" in out or "example" in out.lower()), out[:500]
    assert heavy == [], f"{script} --help imported {heavy}"
    assert not any(tmp_path.iterdir())  # no run folder, no log


@pytest.mark.parametrize("script", HYDRA_APPS)
def test_the_hydra_apps_help_is_hydras_to_the_byte(script, tmp_path):
    """`--help` alone is printed from conf/hydra/help/ without composing the config (captioning/config/help.py):
    the same text as Hydra's own rendering, which `--help` with any override still goes through."""
    status, fast, err, _ = start(script, "--help", cwd=tmp_path)
    assert status == 0, err[-2000:]
    module = SCRIPTS[script].split(":")[0]
    hydra = subprocess.run([sys.executable, "-c", f"import sys; sys.argv = [{script!r}, '--help']\n"
                            f"from {module} import hydra_main\nhydra_main()"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
    assert hydra.returncode == 0 and hydra.stdout.strip(), hydra.stderr[-2000:]
    assert fast.rstrip("\n") == hydra.stdout.rstrip("\n")


# A misspelt key of a group (the Hydra apps and captioning-prepare, which takes captioning-train's overrides).
MISSPELT = [
    ("captioning-train", ["decoder.dropuot=0.2"], "decoder.dropuot=0.2: unknown key (did you mean 'dropout'?)"),
    ("captioning-extract-features", ["decoder.dropuot=0.2"],
     "decoder.dropuot=0.2: unknown key (did you mean 'dropout'?)"),
    ("captioning-evaluate", ["checkpoint=missing.pt", "eval.beam_sise=2"],
     "eval.beam_sise=2: unknown key (did you mean 'beam_size'?)"),
    ("captioning-evaluate", ["checkpoint=missing.pt", "decoder.dropuot=0.2"],
     "decoder.dropuot=0.2: unknown config group or key"),  # evaluate has no decoder group
    ("captioning-train", ["atention=hard"], "atention=hard: unknown config group or key (did you mean 'attention'?)"),
    ("captioning-train", ["attention=sofft"], "attention=sofft: no such choice in attention/"),
    ("captioning-prepare", ["dataset.min_wrd_freq=2"], "dataset.min_wrd_freq=2: unknown key (did you mean"),
]


@pytest.mark.parametrize("script, args, message", MISSPELT, ids=[f"{s} {' '.join(a)}" for s, a, _ in MISSPELT])
def test_a_misspelt_override_is_one_line_without_torch(script, args, message, tmp_path):
    status, out, err, heavy = start(script, *args, cwd=tmp_path)
    assert status == 2 and message in one_error_line(err, script)
    assert heavy == [], f"{script} {' '.join(args)} imported {heavy}"
    assert not any(tmp_path.iterdir())


ARGPARSE = [s for s in SCRIPTS if s not in HYDRA_APPS]


@pytest.mark.parametrize("script", ARGPARSE)
def test_a_bad_option_is_one_line_without_torch(script, tmp_path):
    status, out, err, heavy = start(script, "--no-such-option", cwd=tmp_path)
    assert status == 2 and one_error_line(err, script).endswith("(see --help)") and out.strip() == ""
    assert heavy == [], f"{script} --no-such-option imported {heavy}"


# A checkpoint that is not there, a text file ({notes}) or another tool's torch.save file ({other}): refused before
# the model code loads.
CHECKPOINTS = [
    ("captioning-evaluate", ["checkpoint=missing.pt"], "checkpoint='missing.pt': checkpoint not found"),
    ("captioning-evaluate", ["checkpoint={notes}"], "notes.pt is not a readable captioning checkpoint"),
    ("captioning-train", ["init_from={notes}"], "notes.pt is not a readable captioning checkpoint"),
    ("captioning-caption", ["--checkpoint", "missing.pt", "{image}"], "checkpoint not found: missing.pt"),
    ("captioning-caption", ["--checkpoint", "{notes}", "{image}"], "notes.pt is not a readable captioning checkpoint"),
    ("captioning-export", ["--checkpoint", "{notes}", "--out", "out"], "notes.pt is not a readable captioning"),
    ("captioning-html", ["--results", "r.json", "--annotations", "a.json", "--checkpoint", "{notes}"],
     "notes.pt is not a readable captioning checkpoint"),
    ("captioning-demo", ["--checkpoint", "missing.pt"], "checkpoint not found: missing.pt"),
    ("captioning-demo", ["--checkpoint", "{other}"], "other.pt is not a captioning checkpoint (expected format"),
    ("captioning-evaluate", ["checkpoint={other}"], "other.pt is not a captioning checkpoint (expected format"),
    ("captioning-caption", ["--checkpoint", "{other}", "{image}"], "other.pt is not a captioning checkpoint"),
]


@pytest.mark.parametrize("script, args, message", CHECKPOINTS, ids=[f"{s} {' '.join(a)}" for s, a, _ in CHECKPOINTS])
def test_a_missing_or_foreign_checkpoint_is_refused_without_torch(script, args, message, tmp_path):
    (tmp_path / "notes.pt").write_text("not a checkpoint")
    torch.save({"model": {"weight": torch.zeros(2)}, "epoch": 3}, tmp_path / "other.pt")
    Image.new("RGB", (8, 8), "red").save(tmp_path / "x.png")
    before = sorted(tmp_path.rglob("*"))
    argv = [a.format(notes=tmp_path / "notes.pt", other=tmp_path / "other.pt", image=tmp_path / "x.png")
            for a in args]
    status, out, err, heavy = start(script, *argv, cwd=tmp_path)
    assert status == 2 and message in one_error_line(err, script)
    assert heavy == [], f"{script} {' '.join(args)} imported {heavy}"
    assert sorted(tmp_path.rglob("*")) == before  # no run folder, nothing written
