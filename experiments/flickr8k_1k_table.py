"""The three-seed table of experiments/flickr8k_1k_compare.sh: each model's test scores (the 125 photos, beam 3) as the
mean and sample standard deviation over its seeds, with how varied its captions are and how many hold <unk>.

    python experiments/flickr8k_1k_table.py outputs/flickr8k_1k_compare
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

METRICS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "distinct_captions")
MODELS = ("soft", "hard", "mean", "updown")


def runs(folder: Path) -> dict[str, list[Path]]:
    """model -> its finished run folders (<model>-seed<k>/ with metrics.json)."""
    out: dict[str, list[Path]] = {}
    for run in sorted(folder.glob("*-seed*")):
        if (run / "metrics.json").is_file():
            out.setdefault(run.name.split("-seed")[0], []).append(run)
    return out


def row(folders: list[Path]) -> dict[str, str]:
    """Mean ± standard deviation of each metric, <unk> captions, epochs and training seconds over the seeds."""
    metrics = [json.loads((f / "metrics.json").read_text()) for f in folders]
    unk = [sum("<unk>" in r["caption"].split() for r in json.loads((f / "results.json").read_text())) for f in folders]
    cells = {}
    for key in (*METRICS, "unk", "best_epoch", "train_seconds"):
        values = unk if key == "unk" else [float(m[key]) for m in metrics]
        mean = statistics.fmean(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        digits = 3 if key in METRICS else 1
        cells[key] = f"{mean:.{digits}f} ± {sd:.{digits}f}"
    cells["seeds"] = str(len(folders))
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    found = runs(args.folder)
    keys = ("seeds", *METRICS, "unk", "best_epoch", "train_seconds")
    print("| model | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for model in [m for m in MODELS if m in found] + [m for m in found if m not in MODELS]:
        cells = row(found[model])
        print(f"| {model} | " + " | ".join(cells[k] for k in keys) + " |")


if __name__ == "__main__":
    main()
