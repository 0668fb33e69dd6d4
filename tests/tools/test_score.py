"""captioning-score: COCO annotation + results files in, coco-caption's numbers out, bad files refused."""

import json

import pytest

from captioning.data.readers.references import load_references, load_results
from captioning.metrics import score_captions
from captioning.tools.score import main, score_files

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
    assert main(["--annotations", str(ann), "--results", str(res), "--metrics", "bleu,rouge,cider",
                 "--per-image", str(tmp_path / "per_image.json"), "--out", str(tmp_path / "new/metrics.json")]) == 0
    printed = json.loads(capsys.readouterr().out)
    out = json.loads((tmp_path / "new/metrics.json").read_text())
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
    ([{"image_id": "1", "caption": "x"}], "entry 0 needs an integer 'image_id', got str '1'"),
    ([{"image_id": True, "caption": "x"}], "entry 0 needs an integer 'image_id', got bool True"),
    ([{"image_id": 1, "caption": "x"}, {"image_id": 2, "caption": None}],
     r"entry 1 \(image id 2\) needs a string 'caption', got NoneType None"),
    ([{"image_id": 1}], r"entry 0 \(image id 1\) needs a string 'caption', got nothing"),
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
    out = score_files(ann, res, ["bleu", "rouge", "cider"], "python", per_image=tmp_path / "per_image.json")
    per_image = {p["image_id"]: p for p in json.loads((tmp_path / "per_image.json").read_text())}
    assert out["num_images"] == 2 and set(per_image) == {1, 3}
    assert all(per_image[3][m] == 0.0 for m in ("Bleu_1", "Bleu_4", "ROUGE_L", "CIDEr"))
    assert per_image[1]["CIDEr"] > 0
    assert out["CIDEr"] == pytest.approx((per_image[1]["CIDEr"] + 0.0) / 2, abs=1e-12)
    assert out["ROUGE_L"] == pytest.approx(per_image[1]["ROUGE_L"] / 2, abs=1e-12)


@pytest.mark.parametrize("content, message", [
    ([{"image_id": 1, "caption": "x"}], "expected a COCO caption annotation file"),
    ({"images": []}, "split .test. has no images"),
    ({"annotations": [{"image_id": 1}]}, r"annotations\[0\] \(image id 1\) needs a string 'caption', got nothing"),
    ({"annotations": [{"image_id": 1.5, "caption": "x"}]}, r"annotations\[0\] needs an integer 'image_id', got float"),
    ({"annotations": ["x"]}, r"annotations\[0\] needs an integer 'image_id' and a string 'caption', got 'x'"),
])
def test_bad_annotation_files_are_refused(tmp_path, content, message):
    path = tmp_path / "captions.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=message) as err:
        load_references(path)
    assert "captions.json" in str(err.value)


