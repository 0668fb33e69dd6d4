"""captioning-score: COCO annotation + results files in, coco-caption's numbers out, bad files refused."""

import json

import pytest

from captioning.metrics import score_captions
from captioning.score import load_references, load_results, main

REFS = {
    1: ["A man riding a wave on top of a surfboard.", "A surfer rides a large wave.", "Someone surfing in the ocean."],
    2: ["Two dogs play in the grass.", "A pair of dogs running on a lawn.", "Dogs playing outside on grass."],
    3: ["A plate of food with broccoli.", "Broccoli and rice on a white plate.", "A meal on a plate."],
}


@pytest.fixture
def ann(tmp_path):
    anns = [{"image_id": i, "id": 10 * i + k, "caption": c} for i, cs in REFS.items() for k, c in enumerate(cs)]
    path = tmp_path / "captions.json"
    path.write_text(json.dumps({"images": [{"id": i} for i in REFS], "annotations": anns}))
    return path


def _results(tmp_path, entries):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(entries))
    return path


def test_scores_equal_score_captions(ann, tmp_path, capsys):
    res = _results(tmp_path, [{"image_id": 1, "caption": "a man surfing a wave"}, {"image_id": 2, "caption": "two dogs on grass"}])
    out = main(["--annotations", str(ann), "--results", str(res), "--metrics", "bleu,rouge,cider",
                "--per-image", str(tmp_path / "per_image.json")])
    printed = json.loads(capsys.readouterr().out)
    expected = score_captions({1: "a man surfing a wave", 2: "two dogs on grass"}, {1: REFS[1], 2: REFS[2]},
                              metrics=("bleu", "rouge", "cider"))
    for key, value in expected.overall.items():
        assert printed[key] == out[key] == value
    assert printed["num_images"] == 2  # only the images in the results are scored
    per_image = json.loads((tmp_path / "per_image.json").read_text())
    assert [p["image_id"] for p in per_image] == [1, 2] and "CIDEr" in per_image[0]


@pytest.mark.parametrize("entries, message", [
    ([{"image_id": 9, "caption": "x"}], "no reference captions"),
    ([{"image_id": 1, "caption": "x"}, {"image_id": 1, "caption": "y"}], "more than once"),
    ([{"image": 1, "caption": "x"}], "needs an integer 'image_id'"),
    ([{"image_id": "1", "caption": "x"}], "entry 0 needs an integer 'image_id'"),
    ([{"image_id": True, "caption": "x"}], "entry 0 needs an integer 'image_id'"),
    ([{"image_id": 1, "caption": "x"}, {"image_id": 2, "caption": None}], "entry 1 needs .* a string 'caption'"),
    (["a caption"], "entry 0 needs"),
    ({"image_id": 1}, "expected a JSON list"),
    ([], "empty"),
])
def test_bad_results_are_refused(ann, tmp_path, entries, message):
    refs = load_references(ann)
    with pytest.raises(ValueError, match=message):
        load_results(_results(tmp_path, entries), refs)


def test_cli_errors_exit_cleanly(ann, tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SystemExit) as exit_info:
        main(["--annotations", str(ann), "--results", str(tmp_path / "bad.json")])
    assert exit_info.value.code == 2
    assert "not valid JSON (line 1" in capsys.readouterr().err


def test_empty_caption_counts_as_zero(ann, tmp_path, capsys):
    """The documented rule: an empty caption is scored (0 everywhere) and counts in the average."""
    res = _results(tmp_path, [{"image_id": 1, "caption": "a man surfing a wave"}, {"image_id": 3, "caption": ""}])
    out = main(["--annotations", str(ann), "--results", str(res), "--metrics", "bleu,rouge,cider",
                "--tokenizer", "python", "--per-image", str(tmp_path / "per_image.json")])
    per_image = {p["image_id"]: p for p in json.loads((tmp_path / "per_image.json").read_text())}
    assert out["num_images"] == 2 and set(per_image) == {1, 3}
    assert all(per_image[3][m] == 0.0 for m in ("Bleu_1", "Bleu_4", "ROUGE_L", "CIDEr"))
    assert per_image[1]["CIDEr"] > 0
    assert out["CIDEr"] == pytest.approx((per_image[1]["CIDEr"] + 0.0) / 2, abs=1e-12)
    assert out["ROUGE_L"] == pytest.approx(per_image[1]["ROUGE_L"] / 2, abs=1e-12)


@pytest.mark.parametrize("content, message", [
    ([{"image_id": 1, "caption": "x"}], "expected a COCO caption annotation file"),
    ({"images": []}, "expected a COCO caption annotation file"),
    ({"annotations": [{"image_id": 1}]}, "annotation 0 needs an integer 'image_id' and a string 'caption'"),
    ({"annotations": [{"image_id": 1.5, "caption": "x"}]}, "annotation 0 needs an integer 'image_id'"),
])
def test_bad_annotation_files_are_refused(tmp_path, content, message):
    path = tmp_path / "captions.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=message):
        load_references(path)


@pytest.mark.parametrize("extra, message", [
    (["--results", "missing.json"], "file not found: missing.json"),
    (["--metrics", "bleu,cidr"], "unknown metric 'cidr'"),
])
def test_cli_user_errors_name_the_problem(ann, tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    res = _results(tmp_path, [{"image_id": 1, "caption": "a man surfing"}])
    args = ["--annotations", str(ann), "--results", str(res)] + extra
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
