"""Your own data in a plain table: CSV and JSON Lines to image records, the seeded split, refusals naming the file,
line and field, and the round trip through a Karpathy split file."""

import json
import logging
import random
import re

import pytest
from fixtures import compose_config

from captioning.config.schema import validate_train_config
from captioning.data.readers.convert import to_karpathy, write_karpathy
from captioning.data.readers.karpathy import read_karpathy_splits
from captioning.data.readers.records import SPLITS, ImageRecord
from captioning.data.readers.table import read_table
from captioning.factory.datasets import load_records

CSV = """image,caption,split
photos/a.jpg,A dog runs.,train
b.jpg,A cat sleeps,val
photos/a.jpg,"Brown dog, running",train
c.jpg,Two birds,test
d.jpg,A red car,restval
"""


def _write(path, text, encoding="utf-8"):
    path.write_text(text, encoding=encoding)
    return path


def _summary(records):
    return [(r.image_id, r.path, r.captions, r.raw) for r in records]


def _table(tmp_path, n, name="t.csv"):
    """A CSV of `n` images (two captions each, rows interleaved), without a split column."""
    rows = [f"img{k:02d}.jpg,caption {w} of image {k}" for w in ("one", "two") for k in range(n)]
    return _write(tmp_path / name, "image,caption\n" + "\n".join(rows) + "\n")


def test_a_csv_with_a_split_column_reads_to_its_records(tmp_path):
    path = _write(tmp_path / "captions.csv", CSV)
    out = read_table(SPLITS, path)
    assert _summary(out["train"]) == [
        (1, tmp_path / "photos/a.jpg", [["a", "dog", "runs"], ["brown", "dog", "running"]],
         ["A dog runs.", "Brown dog, running"]),
        (4, tmp_path / "d.jpg", [["a", "red", "car"]], ["A red car"])]  # restval counts as train
    assert _summary(out["val"]) == [(2, tmp_path / "b.jpg", [["a", "cat", "sleeps"]], ["A cat sleeps"])]
    assert _summary(out["test"]) == [(3, tmp_path / "c.jpg", [["two", "birds"]], ["Two birds"])]
    assert list(read_table(["val"], path)) == ["val"]


def test_jsonl_with_ids_a_bom_blank_lines_and_an_image_root(tmp_path):
    lines = [{"image": "x/1.png", "caption": "  Ein Hund läuft.  ", "image_id": 70, "split": "test", "extra": 1},
             {"image": "x//./1.png", "caption": "A man's hat", "image_id": 70, "split": "test"},
             {"image": "2.png", "caption": "Sky", "image_id": 9, "split": "train"}]
    text = "\n\n".join(json.dumps(r, ensure_ascii=False) for r in lines) + "\n   \n"
    path = _write(tmp_path / "c.ndjson", "\ufeff" + text)
    out = read_table(["train", "test"], path, image_root=tmp_path / "imgs")
    assert _summary(out["test"]) == [(70, tmp_path / "imgs/x/1.png", [["ein", "hund", "läuft"], ["a", "man", "'s", "hat"]],
                                      ["Ein Hund läuft.", "A man's hat"])]
    assert _summary(out["train"]) == [(9, tmp_path / "imgs/2.png", [["sky"]], ["Sky"])]


def test_the_seeded_split_is_the_documented_rule_and_ignores_row_order(tmp_path):
    path = _table(tmp_path, 20)
    out = read_table(SPLITS, path, val_size=3, test_size=4, seed=7)
    assert [len(out[s]) for s in SPLITS] == [13, 3, 4]
    assert all(len(r.captions) == 2 for s in SPLITS for r in out[s])
    order = sorted(f"img{k:02d}.jpg" for k in range(20))
    random.Random(7).shuffle(order)
    assert [r.path.name for r in out["val"]] == sorted(order[:3])  # records keep the file's order
    assert [r.path.name for r in out["test"]] == sorted(order[3:7])
    assert [r.image_id for r in out["train"]] == sorted(int(n[3:5]) + 1 for n in order[7:])  # ids: first appearance
    reversed_rows = "image,caption\n" + "".join(reversed(path.read_text().splitlines(keepends=True)[1:]))
    again = read_table(SPLITS, _write(tmp_path / "r.csv", reversed_rows), val_size=3, test_size=4, seed=7)
    assert {s: sorted(r.path.name for r in again[s]) for s in SPLITS} == \
        {s: sorted(r.path.name for r in out[s]) for s in SPLITS}
    other = read_table(["val"], path, val_size=3, test_size=4, seed=8)["val"]
    assert [r.path for r in other] != [r.path for r in out["val"]]


