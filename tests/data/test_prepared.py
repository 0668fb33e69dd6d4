"""Prepared captions: the same data sets as reading the annotations, reused while the settings hold, rebuilt when
anything that decides their content changes, never used half-written or damaged."""

from __future__ import annotations

import json
import logging
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from synthetic_text import karpathy_file

from captioning.base.lock import LOCK_NAME
from captioning.data.dataset import CaptionDataset
from captioning.data.prepared import store as prepared
from captioning.data.prepared.arrays import SplitView, caption_counts, caption_lengths
from captioning.data.readers.karpathy import read_karpathy_splits
from captioning.data.vocab import Vocabulary
from captioning.factory.datasets import build_datasets, load_table

SPLITS = ("train", "val", "test")


def _karpathy(tmp_path: Path, seed: int = 0) -> Path:
    """A small generated Karpathy file (restval included) with sizes and word boxes on a few entries."""
    data = karpathy_file({"train": 40, "restval": 10, "val": 8, "test": 8}, seed=seed)
    for n, img in enumerate(data["images"][:5]):
        img["height"], img["width"] = 480, 640 + n
        img["word_boxes"] = {"man": [[0.1, 0.2, 0.3, 0.4]]}
    data["images"][3]["sentences"][0] = {"raw": "A Café, with no tokens given!"}  # tokenised by the reader
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(data))
    return path


def _sets(tmp_path: Path) -> list[Path]:
    """What tmp_path/prepared holds but its lock file: the sets, and any temporary folder."""
    return [p for p in (tmp_path / "prepared").iterdir() if p.name != LOCK_NAME]


def _cfg(annotations: Path, folder: Path | None, **extra) -> dict:
    return {"reader": {"_target_": "karpathy", "annotations": str(annotations),
                       "image_root": str(annotations.parent / "images"), **extra},
            "prepared": str(folder) if folder else None, "min_word_freq": 2, "max_vocab": None}


def _same_records(view, records) -> None:
    assert len(view) == len(records)
    for got, want in zip(view, records):
        assert got == want  # id, path, tokens, raw, word boxes, size


def _same_datasets(a: CaptionDataset, b: CaptionDataset) -> None:
    assert len(a) == len(b)
    assert caption_counts(a.encoded).tolist() == caption_counts(b.encoded).tolist()
    words = [len(c) - 2 for i in range(len(b)) for c in b.encoded[i]]
    assert caption_lengths(a.encoded).tolist() == caption_lengths(b.encoded).tolist() == words
    part = [len(c) - 2 for i in range(2, min(5, len(b))) for c in b.encoded[i]]
    assert caption_lengths(a.encoded[2:5]).tolist() == part  # a view of some images (e.g. a shard)
    for i in range(len(a)):
        assert [c.tolist() for c in a.encoded[i]] == [c.tolist() for c in b.encoded[i]]
        assert all(c.dtype == torch.int64 for c in a.encoded[i])
        assert a.records[i] == b.records[i]


@pytest.mark.parametrize("source", ["shapes", "karpathy"])
def test_prepared_captions_equal_the_read_ones_caption_for_caption(source, shapes_json, tmp_path):
    path = shapes_json if source == "shapes" else _karpathy(tmp_path)
    image_root = path.parent if source == "shapes" else path.parent / "images"
    records = read_karpathy_splits(SPLITS, path, image_root)
    cfg = {"reader": {"_target_": "karpathy", "annotations": str(path),
                      "image_root": str(image_root)}, "prepared": str(tmp_path / "prepared")}
    for _ in range(2):  # built, then opened memory-mapped
        table = load_table(cfg)
        for s in SPLITS:
            _same_records(table.split(s), records[s])
        for min_freq, max_size in ((1, None), (2, None), (1, 10), (3, 25)):
            assert table.vocabulary(min_freq, max_size) == Vocabulary.build(
                (c for r in records["train"] for c in r.captions), min_freq, max_size)
        vocab = table.vocabulary(2, None)
        for max_len in (3, 20):
            for s in SPLITS:
                _same_datasets(CaptionDataset(table.split(s), vocab, transform=None, max_len=max_len),
                               CaptionDataset(records[s], vocab, transform=None, max_len=max_len))
    assert isinstance(table.splits["train"].tokens, np.memmap)


