"""CHAIR on COCO (metrics/chair_coco.py): Rohrbach et al.'s words, double-word rules and objects on crafted captions
with hand-computed values; through captioning-score (--metrics ...,chair --instances) and through evaluation."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

from captioning.data.dataset import CaptionDataset
from captioning.data.readers.karpathy import read_karpathy
from captioning.evaluation.split import coco_chair, score_predictions
from captioning.metrics.chair import chair_scores
from captioning.metrics.chair_coco import (
    CATEGORY_OF,
    SYNONYMS,
    caption_objects,
    caption_words,
    coco_mentions,
    coco_objects,
    instance_objects,
    singular,
)
from captioning.metrics.coco_attention import CocoInstances
from captioning.metrics.coco_words import COCO_CATEGORY_IDS
from captioning.reporting.items import Prediction
from captioning.tools.score import main, score_files


def test_the_synonym_list_covers_coco_s_80_categories_each_word_naming_one():
    assert set(SYNONYMS) == set(COCO_CATEGORY_IDS)
    words = [w for ws in SYNONYMS.values() for w in set(ws)]
    assert len(words) == len(set(words)) == len(CATEGORY_OF)  # no word names two categories
    assert all(w == w.lower() for w in words)


@pytest.mark.parametrize("caption, expected", [
    # two-word names are one object: a hot dog is no dog, a teddy bear no bear, plurals too
    ("Two hot dogs next to a dog.", [("hot dogs", "hot dog"), ("dog", "dog")]),
    ("a teddy bear and a bear", [("teddy bear", "teddy bear"), ("bear", "bear")]),
    # "baby"/"adult" alone are people; before an animal they are that animal
    ("A baby elephant and an adult giraffe near a baby.", [("baby elephant", "elephant"),
                                                          ("adult giraffe", "giraffe"), ("baby", "person")]),
    ("passenger trains on a train track", [("passenger trains", "train")]),  # a train track names nothing
    ("a man wearing a bow tie", [("man", "person"), ("bow tie", "tie")]),
    # the seat of a toilet is no chair; a toilet seat is the toilet
    ("the seat of the toilet is up", [("toilet", "toilet")]),
    ("a toilet seat and a chair", [("toilet seat", "toilet"), ("chair", "chair")]),
    ("a seat on a bus", [("seat", "chair"), ("bus", "bus")]),
    # plurals, irregular ones too, and repeats, each a mention
    ("Men with knives, geese and buses; two dogs and a dog", [("men", "person"), ("knives", "knife"),
                                                             ("geese", "bird"), ("buses", "bus"), ("dogs", "dog"),
                                                             ("dog", "dog")]),
    # "dining table" is not among the release's two-word phrases: its "table" is the mention
    ("a wine glasses on the dining table", [("wine glasses", "wine glass"), ("table", "dining table")]),
    ("a grassy field with glasses", []),  # words naming no object stay as they are
])
def test_mentions_follow_rohrbach_s_words_and_double_word_rules(caption: str, expected: list[tuple[str, str]]):
    assert coco_mentions(caption) == expected


def test_words_are_lower_case_tokens_sentence_by_sentence_and_singular_only_towards_known_words():
    assert caption_words("A Dog's bowl. Two cats!") == ["a", "dog", "'s", "bowl", ".", "two", "cats", "!"]
    assert coco_mentions(["A", "Dog", "'s", "bowl"]) == [("dog", "dog"), ("bowl", "bowl")]  # decoded words as given
    assert [singular(w) for w in ("dogs", "ponies", "doggies", "calves", "bus", "grass", "skis")] == \
        ["dog", "pony", "doggy", "calf", "bus", "grass", "skis"]


def instances_file(path: Path, images: dict[int, list[str]], extra_categories: tuple[str, ...] = ()) -> Path:
    """An instances file (no masks needed) with each image's categories as given."""
    cats = [{"id": COCO_CATEGORY_IDS.get(n, 1000 + k), "name": n}
            for k, n in enumerate(sorted({*COCO_CATEGORY_IDS, *extra_categories}))]
    ids = {c["name"]: c["id"] for c in cats}
    anns = [{"id": 100 * i + k, "image_id": i, "category_id": ids[n], "segmentation": [[0, 0, 1, 0, 1, 1]]}
            for i, names in images.items() for k, n in enumerate(names)]
    path.write_text(json.dumps({"images": [{"id": i, "height": 8, "width": 8} for i in images],
                                "annotations": anns, "categories": cats}))
    return path


# image 1 holds a person and a dog (its references add a frisbee); image 2 a hot dog; image 3 nothing named
INSTANCES = {1: ["person", "dog", "dog"], 2: ["hot dog"], 3: []}
REFERENCES = {1: ["A man throws a frisbee to his dog.", "A person and a dog in a park."],
              2: ["A hot dog on a plate.", "Hot dog with mustard."],
              3: ["An empty street at night.", "A street."]}
CAPTIONS = {1: "a man and a dog playing with a frisbee next to a cat",  # 4 mentions: the cat is hallucinated
            2: "two hot dogs and a dog on a toilet seat",  # 3 mentions: dog and toilet hallucinated
            3: "a street at night"}  # none


