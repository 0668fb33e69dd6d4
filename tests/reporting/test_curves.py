"""Training curves from history.json (values of the plotted lines, the PNG) and their place in a run's outputs."""

from __future__ import annotations

import json
import math
import re

import pytest
from fixtures import compose_tiny_train
from PIL import Image
from test_html_report import _items

from captioning.reporting.curves import SAME_LOSS_LABEL, curves_figure, load_history, panel_lines, plot_history
from captioning.reporting.html import render_report, write_report
from captioning.train import train

HISTORY = [{"epoch": e, "step": 10 * e, "loss": 4.0 / e, "nll": 3.5 / e, "token_nll": 1.0, "attention_reg": 0.1,
            "val_Bleu_4": 0.05 * e, "val_CIDEr": 0.2 * e} for e in range(1, 5)]


def _lines(ax) -> dict[str, tuple[list[float], list[float]]]:
    return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()}


def _legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_curves_plot_every_epoch_of_loss_cider_and_bleu():
    fig = curves_figure(HISTORY)
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == ["training loss", "validation CIDEr", "validation BLEU-4"]
    assert all(ax.get_xlabel() == "epoch" for ax in axes)
    epochs = [1, 2, 3, 4]
    assert _lines(axes[0]) == {"loss": (epochs, [4.0, 2.0, 4 / 3, 1.0]), "nll": (epochs, [3.5, 1.75, 3.5 / 3, 0.875])}
    assert _lines(axes[1]) == {"val_CIDEr": (epochs, pytest.approx([0.2, 0.4, 0.6, 0.8]))}
    assert _lines(axes[2]) == {"val_Bleu_4": (epochs, pytest.approx([0.05, 0.1, 0.15, 0.2]))}


def test_loss_and_nll_that_are_the_same_series_are_one_line():
    """Cross-entropy with no extra terms: loss == nll every epoch; one line says so instead of two drawn on top of
    each other (the legend has that one entry); values equal to float noise count as the same."""
    history = [{"epoch": e, "loss": 3.0 / e, "nll": 3.0 / e + 1e-12, "val_CIDEr": 0.1 * e} for e in (1, 2, 3)]
    loss_ax = curves_figure(history).get_axes()[0]
    assert _lines(loss_ax) == {SAME_LOSS_LABEL: ([1, 2, 3], [3.0, 1.5, 1.0])}
    assert _legend(loss_ax) == ["loss (= nll: no extra loss terms)"]
    # different series (an attention or entropy term): both lines, both in the legend
    assert _legend(curves_figure(HISTORY).get_axes()[0]) == ["loss", "nll"]
    # the same values at different epochs, or a single differing epoch, are two series
    assert [label for label, _ in panel_lines([{"epoch": 1, "loss": 1.0}, {"epoch": 2, "nll": 1.0}],
                                              ["loss", "nll"])] == ["loss", "nll"]
    history[1]["loss"] = 1.6
    assert [label for label, _ in panel_lines(history, ["loss", "nll"])] == ["loss", "nll"]


def test_curves_skip_what_the_history_lacks():
    history = [{"epoch": 1, "loss": 2.0}, {"epoch": 2, "loss": 1.5, "val_CIDEr": 0.3}, {"epoch": 3, "loss": 1.0}]
    axes = curves_figure(history).get_axes()
    assert [ax.get_title() for ax in axes] == ["training loss", "validation CIDEr"]
    assert _lines(axes[0]) == {"loss": ([1, 2, 3], [2.0, 1.5, 1.0])}
    assert _lines(axes[1]) == {"val_CIDEr": ([2], [0.3])}
    with pytest.raises(ValueError, match="the history has none of loss"):
        curves_figure([{"epoch": 1, "lr": 0.1}])


def test_plot_history_writes_the_png(tmp_path):
    (tmp_path / "history.json").write_text(json.dumps(HISTORY))
    out = plot_history(tmp_path / "history.json", tmp_path / "sub" / "curves.png")
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size == (3 * 420, 320)  # three 4.2 x 3.2 in panels at 100 dpi