def test_build_datasets_gives_the_same_data_with_and_without_prepared(shapes_json, tmp_path):
    from omegaconf import OmegaConf

    base = {"reader": {"_target_": "karpathy", "annotations": str(shapes_json),
                       "image_root": str(shapes_json.parent)}, "min_word_freq": 1, "max_vocab": None,
            "max_caption_len": 7, "captions_per_image": None}
    vocab_a, plain = build_datasets(OmegaConf.create({**base, "prepared": None}), transform=None)
    vocab_b, fast = build_datasets(OmegaConf.create({**base, "prepared": str(tmp_path / "p")}), transform=None)
    assert vocab_a == vocab_b
    assert isinstance(fast["train"].records, SplitView) and isinstance(plain["train"].records, list)
    for s in SPLITS:
        _same_datasets(fast[s], plain[s])
    # A checkpoint's vocabulary (another min_word_freq) encodes the prepared words as it encodes the read ones.
    other = Vocabulary.build([["a", "red", "square"], ["zzz"]])
    _, plain = build_datasets(OmegaConf.create({**base, "prepared": None}), None, ["test"], vocab=other)
    _, fast = build_datasets(OmegaConf.create({**base, "prepared": str(tmp_path / "p")}), None, ["test"], vocab=other)
    _same_datasets(fast["test"], plain["test"])


def test_a_matching_set_is_reused_without_reading_the_annotations(tmp_path, monkeypatch, caplog):
    path = _karpathy(tmp_path)
    cfg = _cfg(path, tmp_path / "prepared")
    first = load_table(cfg)
    monkeypatch.setattr("captioning.data.readers.karpathy.read_entries", lambda *a, **k: pytest.fail("read the file again"))
    os.utime(path, ns=(1, 1))  # a new mtime alone: the file is hashed again and found unchanged
    with caplog.at_level(logging.INFO, "captioning.data.prepared.store"):
        again = load_table({**cfg, "min_word_freq": 5})  # applied on open: not part of the content
    assert "opened" in caplog.text and "building" not in caplog.text
    assert again.words == first.words and len(list(_sets(tmp_path))) == 1


@pytest.mark.parametrize("change", ["file content", "image_root", "tokenizer", "format"])
def test_each_setting_that_decides_the_content_rebuilds_it_and_says_why(change, tmp_path, monkeypatch, caplog):
    path = _karpathy(tmp_path)
    cfg = _cfg(path, tmp_path / "prepared")
    before = load_table(cfg)
    expected = read_karpathy_splits(SPLITS, path, path.parent / "images")
    if change == "file content":
        data = json.loads(path.read_text())
        data["images"][0]["sentences"][0] = {"raw": "a brand new caption", "tokens": ["a", "brand", "new", "caption"]}
        path.write_text(json.dumps(data))
        expected = read_karpathy_splits(SPLITS, path, path.parent / "images")
        why = "sources.annotations.sha256"
    elif change == "image_root":
        cfg["reader"]["image_root"] = str(tmp_path / "elsewhere")
        expected = read_karpathy_splits(SPLITS, path, tmp_path / "elsewhere")
        why = "reader.image_root"
    elif change == "tokenizer":
        monkeypatch.setattr(prepared, "tokenizer_id", lambda: "another tokenizer")
        why = "tokenizer"
    else:
        monkeypatch.setattr(prepared, "FORMAT", "captioning-prepared/v0")
        why = "format"
    with caplog.at_level(logging.INFO, "captioning.data.prepared.store"):
        after = load_table(cfg)
    assert "building" in caplog.text and why in caplog.text, caplog.text
    for s in SPLITS:
        _same_records(after.split(s), expected[s])
    if change == "file content":  # the set of the file's earlier content cannot match again: removed
        assert len([p for p in _sets(tmp_path)]) == 1
        assert after.split("train")[0].raw[0] == "a brand new caption" != before.split("train")[0].raw[0]


def test_coco_reader_settings_are_part_of_the_content():
    spec = {"_target_": "coco", "num_val": 5000}
    files = {"train_captions": {"path": "/x", "sha256": "0" * 64}}
    assert prepared.content_key(spec, files) != prepared.content_key({**spec, "num_val": 4000}, files)
    assert prepared._differences(prepared.content_key({**spec, "num_val": 4000}, files),
                                 prepared.content_key(spec, files)) == ["reader.num_val: 5000 -> 4000"]


