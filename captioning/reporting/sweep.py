"""The runs of a Hydra sweep as one table and a plot (what `captioning-report MULTIRUN_DIR` shows).

The table has one column per swept override (one that varies; those every run shares are listed under it)
and one per metric (Markdown and CSV, the same cells: scores with 4 decimals, seconds with 1, counts
as integers); the plot shows a chosen metric against each swept parameter.
Runs without metrics.json (failed, still running, killed) are listed, never fatal.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from captioning.base.files import atomic_file
from captioning.base.messages import one_line
from captioning.reporting.figures import PLAIN_TEXT
from captioning.reporting.numbers import format_metric

logger = logging.getLogger(__name__)

DEFAULT_METRICS = ("Bleu_4", "CIDEr", "METEOR", "attention_correctness", "val_CIDEr", "train_seconds")


@dataclass
class Run:
    """One run folder of a sweep: its overrides and, if it finished, its metrics."""

    path: Path
    overrides: dict[str, str]
    metrics: dict[str, Any] = field(default_factory=dict)  # metrics.json: numbers, strings, lists

    @property
    def finished(self) -> bool:
        return bool(self.metrics)

    @property
    def status(self) -> str:
        """'finished', or how far an unfinished run got (epochs in history.json) for the failure list."""
        if self.finished:
            return "finished"
        try:
            epochs = len(json.loads((self.path / "history.json").read_text()))
        except (OSError, ValueError, TypeError):
            epochs = 0
        return f"no metrics.json after {epochs} epoch{'s' * (epochs != 1)}"


def _overrides(run_dir: Path) -> dict[str, str]:
    file = run_dir / ".hydra" / "overrides.yaml"
    if not file.is_file():
        return {}
    try:
        items = yaml.safe_load(file.read_text(encoding="utf-8")) or []
    except (OSError, ValueError, yaml.YAMLError) as err:
        logger.warning("%s is unreadable (%s); the run is listed without its overrides", file, one_line(err))
        return {}
    if not isinstance(items, list):
        logger.warning("%s is not a list of overrides; the run is listed without them", file)
        return {}
    return dict(item.split("=", 1) for item in items if isinstance(item, str) and "=" in item)


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
                metrics = json.loads(metrics_file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as err:  # ValueError: invalid JSON or not UTF-8
                logger.warning("%s is unreadable (%s); the run is listed as unfinished", metrics_file, one_line(err))
            if not isinstance(metrics, dict):
                logger.warning("%s is not a JSON object of metrics; the run is listed as unfinished", metrics_file)
                metrics = {}
        runs.append(Run(run_dir, _overrides(run_dir), metrics))
    if not runs:
        raise ValueError(f"no Hydra runs (folders with .hydra/) under {sweep_dir}")
    return runs


def table_rows(runs: Sequence[Run], metrics: Sequence[str],
               all_overrides: bool = False) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one column per swept override (or per override), then one per metric, then the folder.

    Metrics are written by format_metric (as the report page writes them): every score with the same places."""
    keys = sorted({k for r in runs for k in r.overrides}) if all_overrides else swept_params(runs)
    header = [*keys, *metrics, "run"]
    def cell(r: Run, i: int, m: str) -> str:  # an unfinished run says so once, in its first metric column
        if r.finished:
            return format_metric(m, r.metrics.get(m))
        return "failed/unfinished" if i == 0 else ""

    rows = [[r.overrides.get(k, "") for k in keys] + [cell(r, i, m) for i, m in enumerate(metrics)] + [str(r.path)]
            for r in runs]
    return header, rows


def shared_overrides(runs: Sequence[Run]) -> dict[str, str]:
    """Overrides every run has with the same value (left out of the table when some other override varies)."""
    swept = set(swept_params(runs))
    keys = sorted({k for r in runs for k in r.overrides} - swept)
    return {k: runs[0].overrides[k] for k in keys if all(r.overrides.get(k) == runs[0].overrides.get(k) for r in runs)}


