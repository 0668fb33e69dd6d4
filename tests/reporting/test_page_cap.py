"""The report page shows at most --max-entries rows (default MAX_ENTRIES, the first ones in result order), says
"showing N of M" and warns in one line how to show the rest; the overall metrics still cover every result
(issue 29, item 9)."""

from __future__ import annotations

import json
import logging
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from captioning.reporting.html import MAX_ENTRIES, load_attention, save_attention, write_prediction_report
from captioning.reporting.items import Prediction, ReportItem
from captioning.tools.html import main

WORDS = ["a", "red", "square", "left", "of", "a", "blue", "circle"]


def _files(tmp_path, n: int, attention: bool = False) -> list[str]:
    """A COCO caption file and a results file of n images (ids 1..n), and an attention file if asked: the
    command line of captioning-html for them."""
    captions = [" ".join(WORDS[: 3 + i % 5]) for i in range(n)]
    (tmp_path / "captions.json").write_text(json.dumps({"images": [], "annotations": [
        {"image_id": i + 1, "id": i + 1, "caption": "a red square"} for i in range(n)]}))
    (tmp_path / "results.json").write_text(json.dumps([{"image_id": i + 1, "caption": c}
                                                       for i, c in enumerate(captions)]))
    argv = ["--results", str(tmp_path / "results.json"), "--annotations", str(tmp_path / "captions.json"),
            "--metrics", "bleu", "--tokenizer", "python", "--out", str(tmp_path / "report.html")]
    if attention:
        rng = np.random.default_rng(0)
        save_attention(tmp_path / "attention.npz", [ReportItem(i + 1, c.split(), [], alphas=rng.random(
            (len(c.split()), 3, 3))) for i, c in enumerate(captions)])
        argv += ["--attention", str(tmp_path / "attention.npz")]
    return argv


def _data_entries(page: str) -> list:
    return json.loads(re.search(r'id="report-data">(.*?)</script>', page, re.S).group(1))["entries"]


def test_a_capped_page_shows_the_first_n_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert main([*_files(tmp_path, 5000, attention=True), "--max-entries", "100"]) == 0
    page = (tmp_path / "report.html").read_text()
    ids = re.findall(r'<tr class="entry" data-entry="\d+" data-image-id="(\d+)"', page)
    assert ids == [str(i) for i in range(1, 101)]  # the first 100, in result order
    assert len(_data_entries(page)) == 100 and page.count("<canvas") == 100  # maps of those rows only
    assert '<span id="count">100</span>' in page
    assert "Showing 100 of 5000 images: the first 100 in result order (4900 left out)" in page
    assert "<th>num_images</th><td>5000</td>" in page  # the overall metrics cover every result
    assert len(page) < 150_000  # all 5000 rows make a page over 40 times bigger
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"{tmp_path / 'report.html'}: showing 100 of 5000 images: the first 100 in result order "
                        "(4900 left out); captioning-html --max-entries 0 (or a larger number) writes a page with "
                        "them all"]


def test_max_entries_0_shows_every_row_and_the_default_run_is_unchanged(tmp_path, caplog):
    assert MAX_ENTRIES == 2000
    with caplog.at_level(logging.WARNING):
        assert main(_files(tmp_path, 250)) == 0  # the default run's test split: 250 images
    page = (tmp_path / "report.html").read_text()
    assert len(re.findall(r'<tr class="entry"', page)) == 250 and '<span id="count">250</span>' in page
    assert "Showing" not in page and not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert main([*_files(tmp_path, 2500), "--max-entries", "0"]) == 0
    assert len(re.findall(r'<tr class="entry"', (tmp_path / "report.html").read_text())) == 2500


def test_a_negative_cap_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*_files(tmp_path, 3), "--max-entries", "-1"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "captioning-html: error: --max-entries must be >= 0 (0: every image), got -1\n"


def test_evaluations_page_is_capped_too_and_its_attention_file_keeps_every_image(tmp_path, caplog):
    rng = np.random.default_rng(1)
    preds = [Prediction(i, 100 + i, ["a", "square"], torch.from_numpy(rng.random((2, 2, 2)))) for i in range(5)]
    dataset = SimpleNamespace(records=[SimpleNamespace(raw=["a red square"], path=None) for _ in preds])  # no images
    with caplog.at_level(logging.WARNING):
        page = write_prediction_report(tmp_path, preds, dataset, {"CIDEr": 1.0}, max_entries=2)
    assert page is not None
    assert re.findall(r'data-image-id="(\d+)"', page.read_text()) == ["100", "101"]
    assert "Showing 2 of 5 images" in page.read_text()
    assert sorted(load_attention(tmp_path / "attention.npz")[0]) == [100, 101, 102, 103, 104]
    assert any("showing 2 of 5 images" in r.getMessage() for r in caplog.records)
