"""Words and labels from data are drawn as the text they are: a caption word or override value like `$\\foo$` neither
aborts the figure (matplotlib's mathtext) nor is typeset (issue 29, item 6)."""

from __future__ import annotations

import json

import numpy as np
from matplotlib.figure import Figure
from matplotlib.image import imread
from matplotlib.text import Text
from PIL import Image

from captioning.reporting.figures import attention_figure, plot_attention
from captioning.reporting.sweep import collect_runs, plot_sweep

WORDS = ["$\\undefinedmacro$", "a_b^c", "50$", "$x$ and $y$", "\\alpha"]


def _shown(fig) -> list[str]:
    """The panels' titles (the Text artists that show the caption and its words), each drawn as plain text (no
    mathtext, no TeX); the figure shows no other text (its axes are off)."""
    titles: list[Text] = [ax.title for ax in fig.axes]
    assert all(not t.get_parse_math() and not t.get_usetex() for t in titles)
    assert all(not ax.axison for ax in fig.axes)
    return [t.get_text() for t in titles]


def test_the_attention_figure_shows_every_word_exactly(tmp_path):
    alphas = np.random.default_rng(0).random((len(WORDS), 7, 7))
    image = Image.new("RGB", (64, 48), (90, 140, 60))
    fig = attention_figure(image, WORDS, alphas)
    fig.canvas.draw()  # what saving does: mathtext would raise here
    shown = _shown(fig)
    assert shown[0].split() == " ".join(WORDS).split() and shown[1:] == WORDS  # the caption wraps
    out = plot_attention(image, WORDS, alphas, tmp_path / "att.png")
    assert imread(out).shape[1] > 300


def test_the_sweep_plot_shows_override_names_and_values_exactly(tmp_path, monkeypatch):
    for n, value in enumerate(WORDS):
        run = tmp_path / str(n)
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(json.dumps([f"$\\bad_{{x}}$={value}"]))
        (run / "metrics.json").write_text(json.dumps({"CIDEr": 0.1 * n}))
    saved = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), save(fig, *a, **k))[1])
    out = plot_sweep(collect_runs(tmp_path), "CIDEr", tmp_path / "sweep.png")
    assert out is not None and imread(out).shape[0] > 100
    (ax,) = saved[0].axes
    assert [t.get_text() for t in ax.get_xticklabels()] == WORDS  # as drawn: the categorical ticks
    assert all(not t.get_parse_math() and not t.get_usetex() for t in ax.get_xticklabels())
    assert ax.get_xlabel() == "$\\bad_{x}$" and not ax.xaxis.label.get_parse_math()