@pytest.mark.parametrize("damage", ["truncated array", "missing array", "garbled offsets", "manifest of other data"])
def test_a_damaged_set_is_rebuilt(damage, tmp_path, caplog):
    path = _karpathy(tmp_path)
    cfg = _cfg(path, tmp_path / "prepared")
    load_table(cfg)
    (folder,) = [p for p in _sets(tmp_path)]
    if damage == "truncated array":
        f = folder / "train.tokens.npy"
        f.write_bytes(f.read_bytes()[:-40])
    elif damage == "missing array":
        (folder / "val.raw_offsets.npy").unlink()
    elif damage == "garbled offsets":  # same size, wrong values: the consistency check catches it
        offsets = np.load(folder / "test.caption_offsets.npy")
        np.save(folder / "test.caption_offsets.npy", offsets[::-1].copy())
    else:
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["content"]["reader"]["image_root"] = "/elsewhere"
        (folder / "manifest.json").write_text(json.dumps(manifest))
    with caplog.at_level(logging.INFO, "captioning.data.prepared.store"):
        table = load_table(cfg)
    assert "damaged" in caplog.text and "built" in caplog.text
    expected = read_karpathy_splits(SPLITS, path, path.parent / "images")
    for s in SPLITS:
        _same_records(table.split(s), expected[s])
    caplog.clear()
    with caplog.at_level(logging.INFO, "captioning.data.prepared.store"):
        load_table(cfg)
    assert "opened" in caplog.text


def test_a_half_written_set_is_never_used(tmp_path, monkeypatch):
    path = _karpathy(tmp_path)
    cfg = _cfg(path, tmp_path / "prepared")

    def killed(self, folder):  # what a kill in the middle of writing leaves: some arrays, no manifest
        np.save(folder / "words.npy", np.zeros(3))
        raise KeyboardInterrupt

    monkeypatch.setattr("captioning.data.prepared.arrays.CaptionTable.save", killed)
    with pytest.raises(KeyboardInterrupt):
        load_table(cfg)
    monkeypatch.undo()
    assert not any((p / "manifest.json").exists() for p in _sets(tmp_path))
    table = load_table(cfg)
    _same_records(table.split("test"), read_karpathy_splits(["test"], path, path.parent / "images")["test"])


def test_an_unwritable_folder_keeps_the_captions_in_memory_with_a_warning(tmp_path, monkeypatch, caplog):
    path = _karpathy(tmp_path)
    monkeypatch.setattr(prepared, "_write", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with caplog.at_level(logging.WARNING, "captioning.data.prepared.store"):
        table = load_table(_cfg(path, tmp_path / "prepared"))
    assert "could not be written" in caplog.text and "No space left" in caplog.text
    _same_records(table.split("val"), read_karpathy_splits(["val"], path, path.parent / "images")["val"])


def test_write_false_only_opens_an_existing_set(tmp_path):
    path = _karpathy(tmp_path)
    cfg = _cfg(path, tmp_path / "prepared")
    load_table(cfg, write=False)
    assert not (tmp_path / "prepared").exists()
    load_table(cfg)
    assert isinstance(load_table(cfg, write=False).splits["val"].tokens, np.memmap)


def test_views_slice_and_pickle_as_their_folder(tmp_path):
    path = _karpathy(tmp_path)
    table = load_table(_cfg(path, tmp_path / "prepared"))
    view, records = table.split("train"), read_karpathy_splits(["train"], path, path.parent / "images")["train"]
    _same_records(view[1::3], records[1::3])  # what distributed training gives each rank
    assert view.image_ids == [r.image_id for r in records]
    vocab = table.vocabulary(1, None)
    ds = CaptionDataset(view, vocab, transform=None, max_len=20)
    blob = pickle.dumps(ds)
    assert len(blob) < 20_000  # the arrays travel as their folder's path, not as bytes (spawned workers)
    back = pickle.loads(blob)
    _same_datasets(back, ds)
    _same_datasets(CaptionDataset(view[1::3], vocab, None, 20), CaptionDataset(records[1::3], vocab, None, 20))


def test_a_set_without_its_manifest_is_replaced_and_one_finished_meanwhile_is_kept(tmp_path, caplog):
    path = _karpathy(tmp_path)
    cfg = _cfg(path, tmp_path / "prepared")
    load_table(cfg)
    (folder,) = [p for p in _sets(tmp_path)]
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").unlink()  # e.g. removed by hand: the arrays alone are never trusted
    with caplog.at_level(logging.INFO, "captioning.data.prepared.store"):
        table = load_table(cfg)
    assert "building" in caplog.text and "built" in caplog.text and (folder / "manifest.json").is_file()
    _same_records(table.split("val"), read_karpathy_splits(["val"], path, path.parent / "images")["val"])
    # Another job of a sweep finished the same set while this one was building it: that set is kept as it is.
    before = (folder / "manifest.json").stat().st_mtime_ns
    assert prepared._write(table, tmp_path / "prepared", folder.name, manifest["content"], manifest["files"]) == folder
    assert (folder / "manifest.json").stat().st_mtime_ns == before
    assert [p.name for p in _sets(tmp_path)] == [folder.name]  # no temporary folder left
