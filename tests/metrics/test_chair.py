"""CHAIR (metrics/chair.py) on crafted `shapes` captions, with the values computed by hand, and through evaluation's
score_predictions on the generated `shapes` split."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from captioning.data.dataset import CaptionDataset
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import Vocabulary
from captioning.evaluation.split import score_predictions
from captioning.metrics.chair import chair_scores, is_shapes_annotation, shapes_mentions, shapes_objects
from captioning.reporting.items import Prediction

# image 1: a red circle and a blue square; image 2: a green triangle
BOXES = {1: {"circle": [[1, 1, 5, 5]], "square": [[8, 8, 12, 12]], "red": [[1, 1, 5, 5]], "blue": [[8, 8, 12, 12]]},
         2: {"triangle": [[0, 0, 9, 9]], "green": [[0, 0, 9, 9]]}}


def test_the_objects_of_an_image_are_its_shapes_alone_and_with_their_colours():
    assert shapes_objects(BOXES[1]) == {"circle", "red circle", "square", "blue square"}
    assert shapes_objects(BOXES[2]) == {"triangle", "green triangle"}
    assert is_shapes_annotation(BOXES[1]) and not is_shapes_annotation({}) and not is_shapes_annotation({"red": []})
    assert not is_shapes_annotation({"circle": [[0, 0, 1, 1]], "dog": [[0, 0, 1, 1]]})  # not shapes' vocabulary


def test_a_shape_noun_is_a_mention_with_the_colour_just_before_it():
    words = "a small red circle above two crosses and the square is blue".split()
    assert shapes_mentions(words) == [("red circle", "red circle"), ("crosses", "cross"), ("square", "square")]
    assert shapes_mentions("three shapes on a grey background".split()) == []


def test_chair_counts_every_mention_and_every_caption_by_hand():
    captions = {1: "a red circle left of a blue square",  # 2 mentions, none hallucinated
                2: "a green triangle and a red circle and a circle"}  # 3 mentions: "red circle" and "circle" wrong
    mentions = {i: shapes_mentions(c.split()) for i, c in captions.items()}
    scores = chair_scores(mentions, {i: shapes_objects(b) for i, b in BOXES.items()})
    assert scores.overall == {"CHAIR_i": 2 / 5, "CHAIR_s": 1 / 2, "chair_mentions": 5}
    assert scores.per_image[1] == {"CHAIR_i": 0.0, "CHAIR_s": 0.0, "hallucinated": []}
    assert scores.per_image[2] == {"CHAIR_i": 2 / 3, "CHAIR_s": 1.0, "hallucinated": ["red circle", "circle"]}
    # a wrong colour on a present shape is a hallucination: the blue circle is not in image 1
    wrong_colour = chair_scores({1: shapes_mentions("a blue circle".split())}, {1: shapes_objects(BOXES[1])})
    assert wrong_colour.per_image[1]["hallucinated"] == ["blue circle"] and wrong_colour.overall["CHAIR_s"] == 1.0


def test_no_mentions_leave_chair_i_undefined_and_a_missing_object_list_is_refused():
    scores = chair_scores({1: []}, {1: {"circle"}})
    assert math.isnan(scores.overall["CHAIR_i"]) and scores.overall["CHAIR_s"] == 0.0
    assert scores.per_image[1] == {"CHAIR_i": 0.0, "CHAIR_s": 0.0, "hallucinated": []}
    with pytest.raises(ValueError, match="no object list for 1 captioned image"):
        chair_scores({3: [("circle", "circle")]}, {1: {"circle"}})


def test_evaluation_reports_chair_on_shapes(shapes_json: Path):
    records = read_karpathy(shapes_json, "test")
    vocab = Vocabulary.build(c for r in records for c in r.captions)
    ds = CaptionDataset(records, vocab, transform=None)
    # a reference caption for every image (its objects exist), then one with a shape the image lacks
    words = [list(r.captions[0]) for r in records]
    first = records[0]
    absent = next(s for s in ("circle", "square", "triangle", "cross") if s not in first.word_boxes)
    words[0] = ["a", absent]
    preds = [Prediction(k, r.image_id, w, torch.zeros(len(w), 1, 1)) for k, (r, w) in enumerate(zip(records, words))]
    metrics = score_predictions(preds, ds, ("bleu",))
    expected = chair_scores({r.image_id: shapes_mentions(w) for r, w in zip(records, words)},
                            {r.image_id: shapes_objects(r.word_boxes) for r in records})
    assert {k: metrics[k] for k in expected.overall} == expected.overall
    assert metrics["CHAIR_s"] == pytest.approx(1 / len(records))  # only the first caption hallucinates
    assert preds[0].scores["hallucinated"] == [absent] and preds[0].scores["CHAIR_i"] == 1.0
    assert all(p.scores["hallucinated"] == [] for p in preds[1:])
    json.dumps([p.scores for p in preds])  # per_image_scores.json can hold them
