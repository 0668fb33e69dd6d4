"""evaluation/split.py: a split decoded one prediction per image in data set order, scored as coco-caption scores
it, the `eval` settings read from a config, and evaluate_split's files holding the scores it returns."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from fixtures import TINY_MODEL
from omegaconf import OmegaConf

from captioning.data.dataset import CaptionDataset
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import Vocabulary
from captioning.evaluation.split import EvalSettings, decode_split, evaluate_split, score_predictions
from captioning.factory.models import build_captioner
from captioning.metrics import score_captions
from captioning.models.captioner import Captioner
from captioning.reporting.items import Prediction
from captioning.runtime import CONF_DIR

GRID = (8, 8)  # the tiny SmallCNN on 32 px images
METRICS = ("bleu", "cider")
METRIC_KEYS = {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr"}


@pytest.fixture(scope="module")
def split(shapes_json: Path) -> tuple[Captioner, CaptionDataset]:
    """An untrained tiny captioner and the 12 images of the `shapes_json` test split (vocabulary of train)."""
    vocab = Vocabulary.build(c for r in read_karpathy(shapes_json, "train") for c in r.captions)
    torch.manual_seed(0)
    model = build_captioner(TINY_MODEL, len(vocab)).eval()
    return model, CaptionDataset(read_karpathy(shapes_json, "test"), vocab, model.encoder.transform())


def _same(a: object, b: object) -> bool:
    """Equal, where NaN equals NaN and None (metrics.json writes NaN as null)."""
    if isinstance(a, float) and math.isnan(a):
        return b is None or (isinstance(b, float) and math.isnan(b))
    return a == b


def _uniform(words: list[str]) -> torch.Tensor:
    return torch.full((len(words), *GRID), 1 / (GRID[0] * GRID[1]))


# ------------------------------------------------------------------------------------------------
# decode_split
# ------------------------------------------------------------------------------------------------
def test_one_prediction_per_image_in_data_set_order_whatever_the_batch_size(split):
    model, ds = split
    model.train()
    preds = decode_split(model, ds, beam_size=2, max_len=6, batch_size=5, progress=False)  # batches of 5, 5, 2
    assert model.training  # the model's mode is given back
    model.eval()
    assert [p.index for p in preds] == list(range(len(ds))) == list(range(12))
    assert [p.image_id for p in preds] == [r.image_id for r in ds.records]
    assert any(p.words for p in preds)
    specials = {ds.vocab.itos[i] for i in (ds.vocab.pad_id, ds.vocab.start_id, ds.vocab.end_id)}
    for p in preds:
        assert len(p.words) <= 6 and not specials & set(p.words) and p.caption == " ".join(p.words)
        assert p.alphas.shape == (len(p.words), *GRID)  # one (h, w) map per word
        torch.testing.assert_close(p.alphas.sum((1, 2)), torch.ones(len(p.words)))
        assert p.scores == {}  # scored later
    whole = decode_split(model, ds, beam_size=2, max_len=6, batch_size=50, progress=False)
    assert [p.words for p in whole] == [p.words for p in preds]
    for p, q in zip(whole, preds):
        torch.testing.assert_close(p.alphas, q.alphas)
    # the data set's order, not the image ids': the records reversed give the same captions reversed
    backwards = CaptionDataset(ds.records[::-1], ds.vocab, ds.transform)
    reversed_preds = decode_split(model, backwards, beam_size=2, max_len=6, batch_size=5, progress=False)
    assert [p.image_id for p in reversed_preds] == [p.image_id for p in preds][::-1]
    assert [p.words for p in reversed_preds] == [p.words for p in preds][::-1]


def test_an_unreadable_image_gets_no_prediction_and_is_counted(split, tmp_path):
    model, ds = split
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"")
    records = [dataclasses.replace(r, path=broken) if k == 4 else r for k, r in enumerate(ds.records)]
    bad = CaptionDataset(records, ds.vocab, ds.transform)
    preds = decode_split(model, bad, beam_size=1, max_len=6, batch_size=5, progress=False)
    assert [p.index for p in preds] == [k for k in range(12) if k != 4]
    metrics = score_predictions(preds, bad, METRICS)
    assert metrics["num_images"] == 11 and metrics["skipped_images"] == 1


# ------------------------------------------------------------------------------------------------
# score_predictions
# ------------------------------------------------------------------------------------------------
def test_a_caption_equal_to_a_reference_scores_full_bleu_and_a_wrong_one_nothing(split):
    _, ds = split
    right = [k for k in range(len(ds)) if k % 2 == 0]

    def caption(k: int) -> list[str]:
        return list(ds.records[k].captions[0]) if k in right else ["zebra", "eats", "grass"]  # no reference word

    preds = [Prediction(k, r.image_id, caption(k), _uniform(caption(k))) for k, r in enumerate(ds.records)]
    metrics = score_predictions(preds, ds, METRICS)
    for p in preds:
        if p.index in right:  # every n-gram in a reference, and the closest reference as long: BLEU 1
            for n in (1, 2, 3, 4):
                assert p.scores[f"Bleu_{n}"] == pytest.approx(1.0, abs=1e-6)
            assert p.scores["CIDEr"] > 1.0
        else:
            assert p.scores["Bleu_1"] == pytest.approx(0.0, abs=1e-6) and p.scores["CIDEr"] == 0.0
    # the corpus scores: coco-caption's, between the all-wrong and all-right captions
    candidates = {p.image_id: p.caption for p in preds}
    references = {r.image_id: r.raw for r in ds.records}
    expected = score_captions(candidates, references, metrics=METRICS)
    assert {k: metrics[k] for k in expected.overall} == expected.overall
    assert [{k: p.scores[k] for k in METRIC_KEYS} for p in preds] == [expected.per_image[p.image_id] for p in preds]
    assert all(set(p.scores) - METRIC_KEYS == {"CHAIR_i", "CHAIR_s", "hallucinated"} for p in preds)  # `shapes`
    assert 0.0 < metrics["Bleu_4"] < 1.0 and 0.0 < metrics["CIDEr"]
    assert metrics["tokenizer"] == expected.tokenizer and "skipped" not in metrics
    assert metrics["num_images"] == 12 and metrics["skipped_images"] == 0
    # caption diversity: 6 distinct right captions and the one wrong caption
    assert metrics["distinct_captions"] == pytest.approx(7 / 12)
    assert metrics["vocabulary_used"] == len({w for p in preds for w in p.words})
    # `shapes` has object boxes: attention correctness over the words that name an object
    named = sum(w in ds.records[p.index].word_boxes for p in preds for w in p.words)
    assert named > 0 and metrics["attention_words"] == named
    assert 0.0 < metrics["attention_correctness"] < 1.0  # uniform maps: part of the mass on the object


def test_one_caption_for_most_images_is_said_in_one_line_and_named_in_the_scores(split, caplog):
    _, ds = split
    same = ["a", "red", "circle"]
    words = [same if k < 7 else list(ds.records[k].captions[0]) for k in range(len(ds))]  # 7 of 12 the same
    preds = [Prediction(k, r.image_id, w, _uniform(w)) for k, (r, w) in enumerate(zip(ds.records, words))]
    with caplog.at_level("WARNING", logger="captioning.evaluation.split"):
        metrics = score_predictions(preds, ds, METRICS)  # the shipped eval.collapse_share, 0.5
    assert metrics["collapsed_caption"] == "a red circle" and metrics["top_caption_share"] == pytest.approx(7 / 12)
    [line] = [r.getMessage() for r in caplog.records if "collapsed" in r.getMessage()]
    assert line.startswith('one caption for 58% of the 12 images (over eval.collapse_share=0.5): "a red circle"')
    caplog.clear()
    with caplog.at_level("WARNING", logger="captioning.evaluation.split"):
        assert "collapsed_caption" not in score_predictions(preds, ds, METRICS, collapse_share=0.6)
    assert not [r for r in caplog.records if "collapsed" in r.getMessage()]


# ------------------------------------------------------------------------------------------------
# EvalSettings
# ------------------------------------------------------------------------------------------------
def test_eval_settings_read_an_eval_config():
    shipped = OmegaConf.load(CONF_DIR / "eval" / "default.yaml")
    assert EvalSettings.of(shipped) == EvalSettings.shipped()
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(EvalSettings))  # the YAML's, no others
    cfg = OmegaConf.merge(shipped, {"split": "val", "beam_size": "5", "max_len": 12, "length_penalty": 1,
                                    "batch_size": 7, "metrics": ["bleu", "cider"], "num_figures": "0",
                                    "report": False, "instances": "instances.json", "compile": True})
    ev = EvalSettings.of(cfg)
    assert ev == EvalSettings("val", 5, 12, 1.0, 7, ("bleu", "cider"), 0, False, "instances.json", True, None, None,
                             0.5, True)
    assert isinstance(ev.beam_size, int) and isinstance(ev.length_penalty, float) and isinstance(ev.metrics, tuple)
    # keys an older config lacks take the shipped YAML's values; an empty instances path is none
    older = OmegaConf.create({k: v for k, v in OmegaConf.to_container(shipped).items()
                              if k not in ("report", "instances", "compile", "collapse_share")})
    assert EvalSettings.of(older) == EvalSettings.shipped()
    assert EvalSettings.of(OmegaConf.merge(shipped, {"instances": ""})).instances is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.beam_size = 3  # type: ignore[misc]


@pytest.mark.parametrize("key, value", [("beam_size", "three"), ("max_len", "twenty"), ("length_penalty", "high"),
                                        ("batch_size", None), ("num_figures", [4]),
                                        ("collapse_share", "half"), ("collapse_share", 1.5), ("collapse_share", -0.1)])
def test_eval_settings_refuse_a_value_of_the_wrong_kind(key, value):
    cfg = OmegaConf.merge(OmegaConf.load(CONF_DIR / "eval" / "default.yaml"), {key: value})
    with pytest.raises((ValueError, TypeError)):
        EvalSettings.of(cfg)


def test_eval_settings_refuse_a_section_without_a_required_key():
    shipped = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "eval" / "default.yaml"))
    for key in ("split", "beam_size", "max_len", "length_penalty", "batch_size", "metrics", "num_figures"):
        with pytest.raises(AttributeError, match=key):
            EvalSettings.of(OmegaConf.create({k: v for k, v in shipped.items() if k != key}))


# ------------------------------------------------------------------------------------------------
# evaluate_split
# ------------------------------------------------------------------------------------------------
def test_evaluate_split_writes_the_scores_it_returns(split, tmp_path):
    model, ds = split
    ev = EvalSettings.shipped(split="test", beam_size=2, max_len=6, batch_size=5, metrics=METRICS, num_figures=1,
                              report=False)
    metrics = evaluate_split(model, ds, ev, tmp_path / "out", before={"epochs": 3}, after={"seconds": 1.5})
    preds = decode_split(model, ds, beam_size=2, max_len=6, batch_size=5, progress=False)
    scores = score_predictions(preds, ds, METRICS)
    expected = {"epochs": 3, "split": "test", "beam_size": 2, **scores, "seconds": 1.5}  # before, scores, after
    assert list(metrics) == list(expected) and all(_same(metrics[k], v) for k, v in expected.items())
    out = tmp_path / "out"
    written = json.loads((out / "metrics.json").read_text())
    assert list(written) == list(metrics) and all(_same(metrics[k], written[k]) for k in metrics)
    results = json.loads((out / "results.json").read_text())
    assert results == [{"image_id": p.image_id, "caption": p.caption} for p in preds]  # data set order
    per_image = json.loads((out / "per_image_scores.json").read_text())
    assert [row["image_id"] for row in per_image] == [r.image_id for r in ds.records]
    for row, p in zip(per_image, preds):
        assert row["references"] == ds.records[p.index].raw
        assert {k: row[k] for k in p.scores} == p.scores
    assert [f.name for f in (out / "figures").glob("*.png")] == ([f"{preds[0].image_id}.png"] if preds[0].words
                                                                 else [])
    assert not (out / "report.html").exists()  # eval.report=false


def test_evaluate_split_scores_what_its_decode_gives_and_nothing_where_it_gives_none(split, tmp_path):
    model, ds = split
    ev = EvalSettings.shipped(beam_size=1, metrics=METRICS, num_figures=0, report=False)
    seen = []

    def references(m, d, e):  # each image captioned with its first reference, as a tuple
        seen.append((m, d, e))
        return tuple(Prediction(k, r.image_id, list(r.captions[0]), _uniform(r.captions[0]))
                     for k, r in enumerate(d.records))

    metrics = evaluate_split(model, ds, ev, tmp_path / "out", decode=references)
    assert seen == [(model, ds, ev)]
    assert metrics["Bleu_1"] == pytest.approx(1.0, abs=1e-6) and metrics["num_images"] == 12
    assert metrics["distinct_captions"] == 1.0
    assert json.loads((tmp_path / "out" / "results.json").read_text())[0]["caption"] == " ".join(ds.records[0].captions[0])
    # under torchrun a rank other than 0 gets None from its decode: it neither scores nor writes
    assert evaluate_split(model, ds, ev, tmp_path / "rank1", decode=lambda m, d, e: None) is None
    assert not (tmp_path / "rank1").exists()