@pytest.mark.parametrize("extra, message", [
    (["--results", "missing.json"], "file not found: missing.json"),
    (["--metrics", "bleu,cidr"], "unknown metric 'cidr'"),
    (["--tokenizer", "jar"], "argument --tokenizer: invalid choice: 'jar'"),
    (["--out", "results.json/metrics.json"], "cannot write to the folder results.json: "),
    (["--per-image", "."], "cannot write to .: it is a folder"),
])
def test_cli_user_errors_name_the_problem(ann, tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    res = _results(tmp_path, [{"image_id": 1, "caption": "a man surfing"}])
    args = ["--annotations", str(ann), "--results", str(res)] + extra
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("captioning-score: error: ") and err.count("\n") == 1


def test_empty_references_warn_and_are_scored_as_coco_caption_does(tmp_path, caplog):
    """Images whose references are all empty are scored as coco-caption scores them, with a logged warning."""
    anns = [{"image_id": 1, "id": 1, "caption": "A dog runs."}, {"image_id": 2, "id": 2, "caption": " "},
            {"image_id": 2, "id": 3, "caption": "..."}]
    (tmp_path / "captions.json").write_text(json.dumps({"annotations": anns}))
    res = _results(tmp_path, [{"image_id": 1, "caption": "a dog runs"}, {"image_id": 2, "caption": "a cat"}])
    out = score_files(tmp_path / "captions.json", res, ["bleu", "cider"], "python", per_image=tmp_path / "p.json")
    assert "1 of 2 images have only empty reference captions after tokenizing (e.g. image 2)" in caplog.text
    per_image = {p["image_id"]: p for p in json.loads((tmp_path / "p.json").read_text())}
    assert per_image[2]["CIDEr"] == 0.0 and per_image[1]["CIDEr"] > 0 and out["num_images"] == 2
    caplog.clear()
    (tmp_path / "captions.json").write_text(json.dumps({"annotations": anns[1:]}))
    res = _results(tmp_path, [{"image_id": 2, "caption": "a cat"}])
    out = score_files(tmp_path / "captions.json", res, ["bleu", "cider"], "python")
    assert "every reference caption is empty" in caplog.text
    assert out["Bleu_1"] < 1e-6 and out["CIDEr"] == 0.0  # coco-caption's numbers, flagged as meaningless


def test_a_karpathy_split_file_is_read_like_its_coco_twin(shapes_json, tmp_path, capsys):
    """The project's own shapes file (Karpathy format) is accepted, with --split, and scores exactly like the same
    references in a COCO caption file."""
    data = json.loads(shapes_json.read_text())
    test = [im for im in data["images"] if im["split"] == "test"]
    coco = {"images": [{"id": im["id"]} for im in data["images"]],
            "annotations": [{"image_id": im["id"], "id": s["sentid"], "caption": s["raw"]}
                            for im in data["images"] for s in im["sentences"]]}
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    results = [{"image_id": im["id"], "caption": im["sentences"][0]["raw"].split(" and ")[0]} for im in test]
    res = _results(tmp_path, results)
    scores = {}
    for name, extra in (("karpathy", [str(shapes_json)]), ("coco", [str(tmp_path / "coco.json")])):
        assert main(["--annotations", *extra, "--results", str(res), "--metrics", "bleu,cider",
                     "--tokenizer", "python"]) == 0
        scores[name] = json.loads(capsys.readouterr().out)
    assert scores["karpathy"] == scores["coco"] and scores["coco"]["num_images"] == len(test)
    # Another split's image ids are not in the test split's references: the error says which split was read.
    val = next(im for im in data["images"] if im["split"] == "val")
    with pytest.raises(ValueError, match=r"has no reference captions .*--split"):
        load_results(_results(tmp_path, [{"image_id": val["id"], "caption": "x"}]), load_references(shapes_json))
    assert main(["--annotations", str(shapes_json), "--split", "val", "--results", str(tmp_path / "results.json"),
                 "--metrics", "bleu", "--tokenizer", "python"]) == 0


def test_one_caption_for_every_image_is_said_in_one_warning_line_beside_the_diversity(ann, tmp_path, capsys):
    """The collapse check training and captioning-evaluate make, where results are scored from a file."""
    same = _results(tmp_path, [{"image_id": i, "caption": "A man on a board."} for i in REFS])
    assert main(["--annotations", str(ann), "--results", str(same), "--metrics", "bleu"]) == 0
    out = capsys.readouterr()
    printed = json.loads(out.out)
    assert printed["distinct_captions"] == pytest.approx(1 / 3) and printed["top_caption_share"] == 1.0
    assert printed["collapsed_caption"] == "a man on a board"
    assert out.err.strip().splitlines() == ['captioning-score: warning: one caption for 100% of the 3 images (over '
                                            'eval.collapse_share=0.5): "a man on a board": the model may have '
                                            'collapsed onto one caption']
    varied = _results(tmp_path, [{"image_id": 1, "caption": "a man surfing"}, {"image_id": 2, "caption": "two dogs"},
                                 {"image_id": 3, "caption": "a plate"}])
    assert main(["--annotations", str(ann), "--results", str(varied), "--metrics", "bleu"]) == 0
    out = capsys.readouterr()
    assert "collapsed_caption" not in json.loads(out.out) and "warning" not in out.err
    two = _results(tmp_path, [{"image_id": 1, "caption": "two dogs"}, {"image_id": 2, "caption": "two dogs"},
                              {"image_id": 3, "caption": "a plate"}])
    assert main(["--annotations", str(ann), "--results", str(two), "--metrics", "bleu"]) == 0
    assert "one caption for 67% of the 3 images" in capsys.readouterr().err  # 2 of 3: over 0.5
    assert main(["--annotations", str(ann), "--results", str(two), "--metrics", "bleu", "--collapse-share", "0.7"]) == 0
    assert "warning" not in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--annotations", str(ann), "--results", str(two), "--collapse-share", "2"])
    assert "--collapse-share must be a share of the images, from 0 to 1" in capsys.readouterr().err
