"""Benchmark: the "memory bomb" checkpoint (a trained best.pt with one number of its stored config changed,
`model.decoder.hidden_dim` = 10,000,000, every weight as saved) through every entry point that reads a
checkpoint, as a user runs them: each command in its own process, its exit status, its last stderr line, its
wall time and its peak memory (maximum resident set size). For scale, the same figures for a process that only
imports the loader, and the loader's own time on the bomb and on the good file.

    PYTHONPATH=$PWD .venv/bin/python experiments/bench_checkpoint_bomb.py outputs/<run>/checkpoints/best.pt

Each command runs under a 16 GiB address-space limit, so a loader that did try to build the bomb's model fails
there instead of swapping.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

from captioning.data.readers.karpathy import read_karpathy

BOMB_HIDDEN = 10_000_000
LIMIT = 16 << 30
IMPORT_ONLY = "import captioning.factory.load"
LOAD = """
import sys, time
from captioning.factory.load import load_model
for path in sys.argv[1:]:
    start = time.perf_counter()
    try:
        load_model(path)
        outcome = "loaded"
    except ValueError as err:
        outcome = "refused"
    print(f"load_model({path.rsplit('/', 1)[-1]}): {outcome} in {time.perf_counter() - start:.3f} s")
"""


def run(label: str, cmd: list[str], cwd: Path) -> None:
    """Run one command in its own process; print exit status, wall time, peak memory and its last stderr line."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=limit, env={**os.environ, "HYDRA_FULL_ERROR": "0"})
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    lines = [line for line in (err + out).splitlines() if line.strip()]
    print(f"{label:<34} exit {os.waitstatus_to_exitcode(status):>3}  {seconds:5.2f} s  "
          f"{usage.ru_maxrss / 1024:6.0f} MB  {lines[-1][:150] if lines else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a trained run's best.pt")
    args = parser.parse_args()
    good = args.checkpoint.resolve()
    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        ckpt = torch.load(good, weights_only=True)
        ckpt["config"]["model"]["decoder"]["hidden_dim"] = BOMB_HIDDEN
        bomb = tmp / "bomb.pt"
        torch.save(ckpt, bomb)
        Image.new("RGB", (64, 64), "white").save(tmp / "x.png")
        results = tmp / "results.json"
        annotations = ckpt["config"]["dataset"]["annotations"]
        image_id = read_karpathy(annotations, "test")[0].image_id
        results.write_text(json.dumps([{"image_id": image_id, "caption": "a square"}]))
        print(f"good {good} ({good.stat().st_size / 1e6:.1f} MB); bomb {bomb.stat().st_size / 1e6:.1f} MB, "
              f"decoder.hidden_dim {BOMB_HIDDEN:,}")
        run("python: import the loader only", [sys.executable, "-c", IMPORT_ONLY], tmp)
        run("python: load_model(good), (bomb)", [sys.executable, "-c", LOAD, str(good), str(bomb)], tmp)
        subprocess.run([sys.executable, "-c", LOAD, str(good), str(bomb)], cwd=tmp, check=False)
        run("captioning.load (API, notebook)", [sys.executable, "-c", f"import captioning; captioning.load("
                                                f"{str(bomb)!r}, device='cpu')"], tmp)
        commands = {
            "captioning-caption": ["x.png", "--checkpoint", str(bomb)],
            "captioning-evaluate": [f"checkpoint={bomb}", "hydra.run.dir=eval"],
            "captioning-html --checkpoint": ["--results", str(results), "--checkpoint", str(bomb),
                                             "--annotations", annotations],
            "captioning-export": ["--checkpoint", str(bomb), "--out", "export"],
            "captioning-demo": ["--checkpoint", str(bomb), "--port", "0"],
            "captioning-train resume=": [f"resume={bomb}", "hydra.run.dir=run1"],
            "captioning-train init_from=": [f"init_from={bomb}", "hydra.run.dir=run2"],
        }
        for label, extra in commands.items():
            name = label.split()[0]
            run(label, [str(bin_dir / name), *extra], tmp)


if __name__ == "__main__":
    main()
