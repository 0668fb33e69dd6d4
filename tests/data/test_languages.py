"""Captions in other languages (`dataset.tokenizer`: ptb | whitespace | char): the rules on hand-tokenized Chinese,
Japanese and mixed text, scoring on those tokens, METEOR and SPICE skipped, ptb unchanged, the setting checked and
recorded, and a small Chinese table data set that trains, decodes and scores."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from fixtures import compose_config, tiny_overrides

from captioning.checkpoint import checkpoint_vocabulary, read_checkpoint
from captioning.config.schema import ConfigError, validate_train_config
from captioning.data.dataset import CaptionDataset
from captioning.data.prepared import store
from captioning.data.readers.convert import write_karpathy
from captioning.data.readers.karpathy import read_karpathy_splits
from captioning.data.readers.records import SPLITS, ImageRecord
from captioning.data.readers.table import read_table
from captioning.data.tokenizers import CAPTION_TOKENIZERS, DEFAULT_TOKENIZER, char_words, whitespace_words, words_of
from captioning.data.vocab import Vocabulary, tokenize
from captioning.factory.datasets import load_table
from captioning.metrics import CiderD, bleu, rouge_l, score_captions
from captioning.runtime import CONF_DIR
from captioning.tools.score import score_files
from captioning.train import train
from captioning.training.objectives import SelfCritical
from captioning.training.scst.rewards import CaptionReward


# -- the rules, on hand-tokenized text ------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "words"), [
    ("红色的圆形。", ["红", "色", "的", "圆", "形"]),  # every character a token, punctuation dropped
    ("一只猫在沙发上睡觉，旁边有一个球！", ["一", "只", "猫", "在", "沙", "发", "上", "睡", "觉", "旁", "边", "有", "一",
                                         "个", "球"]),
    ("我的iPhone 12很好", ["我", "的", "iphone", "12", "很", "好"]),  # ASCII letters and digits: one token a run
    ("ＯＫ，３只猫", ["ok", "3", "只", "猫"]),  # NFKC: full-width letters, digits and comma become ASCII
    ("赤いりんごとバナナ・ケーキ。", ["赤", "い", "り", "ん", "ご", "と", "バ", "ナ", "ナ", "ケ", "ー", "キ"]),  # ・ P*
    ("「こんにちは」と言った", ["こ", "ん", "に", "ち", "は", "と", "言", "っ", "た"]),
    ("3+4=7°", ["3", "+", "4", "=", "7", "°"]),  # symbols (S*) stay, one a token
    ("Café au lait", ["caf", "é", "au", "lait"]),  # only ASCII letters make runs
    ("  \n ", []),
])
def test_char_splits_every_character_and_keeps_ascii_runs(text, words):
    assert char_words(text) == words
    assert words_of("char")(text) == words


@pytest.mark.parametrize(("text", "words"), [
    ("一只 红色的 猫 , 在 “睡觉”。", ["一只", "红色的", "猫", "在", "睡觉"]),  # pre-segmented Chinese
    ("Hello-World, it's 3.5 Ｋｍ", ["hello", "world", "it", "s", "3", "5", "km"]),  # every P* a space
    ("고양이가 소파에서 잔다.", ["고양이가", "소파에서", "잔다"]),
    ("Một con mèo\tđang ngủ", ["một", "con", "mèo", "đang", "ngủ"]),
])
def test_whitespace_splits_at_spaces_and_punctuation(text, words):
    assert whitespace_words(text) == words


def test_ptb_is_the_treebank_tokenizer_of_before_and_an_unknown_rule_is_refused():
    assert words_of("ptb") is tokenize and DEFAULT_TOKENIZER == "ptb"
    assert words_of("ptb")("A dog, running.") == ["a", "dog", "running"]
    with pytest.raises(ValueError, match=r"^unknown caption tokenizer 'jieba'; choose one of ptb, whitespace, char$"):
        words_of("jieba")


def test_the_shipped_default_is_the_library_default():
    base = (CONF_DIR / "dataset" / "_base.yaml").read_text()
    assert f"\ntokenizer: {DEFAULT_TOKENIZER} " in base
    for reader in (CONF_DIR / "dataset" / "reader").glob("*.yaml"):
        assert "\ntokenizer: ${..tokenizer} " in reader.read_text(), reader  # every reader takes the one setting


# -- scoring --------------------------------------------------------------------------------------------------------
CANDIDATES = {1: "红 色 的 圆 形", 2: "蓝色的方形在左边", 3: "黄色的十字"}
REFERENCES = {1: ["红色的圆形。", "一个红色的圆形"], 2: ["蓝色的方形在绿色的圆形左边", "左边是蓝色的方形！"],
              3: ["黄色的三角形", "一个黄色的十字。"], 4: ["没有候选的图片"]}
# The same captions tokenized by hand: each character a token, punctuation gone, image 4 not scored.
HAND_CANDIDATES = {1: ["红 色 的 圆 形"], 2: ["蓝 色 的 方 形 在 左 边"], 3: ["黄 色 的 十 字"]}
HAND_REFERENCES = {1: ["红 色 的 圆 形", "一 个 红 色 的 圆 形"],
                   2: ["蓝 色 的 方 形 在 绿 色 的 圆 形 左 边", "左 边 是 蓝 色 的 方 形"],
                   3: ["黄 色 的 三 角 形", "一 个 黄 色 的 十 字"]}


def test_chinese_is_scored_on_the_char_tokens_exactly_as_on_hand_tokens():
    scores = score_captions(CANDIDATES, REFERENCES, metrics=("bleu", "rouge", "cider"), tokenizer="char")
    bleu_n, bleu_per_image = bleu(HAND_REFERENCES, HAND_CANDIDATES)
    rouge, rouge_per_image = rouge_l(HAND_REFERENCES, HAND_CANDIDATES)
    cider, cider_per_image = CiderD(HAND_REFERENCES).score({k: c[0] for k, c in HAND_CANDIDATES.items()})
    assert scores.tokenizer == "char" and not scores.skipped
    assert [scores.overall[f"Bleu_{n}"] for n in range(1, 5)] == bleu_n
    assert (scores.overall["ROUGE_L"], scores.overall["CIDEr"]) == (rouge, cider)
    for k, key in enumerate(CANDIDATES):
        assert scores.per_image[key]["Bleu_4"] == bleu_per_image[3][k]
        assert (scores.per_image[key]["ROUGE_L"], scores.per_image[key]["CIDEr"]) == (rouge_per_image[k],
                                                                                       cider_per_image[k])
    assert scores.per_image[1]["Bleu_4"] > 0.99  # spaces in a candidate (the model's words) change nothing
    ptb = score_captions(CANDIDATES, REFERENCES, metrics=("bleu",), tokenizer="python")
    assert ptb.overall["Bleu_1"] < scores.overall["Bleu_1"]  # PTB: a Chinese caption is one or a few "words"


def test_meteor_and_spice_are_skipped_in_one_line_for_other_languages(monkeypatch):
    import captioning.metrics.coco as coco

    monkeypatch.setattr(coco, "java_score", lambda *a: pytest.fail("no Java scorer runs for char captions"))
    scores = score_captions(CANDIDATES, REFERENCES, metrics=("bleu", "meteor", "spice"), tokenizer="char")
    assert set(scores.skipped) == {"METEOR", "SPICE"} and "METEOR" not in scores.overall
    assert scores.skipped["METEOR"] == ("METEOR is English-only and the captions are split with tokenizer=char "
                                        "(dataset.tokenizer, captioning-score --tokenizer); score them with bleu, "
                                        "rouge and cider")
    assert all("\n" not in reason for reason in scores.skipped.values())
    assert scores.overall["Bleu_4"] > 0


def test_ptb_scores_as_before():
    english = {1: "A red circle.", 2: "two  shapes, a cross"}
    refs = {1: ["a red circle", "A small red circle!"], 2: ["There are two shapes: a cross and a square."]}
    before = score_captions(english, refs, metrics=("bleu", "rouge", "cider"))  # the default: "auto"
    now = score_captions(english, refs, metrics=("bleu", "rouge", "cider"), tokenizer="ptb")  # dataset.tokenizer's
    assert (now.overall, now.per_image, now.tokenizer) == (before.overall, before.per_image, before.tokenizer)
    assert now.tokenizer in ("ptb-java", "python")
    with pytest.raises(ValueError, match=r"unknown tokenizer 'jieba'"):
        score_captions(english, refs, tokenizer="jieba")


def test_the_scst_reward_splits_references_by_the_data_sets_rule():
    raw = [REFERENCES[1], REFERENCES[3]]
    reward = CaptionReward(raw, end_token=False, tokenizer="char")
    assert reward.references == [HAND_REFERENCES[1], HAND_REFERENCES[3]]
    same = CaptionReward(raw, end_token=False, tokenizer="ptb")
    assert same.references == [["红色的圆形 。", "一个红色的圆形"], ["黄色的三角形", "一个黄色的十字 。"]]  # as before
    assert reward.cider_d([0], ["红 色 的 圆 形"])[0] > same.cider_d([0], ["红 色 的 圆 形"])[0]


def test_self_critical_training_rewards_by_the_rule_of_its_training_split():
    records = [ImageRecord(1, Path("a.png"), [char_words(c) for c in REFERENCES[1]], REFERENCES[1], tokenizer="char")]
    scst = SelfCritical()
    scst.prepare(CaptionDataset(records, Vocabulary.build(records[0].captions), lambda x: x))
    assert scst.reward is not None
    assert scst.reward.references == [[f"{r} <end>" for r in HAND_REFERENCES[1]]]


# -- the setting: checked, in the prepared key, recorded --------------------------------------------------------------
def test_the_schema_refuses_an_unknown_tokenizer_in_one_line():
    with pytest.raises(ConfigError) as err:
        validate_train_config(compose_config("dataset=shapes", "dataset.tokenizer=jieba"))
    assert err.value.problems == [("dataset.tokenizer", "='jieba': choose one of ptb, whitespace, char")]
    with pytest.raises(ConfigError) as err:
        validate_train_config(compose_config("dataset=shapes", "dataset.reader.tokenizer=char"))
    assert [key for key, _ in err.value.problems] == ["dataset.reader.tokenizer"]
    assert "differs from dataset.tokenizer='ptb': set dataset.tokenizer only" in str(err.value)
    for name in CAPTION_TOKENIZERS:
        validate_train_config(compose_config("dataset=shapes", f"dataset.tokenizer={name}"))


def test_ptb_keeps_the_prepared_key_of_before_and_other_rules_get_their_own():
    files = {"annotations": {"path": "/x", "sha256": "0" * 64}}
    spec = {"_target_": "table", "annotations": "/x"}
    before = store.content_key(spec, files)
    assert store.content_key({**spec, "tokenizer": "ptb"}, files) == before
    assert before["tokenizer"] == store.tokenizer_id() and "tokenizer" not in before["reader"]
    char, space = (store.content_key({**spec, "tokenizer": t}, files) for t in ("char", "whitespace"))
    assert len({store._digest(k) for k in (before, char, space)}) == 3
    assert char["tokenizer"] == "char-v1/nfkc/lower/no-punctuation" and char["reader"]["tokenizer"] == "char"


def test_a_checkpoints_vocabulary_names_its_tokenizer_and_refuses_captions_of_another():
    words = ["<pad>", "<start>", "<end>", "<unk>", "红"]
    assert checkpoint_vocabulary({"vocab": words, "config": {"dataset": {"tokenizer": "char"}}}, "a.pt").tokenizer \
        == "char"
    assert checkpoint_vocabulary({"vocab": words, "config": {"dataset": {"name": "old"}}}, "a.pt").tokenizer == "ptb"
    with pytest.raises(ValueError, match=r"checkpoint a\.pt: dataset\.tokenizer='x' names no tokenizer"):
        checkpoint_vocabulary({"vocab": words, "config": {"dataset": {"tokenizer": "x"}}}, "a.pt")
    records = [ImageRecord(1, Path("a.png"), [["红"]], ["红"], tokenizer="char")]
    assert CaptionDataset(records, Vocabulary(words), lambda x: x).tokenizer == "char"  # built here: not stated
    assert CaptionDataset(records, Vocabulary(words, "char"), lambda x: x).tokenizer == "char"
    with pytest.raises(ValueError, match=r"^the vocabulary \(a checkpoint's\) was made with dataset.tokenizer=ptb, "
                       r"this data set's captions with char: set dataset.tokenizer=ptb$"):
        CaptionDataset(records, Vocabulary(words, "ptb"), lambda x: x)


# -- a Chinese table data set -----------------------------------------------------------------------------------------
# The `shapes` captions word by word in Chinese (no spaces, a full stop): "the red cross is above the small red
# circle" -> "红色的十字是上方小红色的圆形。".
ZH = {"a": "", "an": "", "the": "", "to": "", "of": "的", "and": "和", "is": "是", "are": "是", "sits": "位于",
      "on": "在", "there": "有", "including": "包括", "noisy": "嘈杂的", "background": "背景", "shapes": "形状",
      "picture": "图片", "image": "图像", "drawing": "绘画", "two": "两个", "three": "三个", "red": "红色的",
      "green": "绿色的", "blue": "蓝色的", "yellow": "黄色的", "small": "小", "large": "大", "circle": "圆形",
      "square": "方形", "triangle": "三角形", "cross": "十字", "left": "左边", "right": "右边", "above": "上方",
      "below": "下方", "under": "下面", "next": "旁边", "with": "和"}


def chinese_table(shapes_json: Path, out: Path) -> Path:
    """The shapes_json set's images and captions, the captions in Chinese, as a CSV table with a split column."""
    data = json.loads(shapes_json.read_text())
    with out.open("w", newline="", encoding="utf-8") as f:
        rows = csv.writer(f)
        rows.writerow(["image", "caption", "split"])
        for image in data["images"]:
            for sentence in image["sentences"]:
                caption = "".join(ZH[w] for w in sentence["tokens"]) + "。"
                rows.writerow([f"{image['filepath']}/{image['filename']}", caption, image["split"]])
    return out


