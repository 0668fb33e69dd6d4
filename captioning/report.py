"""Collect the runs of a Hydra sweep into one table: `captioning-report MULTIRUN_DIR`."""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

logger = logging.getLogger(__name__)

DEFAULT_METRICS = ("Bleu_4", "CIDEr", "METEOR", "attention_correctness", "train_seconds")


@dataclass
class Run:
    """One run folder of a sweep: its overrides and, if it finished, its metrics."""

    path: Path
    overrides: dict[str, str]
    metrics: dict[str, object] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return bool(self.metrics)


def _overrides(run_dir: Path) -> dict[str, str]:
    file = run_dir / ".hydra" / "overrides.yaml"
    if not file.is_file():
        return {}
    items = yaml.safe_load(file.read_text()) or []
    return dict(item.split("=", 1) for item in items if "=" in item)


def collect_runs(sweep_dir: str | Path) -> list[Run]:
    """Every run folder under a sweep directory (those with a .hydra/ folder), finished or not."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep folder not found: {sweep_dir}")
    runs = []
    for hydra_dir in sorted(sweep_dir.rglob(".hydra"), key=lambda p: str(p)):
        run_dir = hydra_dir.parent
        metrics_file = run_dir / "metrics.json"
        metrics = {}
        if metrics_file.is_file():
            try:
                metrics = json.loads(metrics_file.read_text())
            except json.JSONDecodeError:
                logger.warning("%s is not valid JSON; the run is listed as unfinished", metrics_file)
        runs.append(Run(run_dir, _overrides(run_dir), metrics))
    if not runs:
        raise ValueError(f"no Hydra runs (folders with .hydra/) under {sweep_dir}")
    return runs


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
    return "" if value is None else str(value)


def table_rows(runs: Sequence[Run], metrics: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one column per swept override, then one per metric, then the run folder."""
    keys = sorted({k for r in runs for k in r.overrides})
    header = [*keys, *metrics, "run"]
    rows = [[r.overrides.get(k, "") for k in keys] + [_fmt(r.metrics.get(m)) if r.finished else "failed/unfinished"
                                                      if i == 0 else "" for i, m in enumerate(metrics)]
            + [str(r.path)] for r in runs]
    return header, rows


def to_markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def to_csv(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The same table as CSV."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: print the Markdown table; optionally write Markdown and CSV files."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sweep_dir", help="a Hydra multirun folder, e.g. multirun/2026-01-01/12-00-00")
    parser.add_argument("--metrics", default=",".join(DEFAULT_METRICS), help="comma-separated metrics.json keys")
    parser.add_argument("--out", help="write the Markdown table here (and a .csv beside it)")
    args = parser.parse_args(argv)
    runs = collect_runs(args.sweep_dir)
    header, rows = table_rows(runs, [m for m in args.metrics.split(",") if m])
    markdown = to_markdown(header, rows)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(markdown)
        out.with_suffix(".csv").write_text(to_csv(header, rows))
    print(markdown, end="")
    failed = [r for r in runs if not r.finished]
    if failed:
        print(f"\n{len(failed)} of {len(runs)} runs have no metrics.json (failed or unfinished): "
              + ", ".join(str(r.path) for r in failed))


if __name__ == "__main__":
    main()
