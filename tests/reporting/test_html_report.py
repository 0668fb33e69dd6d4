"""The HTML report: its content and data (unit tests), the results-file CLI, and the page in headless chromium."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import TINY_MODEL
from PIL import Image, ImageDraw

from captioning.checkpoint import save_checkpoint
from captioning.data.dataset import CaptionDataset
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import Vocabulary
from captioning.evaluation.outputs import write_outputs
from captioning.evaluation.split import decode_split, score_predictions
from captioning.factory.models import build_captioner
from captioning.reporting.html import (
    image_data_uri,
    load_attention,
    quantize_maps,
    render_report,
    save_attention,
    write_report,
)
from captioning.reporting.items import Prediction, ReportItem
from captioning.tools.html import main


def _one_hot(h: int, w: int, r: int, c: int) -> np.ndarray:
    a = np.full((h, w), 1e-4)
    a[r, c] = 1.0
    return a / a.sum()


def _image(size: tuple[int, int], seed: int) -> Image.Image:
    """A (width, height) image with a few coloured rectangles."""
    rng = np.random.default_rng(seed)
    img = Image.new("RGB", size, tuple(int(v) for v in rng.integers(0, 255, 3)))
    draw = ImageDraw.Draw(img)
    for _ in range(4):
        x0, y0 = rng.integers(0, size[0] // 2), rng.integers(0, size[1] // 2)
        draw.rectangle([int(x0), int(y0), int(x0) + size[0] // 3, int(y0) + size[1] // 3],
                       fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    return img


# Hand-made rows: each word's map puts all mass on one known cell. A 7x7 square grid on a square image (soft), a
# 3x5 grid on a wide image (hard attention, regions marked), a 4x2 grid with no image, and a row without maps.
CELLS = {101: ((7, 7), [(0, 0), (6, 6), (3, 1)]), 202: ((3, 5), [(2, 4), (0, 1)]), 303: ((4, 2), [(3, 0)])}
SIZES = {101: (224, 224), 202: (250, 150)}


def _items() -> list[ReportItem]:
    items = []
    for n, (image_id, ((h, w), cells)) in enumerate(CELLS.items()):
        words = ["red", "blue", "<green>"][: len(cells)]
        alphas = np.stack([_one_hot(h, w, r, c) for r, c in cells])
        uri = image_data_uri(_image(SIZES[image_id], n)) if image_id in SIZES else None
        items.append(ReportItem(image_id, words, [f"a reference of {image_id}", "a <b>bold</b> one"],
                                {"Bleu_4": 0.1 * n, "CIDEr": [0.7, 0.2, 1.5][n]}, uri, alphas, image_id == 202))
    items.append(ReportItem(404, ["no", "maps"], ["a plain row"], {"Bleu_4": 0.5, "CIDEr": 0.9}))
    return items


def _data_block(page: str) -> dict:
    text = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S).group(1)
    return json.loads(text)


# -- unit tests -----------------------------------------------------------------------------------------------------
def test_quantize_maps_scales_each_map_to_0_255():
    a = np.stack([_one_hot(3, 4, 1, 2), np.full((3, 4), 1 / 12), np.arange(12.0).reshape(3, 4), np.zeros((3, 4))])
    q = quantize_maps(a)
    assert q.dtype == np.uint8 and q.shape == (4, 3, 4)
    assert not q[3].any()  # a map with no mass (monotonic attention attending to nothing): nothing drawn
    assert q[0, 1, 2] == 255 and q[0].sum() == 255  # one-hot stays one-hot
    assert np.all(q[1] == 255)  # uniform attention: everything equally attended (as visualize.upsample_attention)
    np.testing.assert_array_equal(q[2].ravel(), np.rint(np.arange(12) / 11 * 255))


def test_report_has_one_entry_per_image_and_embeds_everything():
    items = _items()
    page = render_report(items, {"CIDEr": 0.83, "Bleu_4": 0.21, "split": "test", "skipped": {"spice": "no java"}})
    assert len(re.findall(r'<tr class="entry"', page)) == len(items)
    assert re.findall(r'data-image-id="(\d+)"', page) == ["101", "202", "303", "404"]
    assert "http://" not in page and "https://" not in page  # self-contained: no external resources
    assert all(src.startswith("data:") for src in re.findall(r'src="([^"]*)"', page))
    assert page.count("<canvas") == 3  # rows with attention maps only
    # Words are hoverable spans, text is escaped (a caption word and a reference hold markup).
    assert '<span class="word" data-t="2" tabindex="0">&lt;green&gt;</span>' in page
    assert "<li>a &lt;b&gt;bold&lt;/b&gt; one</li>" in page and "<b>bold" not in page
    # Overall metrics at the top, before the image table.
    assert page.index('id="overall"') < page.index('id="images"')
    assert "<th>CIDEr</th><td>0.8300</td>" in page and "<th>split</th><td>test</td>" in page
    # The embedded attention data decodes back to each row's quantized maps; hard attention carries its regions.
    entries = _data_block(page)["entries"]
    assert len(entries) == len(items) and entries[3] is None
    for entry, item in zip(entries[:3], items[:3]):
        maps = np.frombuffer(base64.b64decode(entry["maps"]), np.uint8).reshape(-1, entry["h"], entry["w"])
        np.testing.assert_array_equal(maps, quantize_maps(item.alphas))
    assert "regions" not in entries[0]
    assert entries[1]["regions"] == [2 * 5 + 4, 0 * 5 + 1]


def test_sort_headers_cover_the_metric_columns_in_cell_order():
    page = render_report(_items(), {})
    header = re.search(r"<thead><tr>(.*?)</tr></thead>", page).group(1)
    cols = dict(re.findall(r'<th class="sortable" data-col="(\d+)">([^<]*)</th>', header))
    assert cols == {"0": "#", "1": "image id", "5": "Bleu_4", "6": "CIDEr"}
    row = re.search(r'<tr class="entry" data-entry="0".*?</tr>', page).group(0)
    values = re.findall(r'<td class="num" data-value="([^"]*)">([^<]*)</td>', row)
    assert values == [("1", "1"), ("101", "101"), ("0.0", "0.0000"), ("0.7", "0.7000")]  # #, image id, Bleu_4, CIDEr


def test_a_collapsed_model_is_said_above_the_table_and_escaped():
    metrics = {"top_caption_share": 0.75, "num_images": 4, "collapsed_caption": "a <red> circle"}
    page = render_report(_items(), metrics)
    assert ('<p class="collapse">One caption for 75% of the 4 images: &quot;a &lt;red&gt; circle&quot;: the model '
            "may have collapsed onto one caption.</p>") in page
    assert 'class="collapse"' not in render_report(_items(), {"top_caption_share": 0.25, "num_images": 4})


def test_hallucinated_words_are_marked_in_the_caption():
    words = "a green triangle and a red circle and a circle".split()
    item = ReportItem(7, words, ["a green triangle"], {"CHAIR_i": 2 / 3, "hallucinated": ["red circle", "circle"]})
    page = render_report([item], {})
    marked = re.findall(r'<span class="word hallucinated" data-t="(\d+)"', page)
    assert marked == ["5", "6", "9"]  # "red circle", then the second, bare "circle"; "green triangle" is not
    assert page.count('title="CHAIR: names an object that is not in the image"') == 3
    assert "hallucinated" not in render_report([ReportItem(7, words, ["x"], {"CHAIR_i": 0.0})], {}).split("<body")[1]


def test_bad_items_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="image 7: alphas must be .* T = 2 words"):
        ReportItem(7, ["a", "b"], ["ref"], alphas=np.ones((3, 2, 2)))
    with pytest.raises(ValueError, match="non-finite"):
        ReportItem(7, ["a"], ["ref"], alphas=np.full((1, 2, 2), np.nan))
    with pytest.raises(ValueError, match="no images to report"):
        render_report([], {})


def test_attention_file_round_trip(tmp_path):
    items = _items()
    path = save_attention(tmp_path / "attention.npz", items)
    maps, mark = load_attention(path)
    assert sorted(maps) == [101, 202, 303] and mark  # one row is hard attention
    for it in items[:3]:
        np.testing.assert_allclose(maps[it.image_id], it.alphas, atol=1e-3)
    (tmp_path / "other.npz").write_bytes(b"junk")
    with pytest.raises(ValueError, match="not an attention file"):
        load_attention(tmp_path / "other.npz")
    with pytest.raises(FileNotFoundError, match="attention file not found"):
        load_attention(tmp_path / "missing.npz")


def _decoded(shapes_json: Path, checkpoint: Path | None = None) -> tuple[list[Prediction], CaptionDataset]:
    records = read_karpathy(shapes_json, "test")
    vocab = Vocabulary.build(c for r in read_karpathy(shapes_json, "train") for c in r.captions)
    torch.manual_seed(0)
    model = build_captioner(TINY_MODEL, len(vocab))
    if checkpoint is not None:
        save_checkpoint(checkpoint, model, vocab, {"model": TINY_MODEL})
    ds = CaptionDataset(records, vocab, model.encoder.transform())
    return decode_split(model, ds, beam_size=1, max_len=6, progress=False), ds


def test_write_outputs_writes_the_report_and_attention(shapes_json, tmp_path):
    preds, ds = _decoded(shapes_json)
    metrics = score_predictions(preds, ds, ("bleu", "cider"))
    write_outputs(tmp_path, preds, ds, metrics, num_figures=0)
    page = (tmp_path / "report.html").read_text()
    assert re.findall(r'data-image-id="(\d+)"', page) == [str(p.image_id) for p in preds]
    assert page.count('src="data:image/jpeg;base64,') == len(preds)
    maps, mark = load_attention(tmp_path / "attention.npz")
    assert not mark and len(maps) == sum(1 for p in preds if p.words)
    for p in preds:
        if p.words:
            np.testing.assert_allclose(maps[p.image_id], p.alphas.numpy(), atol=1e-3)


def test_cli_builds_a_report_from_any_results_file(shapes_json, tmp_path):
    preds, ds = _decoded(shapes_json, tmp_path / "model.pt")
    results = [{"image_id": p.image_id, "caption": p.caption} for p in preds]
    (tmp_path / "results.json").write_text(json.dumps(results))
    save_attention(tmp_path / "attention.npz", [ReportItem(p.image_id, p.words, [], alphas=p.alphas.numpy())
                                                 for p in preds if p.words])
    # Without attention: captions and scores only.
    status = main(["--results", str(tmp_path / "results.json"), "--annotations", str(shapes_json),
                   "--metrics", "bleu,cider", "--tokenizer", "python"])
    out = tmp_path / "report.html"  # next to the results by default
    page = out.read_text()
    assert status == 0 and "<canvas" not in page
    assert len(re.findall(r'<tr class="entry"', page)) == len(preds) and "CIDEr" in page
    # With the attention file (and the checkpoint, whose encoder says which part of each image it saw): one canvas
    # and one map set per captioned image.
    out = tmp_path / "r.html"
    assert main(["--results", str(tmp_path / "results.json"), "--annotations", str(shapes_json), "--metrics", "bleu",
                 "--tokenizer", "python", "--attention", str(tmp_path / "attention.npz"), "--out", str(out),
                 "--checkpoint", str(tmp_path / "model.pt")]) == 0
    page = out.read_text()
    assert page.count("<canvas") == sum(1 for p in preds if p.words) and "CIDEr" not in page
    assert page.count('src="data:image/jpeg;base64,') == len(preds)
    assert sum(e is not None for e in _data_block(page)["entries"]) == page.count("<canvas")


def test_cli_embeds_the_curves_and_writes_nothing_but_the_page(shapes_json, tmp_path):
    preds, _ = _decoded(shapes_json)
    (tmp_path / "results.json").write_text(json.dumps([{"image_id": p.image_id, "caption": p.caption} for p in preds]))
    history = [{"epoch": e, "loss": 3.0 / e, "val_CIDEr": 0.1 * e, "val_Bleu_4": 0.05 * e} for e in (1, 2, 3)]
    (tmp_path / "history.json").write_text(json.dumps(history))
    out = tmp_path / "pages" / "r.html"
    before = set(tmp_path.rglob("*"))
    assert main(["--results", str(tmp_path / "results.json"), "--annotations", str(shapes_json), "--metrics", "bleu",
                 "--tokenizer", "python", "--history", str(tmp_path / "history.json"), "--out", str(out)]) == 0
    assert set(tmp_path.rglob("*")) - before == {out.parent, out}  # no curves.png beside it
    assert 'src="data:image/png;base64,' in out.read_text()  # the curves are in the page


def test_cli_errors_name_the_bad_input(shapes_json, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--results", str(tmp_path / "nope.json"), "--annotations", str(shapes_json)])
    assert exc.value.code == 2 and "file not found" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SystemExit):
        main(["--results", str(tmp_path / "r.json"), "--annotations", str(tmp_path / "bad.json")])
    assert "bad.json is not valid JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--results", str(tmp_path / "r.json"), "--annotations", str(shapes_json), "--image-root", "/nonexistent"])
    assert "--image-root is not a folder: /nonexistent" in capsys.readouterr().err


# -- in a real headless browser -------------------------------------------------------------------------------------
# Where the heatmap canvas is least veiled (most attended): the centroid of its near-minimum-opacity pixels, as
# fractions of the canvas size; the centroid of its opaque red pixels (the hard-attention box), its pixel size and
# the word it shows.
_READ_CANVAS = """
const c = arguments[0], d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
let lo = 256, hi = -1;
for (let i = 3; i < d.length; i += 4) { lo = Math.min(lo, d[i]); hi = Math.max(hi, d[i]); }
let sx = 0, sy = 0, n = 0, rx = 0, ry = 0, nr = 0;
for (let i = 0; i < c.width * c.height; i++) {
  const x = i % c.width + 0.5, y = Math.floor(i / c.width) + 0.5;
  if (d[4 * i + 3] <= lo + 5) { sx += x; sy += y; n++; }
  if (d[4 * i] > 200 && d[4 * i + 1] < 60 && d[4 * i + 3] > 200) { rx += x; ry += y; nr++; }
}
return {w: c.width, h: c.height, lo: lo, hi: hi, x: sx / n / c.width, y: sy / n / c.height,
        red: nr > 0, red_x: rx / nr / c.width, red_y: ry / nr / c.height, word: c.dataset.word};