def test_a_chinese_table_reads_to_char_tokens_through_a_prepared_set(shapes_json, tmp_path):
    table = chinese_table(shapes_json, tmp_path / "zh.csv")
    records = read_table(SPLITS, table, shapes_json.parent, tokenizer="char")
    first = records["train"][0]
    assert first.tokenizer == "char" and first.captions[0] == char_words(first.raw[0])
    assert all(len(w) == 1 for r in records["train"] for c in r.captions for w in c)
    spec = {"_target_": "table", "annotations": str(table), "image_root": str(shapes_json.parent),
            "tokenizer": "char"}
    for _ in range(2):  # the prepared set, written, then opened memory-mapped
        prepared = load_table({"reader": spec, "prepared": str(tmp_path / "prepared")})
        assert prepared is not None and prepared.tokenizer == "char"
        view = prepared.split("train")
        assert view[0].tokenizer == "char" and view[0].captions == first.captions
    assert (next((tmp_path / "prepared").glob("*/tokenizer.json"))).read_text() == '"char"'


def test_karpathy_files_keep_their_tokens_for_ptb_only(shapes_json):
    ptb = read_karpathy_splits(["val"], shapes_json)["val"][0]
    char = read_karpathy_splits(["val"], shapes_json, tokenizer="char")["val"][0]
    assert ptb.tokenizer == "ptb" and ptb.captions[0] == ptb.raw[0].split()  # the file's own tokens
    assert char.tokenizer == "char" and char.captions[0] == char_words(char.raw[0])


