"""Training curves of a run (curves.png): loss, validation CIDEr and BLEU-4 by epoch, from its history.json, and for
self-critical training (objective=scst) the training reward: the sampled captions' mean reward, its baseline and
the greedy captions' CIDEr-D.

The loss panel draws `loss` (what was minimised) and `nll` (its cross-entropy part); where they are the same series
(cross-entropy with no extra terms, e.g. no attention regularisation) it draws one line, labelled SAME_LOSS_LABEL.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from captioning.base.files import atomic_file
from captioning.base.jsonio import load_json

if TYPE_CHECKING:  # matplotlib is imported where the curves are drawn
    from matplotlib.figure import Figure

logger = logging.getLogger(__name__)
CURVES_NAME = "curves.png"
CURVE_PANELS = (("training loss", ("loss", "nll")), ("validation CIDEr", ("val_CIDEr",)),
                ("validation BLEU-4", ("val_Bleu_4",)),
                ("SCST reward (training)", ("reward", "reward_baseline", "greedy_CIDEr")))
SAME_LOSS_LABEL = "loss (= nll: no extra loss terms)"
Points = list[tuple[int, float]]


def load_history(path: Path) -> list[dict[str, Any]]:
    """history.json of a training run: a non-empty list of per-epoch dicts, each with an 'epoch'."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"history file not found: {path}")
    history = load_json(path)
    if not isinstance(history, list) or not history or not all(isinstance(h, dict) and "epoch" in h for h in history):
        raise ValueError(f"{path}: expected a non-empty list of per-epoch records with an 'epoch' key")
    return history


def _points(history: Sequence[Mapping[str, Any]], key: str) -> Points:
    """(epoch, value) of every record with a numeric `key`."""
    return [(h["epoch"], float(h[key])) for h in history if isinstance(h.get(key), (int, float))]


def panel_lines(history: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> list[tuple[str, Points]]:
    """(label, points) of each line of a panel: one per key, but `loss` and `nll` as one line when they are the same
    series (same epochs, np.allclose values), so neither hides the other."""
    lines = [(key, _points(history, key)) for key in keys]
    series = dict(lines)
    loss, nll = series.get("loss"), series.get("nll")
    if loss and nll and [e for e, _ in loss] == [e for e, _ in nll] and np.allclose([v for _, v in loss],
                                                                                    [v for _, v in nll]):
        lines = [(SAME_LOSS_LABEL, loss) if key == "loss" else (key, pts) for key, pts in lines if key != "nll"]
    return lines


def curves_figure(history: Sequence[Mapping[str, Any]]) -> Figure:
    """One panel per curve group present in the history (loss, validation CIDEr, validation BLEU-4, SCST reward)
    by epoch."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    panels = [(title, [k for k in keys if any(isinstance(h.get(k), (int, float)) for h in history)])
              for title, keys in CURVE_PANELS]
    panels = [(title, keys) for title, keys in panels if keys]
    if not panels:
        raise ValueError("the history has none of " + ", ".join(k for _, keys in CURVE_PANELS for k in keys))
    fig = Figure(figsize=(4.2 * len(panels), 3.2), dpi=100)
    FigureCanvasAgg(fig)
    for ax, (title, keys) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        for label, pts in panel_lines(history, keys):
            ax.plot([e for e, _ in pts], [v for _, v in pts], marker="o", markersize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_history(history_path: Path, out_path: Path) -> Path:
    """Draw curves.png (atomically) from a run's history.json; returns the PNG's path."""
    fig = curves_figure(load_history(history_path))
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_file(out_path) as f:
            fig.savefig(f, format="png")
    finally:
        fig.clear()
    logger.info("wrote training curves to %s", out_path)
    return out_path
