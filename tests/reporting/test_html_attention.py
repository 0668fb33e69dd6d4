"""captioning-html's attention correctness: the number captioning-evaluate reports for the same attention maps, on
the `shapes` word boxes (from --annotations) and on COCO instance masks (--instances, with --checkpoint's view)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import TINY_MODEL
from test_html_report import _decoded

import captioning.tools.html as html_tool
from captioning.checkpoint import save_checkpoint
from captioning.data.readers.references import read_annotations
from captioning.data.vocab import Vocabulary
from captioning.evaluation.outputs import write_outputs
from captioning.evaluation.split import instance_correctness, score_predictions
from captioning.factory.models import build_captioner
from captioning.metrics.coco_attention import CocoInstances, coco_attention_correctness
from captioning.reporting.html import load_attention, save_attention
from captioning.reporting.items import Prediction, ReportItem
from captioning.reporting.numbers import format_metric
from captioning.tools.html import attention_metrics, main

# A ResNet-18 encoder (random weights): 32 px after a resize to 37 and a centre crop, so its view is not the image.
CROP_MODEL = {**TINY_MODEL, "encoder": {"_target_": "resnet", "arch": "resnet18",
                                        "pretrained": False, "fine_tune": "none", "grid_size": 2, "image_size": 32}}
PERSON, DOG = 1, 18


def overall(page: str) -> dict[str, str]:
    """The overall metrics table of a report page: name -> the text shown."""
    table = re.search(r'<table class="overall">(.*?)</table>', page).group(1)
    return {html.unescape(k): html.unescape(v) for k, v in re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", table)}


def test_shapes_pages_show_the_attention_correctness_evaluation_reports(shapes_json, tmp_path):
    """`shapes` (eval.instances is null there): the word boxes of dataset_shapes.json score the maps, as
    score_predictions (what evaluate_split runs) scores them; the run's own page and captioning-html's agree."""
    _, ds = _decoded(shapes_json)
    rng = np.random.default_rng(0)
    preds = []  # a reference as the caption (it names the objects) and random maps, float16 as attention.npz keeps
    for i, record in enumerate(ds.records):  # them, so both sides score the very same numbers
        alphas = rng.random((len(record.captions[0]), 8, 8)) + 0.01
        alphas = torch.from_numpy(alphas / alphas.sum(axis=(1, 2), keepdims=True)).half().float()
        preds.append(Prediction(i, record.image_id, list(record.captions[0]), alphas))
    metrics = score_predictions(preds, ds, ("bleu",))
    assert metrics["attention_words"] > 0  # the captions name objects: the measure is a number
    run = tmp_path / "run"
    write_outputs(run, preds, ds, metrics, num_figures=0)  # the run's report.html and attention.npz
    (run / "results.json").write_text(json.dumps([{"image_id": p.image_id, "caption": p.caption} for p in preds]))
    results = {p.image_id: p.caption for p in preds}
    maps = load_attention(run / "attention.npz")[0]
    assert attention_metrics(results, maps, read_annotations(shapes_json, "test").records) == {
        "attention_correctness": metrics["attention_correctness"], "attention_words": metrics["attention_words"]}
    assert main(["--results", str(run / "results.json"), "--annotations", str(shapes_json), "--metrics", "bleu",
                 "--tokenizer", "python", "--attention", str(run / "attention.npz"), "--out", str(tmp_path / "r.html")]) == 0
    page, own = overall((tmp_path / "r.html").read_text()), overall((run / "report.html").read_text())
    shown = format_metric("attention_correctness", metrics["attention_correctness"])
    assert re.fullmatch(r"0\.\d{4}", shown) and page["attention_correctness"] == own["attention_correctness"] == shown
    assert page["attention_words"] == own["attention_words"] == str(metrics["attention_words"])
    # without --attention there are no maps to score: no attention correctness
    assert main(["--results", str(run / "results.json"), "--annotations", str(shapes_json), "--metrics", "bleu",
                 "--tokenizer", "python", "--out", str(tmp_path / "plain.html")]) == 0
    assert "attention_correctness" not in overall((tmp_path / "plain.html").read_text())


def rect(x0: int, y0: int, x1: int, y1: int) -> list[list[int]]:
    """A polygon segmentation covering pixels x0..x1-1, y0..y1-1."""
    return [[x0, y0, x1, y0, x1, y1, x0, y1]]


def coco_files(folder: Path) -> tuple[Path, Path, Path, Path, list[Prediction]]:
    """A COCO caption file and instances file of two images, a results file naming a person, a dog and an image
    without a person, their attention.npz (float16-exact maps) and the same captions as Predictions."""
    images = [{"id": 1, "height": 40, "width": 60, "file_name": "a.jpg"}, {"id": 2, "height": 60, "width": 40,
                                                                        "file_name": "b.jpg"}]
    anns = [{"id": 10, "image_id": 1, "category_id": PERSON, "segmentation": rect(0, 0, 30, 40), "iscrowd": 0},
            {"id": 11, "image_id": 1, "category_id": DOG, "segmentation": rect(45, 20, 60, 40), "iscrowd": 0},
            {"id": 20, "image_id": 2, "category_id": DOG, "segmentation": rect(0, 0, 20, 30), "iscrowd": 0}]
    cats = [{"id": PERSON, "name": "person"}, {"id": DOG, "name": "dog"}]
    (folder / "instances.json").write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    captions = {1: "a person and a dog", 2: "a dog and a person"}  # image 2 has no person: a skipped word
    refs = [{"image_id": i, "id": i, "caption": c} for i, c in captions.items()]
    (folder / "captions.json").write_text(json.dumps({"images": images, "annotations": refs}))
    (folder / "results.json").write_text(json.dumps([{"image_id": i, "caption": c} for i, c in captions.items()]))
    rng = np.random.default_rng(0)
    preds = []
    for n, (image_id, caption) in enumerate(captions.items()):
        words = caption.split()
        a = rng.integers(1, 9, size=(len(words), 4, 4)).astype(np.float64)
        a = (a / a.sum(axis=(1, 2), keepdims=True)).astype(np.float16).astype(np.float64)
        preds.append(Prediction(n, image_id, words, torch.from_numpy(a).float()))
    save_attention(folder / "attention.npz", [ReportItem(p.image_id, p.words, [], alphas=p.alphas.numpy())
                                              for p in preds])
    return folder / "captions.json", folder / "instances.json", folder / "results.json", folder / "attention.npz", preds


def test_coco_instances_give_the_number_evaluation_gives_on_the_checkpoints_view(tmp_path):
    """--instances with --attention and --checkpoint: instance_correctness (what evaluate_split runs with
    eval.instances) on the same maps, the checkpoint's resize and centre crop placing them in each image."""
    captions, instances, results, attention, preds = coco_files(tmp_path)
    torch.manual_seed(0)
    vocab = Vocabulary.build([["a", "person", "and", "dog"]])
    model = build_captioner(CROP_MODEL, len(vocab))
    save_checkpoint(tmp_path / "model.pt", model, vocab, {"model": CROP_MODEL})
    expected = instance_correctness(preds, CocoInstances(instances), model)
    assert expected["attention_correctness_words"] == 3 and expected["attention_correctness_skipped_words"] == 1
    whole = coco_attention_correctness([p.words for p in preds], [p.alphas.numpy() for p in preds], [1, 2],
                                       CocoInstances(instances))  # the maps over the whole image instead
    assert whole["attention_correctness"] != pytest.approx(expected["attention_correctness"], abs=1e-3)
    out = tmp_path / "r.html"
    assert main(["--results", str(results), "--annotations", str(captions), "--metrics", "bleu", "--tokenizer",
                 "python", "--attention", str(attention), "--instances", str(instances), "--checkpoint",
                 str(tmp_path / "model.pt"), "--out", str(out)]) == 0
    page = overall(out.read_text())
    assert page["attention_correctness"] == format_metric("attention_correctness", expected["attention_correctness"])
    assert page["attention_correctness_words"] == "3" and page["attention_correctness_skipped_words"] == "1"
    assert json.loads(page["attention_correctness_per_category"]) == pytest.approx(
        expected["attention_correctness_per_category"])
    # a COCO caption file has no word boxes: --attention alone gives the maps but no attention correctness
    assert main(["--results", str(results), "--annotations", str(captions), "--metrics", "bleu", "--tokenizer",
                 "python", "--attention", str(attention), "--out", str(out)]) == 0
    assert "attention_correctness" not in overall(out.read_text())