def test_the_default_split_refuses_a_table_too_small_to_train_on(tmp_path):
    path = _table(tmp_path, 30)
    with pytest.raises(ValueError, match=r"t\.csv: split 'train' has no images \(the seeded split of its 30 images "
                       r"gives 0 to train, 30 to val and 0 to test with dataset\.reader\.val_size=1000 and "
                       r"test_size=1000; set those two"):
        read_table(["train"], path)
    assert [len(read_table(SPLITS, path, val_size=5, test_size=5)[s]) for s in SPLITS] == [20, 5, 5]
    with pytest.raises(ValueError, match=r"split 'test' has no images \(its 'split' column gives it none\)"):
        read_table(["test"], _write(tmp_path / "s.csv", "image,caption,split\na.jpg,a dog,train\n"))
    with pytest.raises(ValueError, match=r"read_table: val_size=-1: must be >= 0"):
        read_table(["train"], path, val_size=-1)


def test_empty_captions_and_captionless_images_are_skipped_and_counted(tmp_path, caplog):
    path = _write(tmp_path / "e.csv", "image,caption\na.jpg,...\na.jpg,A dog\nb.jpg,!!!\nc.jpg,A cat\n")
    with caplog.at_level(logging.WARNING):
        out = read_table(["train"], path, val_size=0, test_size=0)
    assert _summary(out["train"]) == [(1, tmp_path / "a.jpg", [["a", "dog"]], ["A dog"]),
                                      (3, tmp_path / "c.jpg", [["a", "cat"]], ["A cat"])]  # ids do not shift
    assert "skipped 2 captions with no words" in caplog.text
    assert "skipped 1 images with no caption left (e.g. b.jpg)" in caplog.text


H = "image,caption,split,image_id\n"
BAD = [  # (file name, content, line, field, what the message says)
    ("h.csv", "image,text\na.jpg,x\n", 1, None, "the header lacks the 'caption' column"),
    ("h.csv", "image,caption,Caption\na.jpg,x,y\n", 1, None, "the header names the 'caption' column twice"),
    ("e.csv", H + "a.jpg,a dog,train,1\n,a cat,train,2\n", 3, "image", "is empty"),
    ("e.csv", H + "a.jpg,a dog,train,1\nb.jpg,  ,train,2\n", 3, "caption", "is empty"),
    ("e.csv", "image,caption\na.jpg\n", 2, "caption", "is missing"),
    ("m.csv", H + 'a.jpg,"a dog\non two lines",train,1\nb.jpg,a cat,trian,2\n', 4, "split",
     "is 'trian': choose one of train, restval, val, test (did you mean 'train'?)"),
    ("i.csv", H + "a.jpg,a dog,train,x1\n", 2, "image_id", "must be an integer, got str 'x1'"),
    ("i.csv", H + "a.jpg,a dog,train,1\na.jpg,a cat,train,2\n", 3, "image_id", "2 differs from the id 1 that line 2 "
     "gives 'a.jpg'; one image has one id"),
    ("i.csv", H + "a.jpg,a dog,train,1\nb.jpg,a cat,train,1\n", 3, "image_id", "1 is already the id of 'a.jpg' "
     "(line 2); each image needs its own id"),
    ("s.csv", H + "a.jpg,a dog,train,1\na.jpg,a cat,val,1\n", 3, "split", "'val' differs from the split 'train' that "
     "line 2 gives 'a.jpg'; all rows of an image give one split"),
    ("s.csv", H + "a.jpg,a dog,,1\nb.jpg,a cat,val,2\n", 2, "split", "is missing (line 3 gives one)"),
    ("p.csv", H + "/etc/passwd,a dog,train,1\n", 2, "image", "must be a path relative to the image root"),
    ("p.csv", H + "C:\\photos\\a.jpg,a dog,train,1\n", 2, "image", "must be a path relative to the image root"),
    ("p.csv", H + "photos/../../a.jpg,a dog,train,1\n", 2, "image", "must stay under the image root (no '..')"),
    ("w.csv", H + "a.jpg,a dog, a cat,train,1\n", 2, None, "the row has 5 fields, the header 4"),
    ("c.jsonl", '{"image": "a.jpg", "caption": 5}\n', 1, "caption", "must be a string, got int 5"),
    ("c.jsonl", '{"image": "a.jpg", "caption": "x"}\n{"caption": "y"}\n', 2, "image", "is missing"),
    ("c.jsonl", '{"image": "a.jpg", "caption": "x", "image_id": 1.5}\n', 1, "image_id", "must be an integer, got float"),
    ("c.jsonl", '{"image": "a.jpg", "caption": "x", "image_id": true}\n', 1, "image_id", "must be an integer, got bool"),
    ("c.jsonl", '{"image": "a.jpg", "caption": "x"}\n\n{"image": "b.jpg", caption: 1}\n', 3, None, "not valid JSON"),
    ("c.jsonl", '{"image": "a.jpg", "caption": "x"}\n["b.jpg", "y"]\n', 2, None, "must be a JSON object with 'image' "
     "and 'caption', got list"),
]