@pytest.mark.parametrize("text,match", [("[]", "non-empty list"), ('{"epoch": 1}', "non-empty list"),
                                         ('[{"loss": 1}]', "'epoch' key"), ("[{", "not valid JSON")])
def test_bad_history_files_are_refused_naming_the_file(tmp_path, text, match):
    (tmp_path / "history.json").write_text(text)
    with pytest.raises(ValueError, match=match) as exc:
        load_history(tmp_path / "history.json")
    assert "history.json" in str(exc.value)
    with pytest.raises(FileNotFoundError, match="history file not found"):
        load_history(tmp_path / "missing.json")


def test_report_embeds_the_curves_when_present(tmp_path):
    assert 'id="curves"' not in render_report(_items(), {}, curves=tmp_path / "curves.png")  # absent: no section
    (tmp_path / "history.json").write_text(json.dumps(HISTORY))
    png = plot_history(tmp_path / "history.json", tmp_path / "curves.png")
    page = write_report(tmp_path / "report.html", _items(), {}, curves=png).read_text()
    assert page.index('id="overall"') < page.index('id="curves"') < page.index('id="images"')
    assert len(re.findall(r'<img src="data:image/png;base64,[A-Za-z0-9+/=]+" alt="training curves">', page)) == 1


def test_training_run_writes_curves_and_report(shapes_json, tmp_path):
    # eval.collapse_share=0: any caption is "given for more than 0 of the images", so every validation and the
    # test say the collapse line, and its text travels through history.json, TensorBoard and the page
    cfg = compose_tiny_train(shapes_json, "eval.num_figures=0", "trainer.max_epochs=2", "eval.collapse_share=0")
    train(cfg, tmp_path)
    history = json.loads((tmp_path / "history.json").read_text())
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert all(isinstance(h["val_collapsed_caption"], str) for h in history)
    assert isinstance(metrics["collapsed_caption"], str) and 0 < metrics["top_caption_share"] <= 1
    # the run's curves.png is drawn from this figure: cross-entropy with the default attention_weight 0 has loss == nll
    assert all(h["loss"] == pytest.approx(h["nll"]) for h in history)
    assert _legend(curves_figure(history).get_axes()[0]) == [SAME_LOSS_LABEL]
    lines = _lines(curves_figure(history).get_axes()[1])
    assert lines["val_CIDEr"][0] == [1, 2] and all(math.isfinite(v) for v in lines["val_CIDEr"][1])
    assert (tmp_path / "curves.png").is_file()
    page = (tmp_path / "report.html").read_text()
    assert len(re.findall(r'<tr class="entry"', page)) == 12 and 'alt="training curves"' in page
    assert page.count('<p class="collapse">') == 1
    assert (tmp_path / "attention.npz").is_file()


def test_self_critical_runs_get_a_reward_panel():
    history = [{**h, "reward": 1.0 + 0.1 * h["epoch"], "reward_baseline": 1.0 + 0.1 * h["epoch"],
                "greedy_CIDEr": 1.2 + 0.1 * h["epoch"], "sample_CIDEr": 1.0} for h in HISTORY]
    axes = curves_figure(history).get_axes()
    assert [ax.get_title() for ax in axes][-1] == "SCST reward (training)"
    epochs = [1, 2, 3, 4]
    assert _lines(axes[-1]) == {"reward": (epochs, pytest.approx([1.1, 1.2, 1.3, 1.4])),
                                "reward_baseline": (epochs, pytest.approx([1.1, 1.2, 1.3, 1.4])),
                                "greedy_CIDEr": (epochs, pytest.approx([1.3, 1.4, 1.5, 1.6]))}
    assert len(curves_figure(HISTORY).get_axes()) == 3  # cross-entropy runs: no reward panel