@pytest.mark.parametrize("drop, message", [
    ("--attention", "captioning-html: error: --instances needs --attention: attention correctness scores the maps "
                    "of an attention.npz"),
    ("--checkpoint", "captioning-html: error: --instances needs --checkpoint: its encoder's resize and crop say "
                     "which part of each image the attention maps cover"),
])
def test_instances_without_the_maps_or_the_view_is_a_one_line_error(tmp_path, capsys, monkeypatch, drop, message):
    captions, instances, results, attention, _ = coco_files(tmp_path)
    monkeypatch.setattr(html_tool, "score_captions", lambda *a, **k: pytest.fail("scored before the check"))
    args = {"--results": results, "--annotations": captions, "--attention": attention, "--instances": instances,
            "--checkpoint": tmp_path / "model.pt", "--out": tmp_path / "r.html"}
    with pytest.raises(SystemExit) as exc:
        main([str(x) for k, v in args.items() if k != drop for x in (k, v)])
    assert exc.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [message]
    assert not (tmp_path / "r.html").exists()


def test_an_instances_file_of_other_images_fails_before_the_scoring(tmp_path, capsys, monkeypatch):
    captions, instances, results, attention, _ = coco_files(tmp_path)
    data = json.loads(instances.read_text())
    data["images"] = data["images"][:1]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] == 1]
    instances.write_text(json.dumps(data))
    vocab = Vocabulary.build([["a"]])
    save_checkpoint(tmp_path / "model.pt", build_captioner(CROP_MODEL, len(vocab)), vocab, {"model": CROP_MODEL})
    monkeypatch.setattr(html_tool, "score_captions", lambda *a, **k: pytest.fail("scored before the check"))
    with pytest.raises(SystemExit) as exc:
        main(["--results", str(results), "--annotations", str(captions), "--attention", str(attention),
              "--instances", str(instances), "--checkpoint", str(tmp_path / "model.pt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "1 image ids are not in" in err[0] and "instances.json" in err[0]