@pytest.mark.parametrize("name, content, line, field, says", BAD)
def test_a_bad_row_is_refused_naming_the_file_line_and_field(tmp_path, name, content, line, field, says):
    path = _write(tmp_path / name, content)
    where = f"{path}: line {line}: " + (f"'{field}' " if field else "")
    with pytest.raises(ValueError, match=re.escape(where + says)):
        read_table(["train"], path, val_size=0, test_size=0)


def test_a_file_of_another_kind_or_encoding_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'c.txt'}: a caption table must be a .csv, .jsonl, "
                                                   ".ndjson file, got '.txt'")):
        read_table(["train"], _write(tmp_path / "c.txt", "image,caption\n"))
    latin = _write(tmp_path / "l.csv", "image,caption\nb.jpg,un caf\u00e9\n", encoding="latin-1")
    with pytest.raises(ValueError, match=re.escape(f"{latin}: line 2: not UTF-8 text (byte 26")):
        read_table(["train"], latin)
    with pytest.raises(FileNotFoundError, match="file not found: .*none.csv"):
        read_table(["train"], tmp_path / "none.csv")


def test_the_round_trip_through_a_karpathy_file_keeps_every_record(tmp_path):
    rows = ["image,caption,split", "photos/a.jpg,A dog runs.,train", "photos/sub/b.jpg,A cat sleeps,val",
            "c.jpg,Two birds,test", "photos/a.jpg,\"Brown dog, running\",restval", "d.jpg,A red car,train"]
    path = _write(tmp_path / "t.csv", "\n".join(rows) + "\n")
    root = tmp_path / "images"
    table = read_table(SPLITS, path, image_root=root)
    out = write_karpathy(table, root, tmp_path / "out" / "dataset_mine.json")
    data = json.loads(out.read_text())
    assert [(e["filepath"], e["filename"], e["cocoid"], e["imgid"], e["split"]) for e in data["images"]] == [
        ("photos", "a.jpg", 1, 0, "train"), ("", "d.jpg", 4, 1, "train"), ("photos/sub", "b.jpg", 2, 2, "val"),
        ("", "c.jpg", 3, 3, "test")]
    assert data["images"][0]["sentences"][1] == {"raw": "Brown dog, running", "tokens": ["brown", "dog", "running"],
                                                 "imgid": 0, "sentid": 1}
    assert [e["sentids"] for e in data["images"]] == [[0, 1], [2], [3], [4]]
    back = read_karpathy_splits(SPLITS, annotations=out, image_root=root)
    assert {s: _summary(back[s]) for s in SPLITS} == {s: _summary(table[s]) for s in SPLITS}


def test_the_converter_refuses_what_a_karpathy_file_cannot_hold(tmp_path):
    inside = ImageRecord(1, tmp_path / "imgs/a.jpg", [["a"]], ["A"])
    outside = ImageRecord(2, tmp_path / "elsewhere/b.jpg", [["b"]], ["B"])
    with pytest.raises(ValueError, match=r"image 2: .*elsewhere/b\.jpg is not under the image root .*imgs"):
        to_karpathy({"train": [inside, outside]}, tmp_path / "imgs")
    with pytest.raises(ValueError, match=r"image 1 is in split 'train' and in 'test'; an image belongs to one split"):
        to_karpathy({"train": [inside], "test": [inside]}, tmp_path / "imgs")
    with pytest.raises(ValueError, match=r"split must be one of"):
        to_karpathy({"restval": [inside]}, tmp_path / "imgs")


def test_the_reader_runs_from_a_dataset_config_and_the_composed_config_validates(tmp_path):
    path = _write(tmp_path / "captions.csv", CSV)
    spec = {"_target_": "table", "annotations": str(path), "image_root": str(tmp_path)}
    out = load_records({"reader": spec}, ["train", "test"])
    assert _summary(out["test"]) == [(3, tmp_path / "c.jpg", [["two", "birds"]], ["Two birds"])]
    assert [r.image_id for r in out["train"]] == [1, 4]
    (tmp_path / "photos").mkdir()
    cfg = compose_config("dataset=coco", "dataset/reader=table", f"dataset.annotations={path}",
                         f"dataset.image_root={tmp_path / 'photos'}")
    assert dict(cfg.dataset.reader) == {"_target_": "table", "annotations": str(path),
                                        "image_root": str(tmp_path / "photos"), "val_size": 1000, "test_size": 1000,
                                        "seed": 0, "tokenizer": "ptb", "split_file": None}
    validate_train_config(cfg)


