"""The report page fits a 1280 px window: nothing in it is wider than the page (the rule, and in headless chromium)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_curves import HISTORY
from test_html_report import _items

from captioning.reporting.curves import plot_history
from captioning.reporting.html import render_report, write_report
from captioning.reporting.items import ReportItem
from captioning.reporting.page import THUMB_SIDE

WINDOW = (1280, 800)
SCROLLBAR = 16  # the widest classic scrollbar: a fixed width above WINDOW[0] - SCROLLBAR scrolls sideways
SCORES = ("Bleu_1", "Bleu_2", "Bleu_3", "METEOR", "ROUGE_L", "SPICE")  # with _items' Bleu_4 and CIDEr: all eight
# The widest metrics a page shows: every score, counts, seconds, a long results path and a per-category dict.
METRICS = {"results": "/home/someone/projects/captioning/outputs/2026-01-01/12-00-00/eval/test-beam3/results.json",
           **{m: 0.123456 for m in (*SCORES, "Bleu_4", "CIDEr")}, "attention_correctness": 0.61,
           "attention_correctness_per_category": {f"category {k}": 0.5 for k in range(40)}, "num_images": 5000,
           "train_seconds": 600.3}


def _rules(page: str) -> dict[str, dict[str, str]]:
    """The page's CSS: selector -> {property: value}."""
    css = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    return {sel.strip(): dict((k.strip(), v.strip()) for k, v in (d.split(":", 1) for d in body.split(";") if ":" in d))
            for sel, body in re.findall(r"([^{}]+)\{([^}]*)\}", css)}


def _wide_items() -> list[ReportItem]:
    items = _items()
    for it in items:
        it.scores.update({m: 0.123456 for m in SCORES})
    return items


def _curves(tmp_path: Path) -> Path:
    """curves.png of a self-critical run: four panels, 1680 px wide."""
    history = [{**h, "reward": 1.0, "reward_baseline": 0.9, "greedy_CIDEr": 1.1} for h in HISTORY]
    (tmp_path / "history.json").write_text(json.dumps(history))
    return plot_history(tmp_path / "history.json", tmp_path / "curves.png")


def test_the_css_keeps_everything_within_the_window(tmp_path):
    page = render_report(_wide_items(), METRICS, curves=_curves(tmp_path))
    rules = _rules(page)
    # the training curves (420 px a panel) shrink to the page's width, keeping their aspect ratio
    assert rules["#curves img"] == {"max-width": "100%", "height": "auto"}
    assert 'alt="training curves"' in page and "#curves" in page
    # long overall values (a results path) wrap instead of widening the page
    assert rules["table.overall td"]["overflow-wrap"] == "anywhere"
    # no fixed width of the window or wider: no 100vw (it includes the scrollbar), no px width beyond the window
    css = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    assert "vw" not in css
    widths = [int(w) for w in re.findall(r"(?:^|[^-])width:\s*(\d+)px", css + " ".join(re.findall(r'style="([^"]*)"',
                                                                                                   page)))]
    assert widths and max(widths) <= THUMB_SIDE < WINDOW[0] - SCROLLBAR


@pytest.mark.integration
def test_the_page_has_no_horizontal_scrollbar_in_a_1280_px_window(browser, tmp_path):
    path = write_report(tmp_path / "report.html", _wide_items(), METRICS, curves=_curves(tmp_path))
    browser.set_window_size(*WINDOW)
    try:
        browser.get(path.as_uri())
        size = browser.execute_script(
            "const e = document.documentElement, img = document.querySelector('#curves img');"
            "return {inner: window.innerWidth, client: e.clientWidth, scroll: e.scrollWidth,"
            " img: [img.naturalWidth, img.naturalHeight, img.clientWidth, img.clientHeight]};")
    finally:
        browser.set_window_size(1400, 1000)  # the module's browser as conftest made it
    assert size["inner"] == WINDOW[0]
    assert size["scroll"] <= size["client"] <= WINDOW[0]  # no horizontal scrollbar
    natural_w, natural_h, shown_w, shown_h = size["img"]
    assert natural_w == 1680 and shown_w < size["client"]  # the curves shrunk to the page, aspect kept
    assert shown_h == pytest.approx(shown_w * natural_h / natural_w, abs=1)
