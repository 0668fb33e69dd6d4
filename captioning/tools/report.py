"""Collect the runs of a Hydra sweep into one table and a plot: `captioning-report MULTIRUN_DIR`.

The table has one column per swept override (one that varies; those every run shares are listed under it)
and one per metric (Markdown and CSV, the same cells: scores with 4 decimals, seconds with 1, counts
as integers); the plot shows a chosen metric against each swept parameter.
Runs without metrics.json (failed, still running, killed) are listed, never fatal.

example: captioning-report multirun/2026-01-01/12-00-00 --out sweep/report.md --plot-metric CIDEr
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from captioning.base.files import write_text_atomic
from captioning.base.messages import printable
from captioning.cli import ArgumentParser, run_cli, writable_file
from captioning.reporting.sweep import (
    DEFAULT_METRICS,
    Run,
    collect_runs,
    plot_sweep,
    shared_overrides,
    swept_params,
    table_rows,
    to_csv,
    to_markdown,
)

PROG = "captioning-report"


def report(sweep_dir: str | Path, metrics: Sequence[str] = DEFAULT_METRICS, out: str | Path | None = None,
           plot: str | Path | None = None, plot_metric: str = "CIDEr", all_overrides: bool = False) -> list[Run]:
    """Print the Markdown table of a sweep; write it (Markdown and CSV) to `out` and the plot to `plot` if given."""
    out = Path(out) if out else None
    plot = Path(plot) if plot else (out.with_suffix(".png") if out else None)
    for path in (out, out.with_suffix(".csv") if out else None, plot):
        if path is not None:
            writable_file(path)  # a read-only output fails before the runs are read
    runs = collect_runs(sweep_dir)
    header, rows = table_rows(runs, list(metrics), all_overrides)
    markdown = to_markdown(header, rows)
    shared = {} if all_overrides else shared_overrides(runs)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, markdown)
        write_text_atomic(out.with_suffix(".csv"), to_csv(header, rows))
    print(markdown, end="")
    if shared:
        print("\nsame in every run: " + printable(" ".join(f"{k}={v}" for k, v in shared.items())))
    if plot:
        written = plot_sweep(runs, plot_metric, plot)
        print("\n" + printable(f"plot of {plot_metric} against {', '.join(swept_params(runs))}: {written}") if written
              else f"\nno plot: no finished run reports {plot_metric}")
    failed = [r for r in runs if not r.finished]
    if failed:
        print(f"\n{len(failed)} of {len(runs)} runs have no metrics.json (failed or unfinished):")
        print("\n".join(printable(f"- {r.path}: {r.status}") for r in failed))
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: print the Markdown table; optionally write Markdown, CSV and a plot; exit status."""
    parser = ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", help="a Hydra multirun folder, e.g. multirun/2026-01-01/12-00-00")
    parser.add_argument("--metrics", default=",".join(DEFAULT_METRICS), help="comma-separated metrics.json keys")
    parser.add_argument("--out", help="write the Markdown table here (and a .csv and .png beside it)")
    parser.add_argument("--plot", help="write the plot here (default: beside --out, as .png)")
    parser.add_argument("--plot-metric", default="CIDEr", help="the metric plotted against each swept parameter")
    parser.add_argument("--all-overrides", action="store_true", help="also tabulate overrides every run shares")
    args = parser.parse_args(argv)
    metrics = [m for m in args.metrics.split(",") if m]
    run_cli(lambda: report(args.sweep_dir, metrics, args.out, args.plot, args.plot_metric, args.all_overrides), PROG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