def test_a_split_file_gives_each_image_its_split_and_other_splits_are_skipped_and_counted(tmp_path, caplog):
    """Flickr8k's official split as a table of its own (image, split): `unassigned` images and images it does not
    list are skipped, counted in one warning line; the table's own split column is then not read."""
    table = _write(tmp_path / "captions.csv", "image,caption,split\n" + "".join(
        f"{n}.jpg,a photo of {n} number {k},val\n" for n in ("a", "b", "c", "d", "e") for k in (1, 2)))
    splits = _write(tmp_path / "split.csv", "image,split\na.jpg,train\nb.jpg,test\nc.jpg,val\nd.jpg,unassigned\n"
                    "z.jpg,train\n")
    with caplog.at_level(logging.WARNING):
        out = read_table(SPLITS, table, split_file=splits)
    assert {s: [r.path.name for r in out[s]] for s in SPLITS} == {"train": ["a.jpg"], "val": ["c.jpg"],
                                                                  "test": ["b.jpg"]}
    assert [r.raw for r in out["train"]] == [["a photo of a number 1", "a photo of a number 2"]]
    assert caplog.text.count("skipped") == 1
    assert ("split.csv: skipped 2 images (4 captions) whose split is not train, val or test (not in the split file, "
            "unassigned)") in caplog.text
    jsonl = _write(tmp_path / "split.jsonl", '{"image": "a.jpg", "split": "restval"}\n{"image": "b.jpg", "split": '
                   '"val"}\n{"image": "c.jpg", "split": "test"}\n')
    assert [len(v) for v in read_table(SPLITS, table, split_file=jsonl).values()] == [1, 1, 1]


def test_the_split_column_skips_other_split_names_but_refuses_a_typo(tmp_path, caplog):
    path = _write(tmp_path / "t.csv", "image,caption,split\na.jpg,a dog,train\nb.jpg,a cat,unassigned\n"
                  "c.jpg,a bird,val\nd.jpg,a fish,test\n")
    with caplog.at_level(logging.WARNING):
        out = read_table(SPLITS, path)
    assert [r.path.name for s in SPLITS for r in out[s]] == ["a.jpg", "c.jpg", "d.jpg"]
    assert "skipped 1 images (1 captions) whose split is not train, val or test (unassigned)" in caplog.text
    typo = _write(tmp_path / "s.csv", "image,split\na.jpg,tset\n")
    with pytest.raises(ValueError, match=re.escape(f"{typo}: line 2: 'split' is 'tset': choose one of train, restval, "
                                                   "val, test (did you mean 'test'?); a split of another name")):
        read_table(SPLITS, path, split_file=typo)
    twice = _write(tmp_path / "w.csv", "image,split\na.jpg,train\na.jpg,test\n")
    with pytest.raises(ValueError, match=r"w.csv: line 3: 'split' 'test' differs from 'train' that line 2 gives"):
        read_table(SPLITS, path, split_file=twice)
    headless = _write(tmp_path / "h.csv", "image,part\na.jpg,train\n")
    with pytest.raises(ValueError, match=r"h.csv: line 1: the header lacks the 'split' column .* needs the columns "
                                         r"image and split"):
        read_table(SPLITS, path, split_file=headless)
    assert len(read_table(["train"], path, split_file=_write(tmp_path / "o.csv", "image,split\na.jpg,train\n"))) == 1
    with pytest.raises(ValueError, match=r"split 'val' has no images \(the split file .*o.csv gives it none\)"):
        read_table(["val"], path, split_file=tmp_path / "o.csv")


def test_dataset_table_is_a_data_set_of_its_own_that_validates(tmp_path):
    table = _write(tmp_path / "captions.csv", CSV)
    splits = _write(tmp_path / "split.csv", "image,split\nphotos/a.jpg,train\nb.jpg,val\nc.jpg,test\n")
    (tmp_path / "images").mkdir()
    cfg = compose_config("dataset=table", f"dataset.annotations={table}", f"dataset.image_root={tmp_path / 'images'}",
                         f"dataset.reader.split_file={splits}", "dataset.name=mine")
    assert cfg.dataset.reader._target_ == "table" and cfg.dataset.reader.split_file == str(splits)
    assert cfg.dataset.prepared.endswith("/mine/prepared")
    validate_train_config(cfg)
    out = load_records(cfg.dataset, SPLITS)
    assert {s: [r.image_id for r in out[s]] for s in SPLITS} == {"train": [1], "val": [2], "test": [3]}
    missing = compose_config("dataset=table", f"dataset.annotations={table}", f"dataset.image_root={tmp_path}",
                             f"dataset.reader.split_file={tmp_path / 'none.csv'}")
    with pytest.raises(ValueError, match=r"dataset.reader.split_file=.*none.csv.: file not found"):
        validate_train_config(missing)
