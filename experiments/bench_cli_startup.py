"""Benchmark: how long each console command takes to answer when it has no work to do.

For every command of pyproject.toml's [project.scripts], the real console script in the virtualenv's bin/ folder
(next to this Python) is run as a fresh process, --runs times each (median wall seconds, from start to exit), for

* `--help`;
* a mistake the command refuses before any work: a misspelt override (`decoder.dropuot=0.2`, the Hydra apps and
  captioning-prepare), or a file that is not there (a checkpoint, a results file, a sweep or export folder);
* a refused checkpoint (other.pt: a file torch.save wrote for another tool, a dict without this project's
  format), for the commands that take one.

Each row also gives the exit status of the last run (0 for --help, 2 for an error) and, for the errors, the first
words of the `PROG: error:` line, so a row that measured the wrong thing shows it. Everything runs in a temporary
folder (its cwd), so nothing is left behind. Timings on a shared machine are rough: compare rows of one run.

    .venv/bin/python experiments/bench_cli_startup.py             # 5 runs each
    .venv/bin/python experiments/bench_cli_startup.py --runs 1 captioning-train captioning-caption   # a check
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

BIN = Path(sys.executable).parent
# command -> (a mistake refused before any work, a refused checkpoint or None); {tmp} is the working folder
CASES: dict[str, tuple[list[str], list[str] | None]] = {
    "captioning-train": (["decoder.dropuot=0.2"], ["init_from={tmp}/other.pt"]),
    "captioning-evaluate": (["checkpoint=missing.pt"], ["checkpoint={tmp}/other.pt"]),
    "captioning-report": (["missing_sweep"], None),
    "captioning-score": (["--annotations", "missing.json", "--results", "missing.json"], None),
    "captioning-caption": (["--checkpoint", "missing.pt", "{tmp}/img.png"],
                           ["--checkpoint", "{tmp}/other.pt", "{tmp}/img.png"]),
    "captioning-html": (["--results", "missing.json", "--annotations", "missing.json"],
                        ["--results", "{tmp}/r.json", "--annotations", "{tmp}/a.json", "--checkpoint",
                         "{tmp}/other.pt"]),
    "captioning-extract-features": (["decoder.dropuot=0.2"], None),
    "captioning-prepare": (["dataset.min_wrd_freq=2"], None),
    "captioning-export": (["--checkpoint", "missing.pt", "--out", "{tmp}/out"],
                          ["--checkpoint", "{tmp}/other.pt", "--out", "{tmp}/out"]),
    "captioning-run-export": (["missing_export", "{tmp}/img.png"], None),
    "captioning-demo": (["--checkpoint", "missing.pt"], ["--checkpoint", "{tmp}/other.pt"]),
}


def timed(script: str, args: list[str], cwd: Path, runs: int) -> tuple[float, int, str]:
    """Median wall seconds of `runs` runs of the console script; the last run's exit status and stderr line."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    seconds, proc = [], None
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run([str(BIN / script), *(a.format(tmp=cwd) for a in args)], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        seconds.append(time.perf_counter() - start)
    assert proc is not None
    lines = proc.stderr.strip().splitlines()
    said = lines[-1].split(": error: ", 1)[-1][:48] if proc.returncode and lines else ""
    return statistics.median(seconds), proc.returncode, said


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commands", nargs="*", default=list(CASES), help="console scripts (default: all)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each case (median)")
    args = parser.parse_args()
    print(f"median wall seconds of {args.runs} runs; exit status in brackets", flush=True)
    print("| command | --help | mistake | refused checkpoint | what the mistake's error said |")
    print("|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        import torch  # this process only: the commands are timed in their own

        torch.save({"model": {"weight": torch.zeros(2)}, "epoch": 3}, tmp / "other.pt")
        Image.new("RGB", (32, 32), "red").save(tmp / "img.png")
        for script in args.commands:
            mistake, refused = CASES[script]
            cells, said = [], ""
            for case in (["--help"], mistake, refused):
                if case is None:
                    cells.append("-")
                    continue
                seconds, status, text = timed(script, case, tmp, args.runs)
                cells.append(f"{seconds:.2f} [{status}]")
                said = said or text
            print(f"| {script} | {' | '.join(cells)} | {said} |", flush=True)


if __name__ == "__main__":
    main()