def test_a_chinese_table_data_set_trains_decodes_and_scores(shapes_json, tmp_path):
    """The tiny run on the shapes images with Chinese captions, 16 epochs (about 8 s): the vocabulary, validation and
    the test's scores on characters (scored by PTB, a Chinese caption would be a word or two); evaluation and
    captioning-score --tokenizer char give the same numbers."""
    table = chinese_table(shapes_json, tmp_path / "zh.csv")
    out = tmp_path / "run"
    torch.manual_seed(0)
    train(compose_config(*tiny_overrides(tmp_path / "data", "dataset/reader=table", "dataset.generate=null",
                                         f"dataset.annotations={table}", f"dataset.image_root={shapes_json.parent}",
                                         "dataset.tokenizer=char", f"dataset.prepared={tmp_path / 'prepared'}",
                                         "trainer.max_epochs=16", "eval.num_figures=0", "eval.report=false",
                                         "eval.metrics=[bleu,meteor,rouge,cider]")), out)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["tokenizer"] == "char" and set(metrics["skipped"]) == {"METEOR"}
    assert metrics["Bleu_1"] > 0.3 and metrics["Bleu_4"] > 0 and metrics["CIDEr"] > 0.05  # 0.46 and 0.23 seen
    results = json.loads((out / "results.json").read_text())
    assert all(len(w) == 1 for r in results for w in r["caption"].split())  # the model's words are characters
    ckpt = read_checkpoint(out / "checkpoints" / "best.pt")
    vocab = checkpoint_vocabulary(ckpt, "best.pt")
    assert vocab.tokenizer == "char" and "红" in vocab.stoi and ckpt["config"]["dataset"]["tokenizer"] == "char"
    # the table as a Karpathy file, for captioning-score
    karpathy = write_karpathy(read_table(SPLITS, table, shapes_json.parent, tokenizer="char"), shapes_json.parent,
                              tmp_path / "dataset_zh.json")
    scored = score_files(karpathy, out / "results.json", ("bleu", "meteor", "rouge", "cider"), tokenizer="char")
    for name in ("Bleu_1", "Bleu_4", "ROUGE_L", "CIDEr"):
        assert scored[name] == pytest.approx(metrics[name], abs=1e-12), name
    assert scored["tokenizer"] == "char" and set(scored["skipped"]) == {"METEOR"}