"""


def _cell_of(state: dict, grid: tuple[int, int]) -> tuple[int, int]:
    return int(state["y"] * grid[0]), int(state["x"] * grid[1])


@pytest.fixture(scope="module")
def report_page(browser, tmp_path_factory):
    path = write_report(tmp_path_factory.mktemp("report") / "report.html", _items(),
                        {"CIDEr": 0.83, "Bleu_4": 0.21})
    browser.get(path.as_uri())
    return browser


@pytest.mark.integration
def test_page_loads_without_console_errors_and_lists_every_image(report_page):
    from selenium.webdriver.common.by import By

    rows = report_page.find_elements(By.CSS_SELECTOR, "#images tbody tr.entry")
    assert [r.get_attribute("data-image-id") for r in rows] == ["101", "202", "303", "404"]
    assert all(r.is_displayed() for r in rows)
    thumbs = report_page.find_elements(By.CSS_SELECTOR, "img.thumb")
    assert [report_page.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight]", t)
            for t in thumbs] == [[224, 224], [224, 134]]  # decoded, longer side 224, aspect kept
    errors = [e for e in report_page.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == []


@pytest.mark.integration
def test_hovering_a_word_swaps_the_heatmap_to_that_words_attention(report_page):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    for image_id, (grid, cells) in CELLS.items():
        row = report_page.find_element(By.CSS_SELECTOR, f'tr[data-image-id="{image_id}"]')
        canvas = row.find_element(By.CSS_SELECTOR, "canvas.heat")
        assert report_page.execute_script(_READ_CANVAS, canvas)["hi"] <= 0  # nothing drawn before a hover
        for t, cell in enumerate(cells):
            word = row.find_element(By.CSS_SELECTOR, f'.word[data-t="{t}"]')
            ActionChains(report_page).move_to_element(word).perform()
            state = report_page.execute_script(_READ_CANVAS, canvas)
            assert state["word"] == str(t) and "active" in word.get_attribute("class")
            assert row.find_element(By.CSS_SELECTOR, ".shown").text == f"attention: {word.text}"
            assert state["lo"] == 0 and state["hi"] >= 170  # attended cell clear, the rest veiled
            assert _cell_of(state, grid) == cell, (image_id, t)  # brightest area over that word's cell
            assert state["red"] == (image_id == 202)  # hard attention: the selected cell outlined
            if state["red"]:
                assert _cell_of({"x": state["red_x"], "y": state["red_y"]}, grid) == cell
            if image_id == 202:
                assert state["w"] == 224 and state["h"] == 134  # the map covers the whole (wide) view
        ActionChains(report_page).move_to_element(report_page.find_element(By.TAG_NAME, "h1")).perform()
        state = report_page.execute_script(_READ_CANVAS, canvas)
        assert state["word"] == "" and state["hi"] == 0  # back to the plain image


@pytest.mark.integration
def test_clicking_a_word_pins_its_heatmap(report_page):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    row = report_page.find_element(By.CSS_SELECTOR, 'tr[data-image-id="101"]')
    canvas = row.find_element(By.CSS_SELECTOR, "canvas.heat")
    row.find_element(By.CSS_SELECTOR, '.word[data-t="1"]').click()
    ActionChains(report_page).move_to_element(report_page.find_element(By.TAG_NAME, "h1")).perform()
    state = report_page.execute_script(_READ_CANVAS, canvas)
    assert state["word"] == "1" and _cell_of(state, (7, 7)) == CELLS[101][1][1]
    row.find_element(By.CSS_SELECTOR, '.word[data-t="1"]').click()  # a second click unpins
    ActionChains(report_page).move_to_element(report_page.find_element(By.TAG_NAME, "h1")).perform()
    assert report_page.execute_script(_READ_CANVAS, canvas)["word"] == ""


@pytest.mark.integration
def test_clicking_the_cider_header_sorts_rows_by_cider(report_page):
    from selenium.webdriver.common.by import By

    header = report_page.find_element(By.XPATH, '//thead//th[text()="CIDEr"]')

    def order() -> list[str]:
        return [r.get_attribute("data-image-id") for r in report_page.find_elements(By.CSS_SELECTOR, "tr.entry")]

    header.click()  # CIDEr: 101 0.7, 202 0.2, 303 1.5, 404 0.9
    assert header.get_attribute("aria-sort") == "ascending" and order() == ["202", "101", "404", "303"]
    header.click()
    assert header.get_attribute("aria-sort") == "descending" and order() == ["303", "404", "101", "202"]
    report_page.find_element(By.XPATH, '//thead//th[text()="#"]').click()
    assert order() == ["101", "202", "303", "404"]