def test_chair_on_coco_by_hand(tmp_path: Path):
    objects = coco_objects(instance_objects(instances_file(tmp_path / "i.json", INSTANCES), REFERENCES), REFERENCES)
    assert objects == {1: {"person", "dog", "frisbee"}, 2: {"hot dog"}, 3: set()}
    assert caption_objects(REFERENCES[1]) == {"person", "frisbee", "dog"}
    scores = chair_scores({i: coco_mentions(c) for i, c in CAPTIONS.items()}, objects)
    assert scores.overall == {"CHAIR_i": 3 / 7, "CHAIR_s": 2 / 3, "chair_mentions": 7}
    assert scores.per_image[1] == {"CHAIR_i": 1 / 4, "CHAIR_s": 1.0, "hallucinated": ["cat"]}
    assert scores.per_image[2] == {"CHAIR_i": 2 / 3, "CHAIR_s": 1.0, "hallucinated": ["dog", "toilet seat"]}
    assert scores.per_image[3] == {"CHAIR_i": 0.0, "CHAIR_s": 0.0, "hallucinated": []}


def test_instance_files_that_cannot_give_the_objects_are_refused(tmp_path: Path):
    good = instances_file(tmp_path / "i.json", INSTANCES)
    with pytest.raises(ValueError, match=r"1 image ids are not in .*i\.json \(e\.g\. \[9\]\)"):
        instance_objects(good, [1, 9])
    with pytest.raises(ValueError, match=r"categories \['lamp'\] are not COCO's 80"):
        instance_objects(instances_file(tmp_path / "lvis.json", {1: ["lamp"]}, ("lamp",)), [1])
    (tmp_path / "bad.json").write_text('{"images": []}')
    with pytest.raises(ValueError, match="is not a COCO instances file"):
        instance_objects(tmp_path / "bad.json", [1])
    with pytest.raises(FileNotFoundError, match="instances file not found"):
        instance_objects(tmp_path / "none.json", [1])
    # the instances evaluation reads (with masks) gives the same objects
    assert CocoInstances(good).categories([1, 2, 3]) == instance_objects(good, [1, 2, 3])


def coco_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    anns = [{"image_id": i, "id": 10 * i + k, "caption": c} for i, cs in REFERENCES.items() for k, c in enumerate(cs)]
    (tmp_path / "captions.json").write_text(json.dumps({"images": [{"id": i} for i in REFERENCES],
                                                        "annotations": anns}))
    (tmp_path / "results.json").write_text(json.dumps([{"image_id": i, "caption": c} for i, c in CAPTIONS.items()]))
    return tmp_path / "captions.json", tmp_path / "results.json", instances_file(tmp_path / "instances.json",
                                                                                 INSTANCES)


def test_captioning_score_reports_chair_on_coco_with_instances(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    captions, results, instances = coco_files(tmp_path)
    assert main(["--annotations", str(captions), "--results", str(results), "--instances", str(instances),
                 "--metrics", "bleu,chair", "--tokenizer", "python", "--per-image", str(tmp_path / "per.json")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["CHAIR_i"], printed["CHAIR_s"], printed["chair_mentions"]) == (3 / 7, 2 / 3, 7)
    assert "Bleu_4" in printed and printed["num_images"] == 3
    per_image = {row["image_id"]: row for row in json.loads((tmp_path / "per.json").read_text())}
    assert per_image[2]["hallucinated"] == ["dog", "toilet seat"] and "Bleu_1" in per_image[2]
    # chair alone needs no caption metric; without --instances COCO's objects are unknown: one line
    assert score_files(captions, results, ["chair"], instances=instances)["CHAIR_s"] == 2 / 3
    with pytest.raises(SystemExit) as exit_:
        main(["--annotations", str(captions), "--results", str(results), "--metrics", "chair"])
    assert exit_.value.code == 2
    assert "chair on COCO needs --instances" in capsys.readouterr().err


def test_captioning_score_reports_chair_on_shapes_as_evaluation_does(shapes_json: Path, tmp_path: Path):
    records = read_karpathy(shapes_json, "test")
    words = [["a", "red", "circle", "and", "a", "cross"] if k % 3 == 0 else list(r.captions[0])
             for k, r in enumerate(records)]
    (tmp_path / "results.json").write_text(json.dumps([{"image_id": r.image_id, "caption": " ".join(w)}
                                                       for r, w in zip(records, words)]))
    scored = score_files(shapes_json, tmp_path / "results.json", ["bleu", "chair"], tokenizer="python")
    from captioning.data.vocab import Vocabulary

    vocab = Vocabulary.build(c for r in records for c in r.captions)
    preds = [Prediction(k, r.image_id, w, torch.zeros(len(w), 1, 1)) for k, (r, w) in enumerate(zip(records, words))]
    evaluated = score_predictions(preds, CaptionDataset(records, vocab, transform=None), ("bleu",))
    assert 0 < scored["CHAIR_s"] < 1
    assert {k: scored[k] for k in ("CHAIR_i", "CHAIR_s", "chair_mentions")} == \
        {k: evaluated[k] for k in ("CHAIR_i", "CHAIR_s", "chair_mentions")}


def test_evaluation_with_instances_reports_chair_per_image(tmp_path: Path):
    instances = CocoInstances(instances_file(tmp_path / "instances.json", INSTANCES))
    records = [SimpleNamespace(image_id=i, raw=REFERENCES[i]) for i in CAPTIONS]
    dataset = cast(Any, SimpleNamespace(records=records))
    preds = [Prediction(k, i, c.split(), torch.zeros(len(c.split()), 1, 1)) for k, (i, c) in enumerate(CAPTIONS.items())]
    out = coco_chair(preds, dataset, instances)
    assert out["CHAIR_i"] == 3 / 7 and out["CHAIR_s"] == 2 / 3
    assert preds[0].scores["hallucinated"] == ["cat"] and preds[1].scores["CHAIR_i"] == 2 / 3
    assert not math.isnan(preds[2].scores["CHAIR_i"])