# Cells come from files that may be a stranger's (overrides.yaml, metrics.json): each is written so that it shows as
# the text it is. Control characters (line breaks, terminal escapes) become spaces. Markdown: a backslash or `|` would
# end the cell early, and `<`, `>`, `&` and backticks would be markup (raw HTML, entities, code spans). CSV: a cell
# a spreadsheet would run as a formula (OWASP's CSV injection: it starts with = + - @, a tab or a carriage return)
# gets a leading ' unless it is a number.
_CONTROLS = re.compile(r"\r\n|[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_MARKDOWN_ESCAPES = {"\\": "\\\\", "|": "\\|", "&": "&amp;", "<": "&lt;", ">": "&gt;", "`": "&#96;"}
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)


def flat(text: str) -> str:
    """Text on one line for a table cell or a plot label: every control character (line breaks, escapes) a space."""
    return _CONTROLS.sub(" ", text)


def markdown_cell(text: str) -> str:
    """A table cell's text for Markdown: on one line, with no markup and no cell boundary in it."""
    return "".join(_MARKDOWN_ESCAPES.get(ch, ch) for ch in flat(text))


def csv_cell(text: str) -> str:
    """A table cell's text for CSV: a number as it is; text a spreadsheet would run as a formula behind a '."""
    return "'" + text if text.startswith(_FORMULA_START) and not _NUMBER.fullmatch(text) else text


def to_markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table (every cell escaped by markdown_cell)."""
    lines = ["| " + " | ".join(map(markdown_cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(markdown_cell, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def to_csv(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The same table as CSV: the same cells as the Markdown table, numbers rounded alike (escaped by csv_cell)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(map(csv_cell, header))
    writer.writerows(map(csv_cell, row) for row in rows)
    return buf.getvalue()


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


@dataclass
class Series:
    """The chosen metric of the finished runs against one swept parameter."""

    param: str
    numeric: bool  # every value is a number: plotted as a line over sorted x; else one point per run by category
    points: Sequence[tuple[float | str, float]]  # (parameter value, metric), sorted by value when numeric


def swept_params(runs: Sequence[Run]) -> list[str]:
    """Overrides that take more than one value across the runs (all overrides if none varies)."""
    keys = sorted({k for r in runs for k in r.overrides})
    varying = [k for k in keys if len({r.overrides.get(k) for r in runs}) > 1]
    return varying or keys


def sweep_series(runs: Sequence[Run], metric: str) -> list[Series]:
    """One series per swept parameter, from the finished runs that report `metric` as a number."""
    scored = [r for r in runs if isinstance(r.metrics.get(metric), (int, float))
              and not isinstance(r.metrics.get(metric), bool) and not math.isnan(r.metrics[metric])]
    out = []
    for param in swept_params(runs):
        pairs = [(r.overrides[param], float(r.metrics[metric])) for r in scored if param in r.overrides]
        numbers = [_number(x) for x, _ in pairs]
        if pairs and all(n is not None for n in numbers):
            out.append(Series(param, True, sorted((cast(float, n), y) for n, (_, y) in zip(numbers, pairs))))
        else:
            out.append(Series(param, False, pairs))
    return out


def plot_sweep(runs: Sequence[Run], metric: str, path: str | Path) -> Path | None:
    """A PNG with one panel per swept parameter: `metric` against its values; None when nothing to plot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # here: a table needs no matplotlib
    from matplotlib.figure import Figure

    series = [s for s in sweep_series(runs, metric) if s.points]
    if not series:
        logger.warning("no finished run reports %s; no plot written", metric)
        return None
    fig = Figure(figsize=(4 * len(series), 3.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    for ax, s in zip(fig.subplots(1, len(series), squeeze=False)[0], series):
        ys = [y for _, y in s.points]
        if s.numeric:  # runs sharing a value (other parameters swept too) are averaged for the line
            xs = sorted({float(x) for x, _ in s.points})
            ax.plot(xs, [_mean([y for x, y in s.points if x == v]) for v in xs], "-", color="tab:blue")
            ax.plot([x for x, _ in s.points], ys, "o", color="tab:blue")
            if xs[0] > 0 and xs[-1] / xs[0] >= 20:  # e.g. learning rates: spread over decades
                ax.set_xscale("log")
        else:
            cats = list(dict.fromkeys(str(x) for x, _ in s.points))  # first-seen order
            ax.bar(range(len(cats)), [_mean([y for x, y in s.points if x == c]) for c in cats], color="tab:gray",
                   alpha=0.4)
            ax.plot([cats.index(str(x)) for x, _ in s.points], ys, "o", color="tab:blue")
            ax.set_xticks(range(len(cats)), [flat(c) for c in cats],
                          rotation=30 if max(map(len, cats)) > 6 else 0, **PLAIN_TEXT)
        ax.set_xlabel(flat(s.param), **PLAIN_TEXT)
        ax.set_ylabel(flat(metric), **PLAIN_TEXT)
        ax.grid(alpha=0.3)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as f:  # the format from the file's extension, PNG without one
        fig.savefig(f, format=path.suffix.lstrip(".").lower() or None)
    return path


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)
