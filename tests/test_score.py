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
