"""Bad input gets a clear error naming the file, or a counted skip: never a crash mid-epoch or silent garbage."""

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from captioning.data import karpathy
from captioning.data.karpathy import CaptionDataset, ImageError, collate, load_image, read_karpathy
from captioning.data.vocab import Vocabulary


def _jpeg_bytes(size=(32, 32)):
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, format="JPEG")
    return buf.getvalue()


def test_unreadable_files_raise_image_error_naming_the_file(tmp_path):
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "truncated.jpg").write_bytes(_jpeg_bytes((64, 64))[:300])
    (tmp_path / "garbage.png").write_bytes(b"\x89PNG this is not really a png")
    cases = {"missing.jpg": "not found", "empty.jpg": "empty", "truncated.jpg": "cannot read", "garbage.png": "cannot read"}
    for name, message in cases.items():
        with pytest.raises(ImageError, match=message) as err:
            load_image(tmp_path / name)
        assert name in str(err.value)


def test_image_modes_become_correct_rgb(tmp_path):
    Image.new("L", (4, 4), 77).save(tmp_path / "grey.png")
    Image.new("CMYK", (4, 4), (0, 255, 255, 0)).save(tmp_path / "cmyk.jpg")
    Image.new("RGBA", (4, 4), (10, 20, 30, 0)).save(tmp_path / "rgba.png")
    Image.fromarray(np.full((4, 4), 32768, dtype=np.uint16)).save(tmp_path / "grey16.png")
    assert load_image(tmp_path / "grey.png").getpixel((0, 0)) == (77, 77, 77)
    r, g, b = load_image(tmp_path / "cmyk.jpg").getpixel((0, 0))
    assert r > 200 and g < 50 and b < 50  # CMYK (0, 1, 1, 0) is red
    assert load_image(tmp_path / "rgba.png").getpixel((0, 0)) == (10, 20, 30)
    grey16 = load_image(tmp_path / "grey16.png")
    assert Image.open(tmp_path / "grey16.png").mode.startswith("I")
    assert grey16.getpixel((0, 0)) == (128, 128, 128)  # rescaled, not clipped to white


def test_decompression_bomb_guard(tmp_path, monkeypatch):
    Image.new("RGB", (40, 40)).save(tmp_path / "big.png")
    monkeypatch.setattr(karpathy, "MAX_IMAGE_PIXELS", 500)
    with pytest.raises(ImageError, match="big.png"):
        load_image(tmp_path / "big.png")


def _karpathy(tmp_path, images):
    path = tmp_path / "dataset.json"
    path.write_text(json.dumps({"images": images}))
    return path


def test_malformed_annotations(tmp_path, caplog):
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [')
    with pytest.raises(ValueError, match=r"bad.json is not valid JSON \(line 1"):
        read_karpathy(bad, "train")
    with pytest.raises(ValueError, match="top-level 'images' list"):
        read_karpathy(_karpathy(tmp_path, None), "train")
    with pytest.raises(ValueError, match="image entry 0 is malformed"):
        read_karpathy(_karpathy(tmp_path, [{"split": "train", "sentences": [{"tokens": ["a"]}]}]), "train")
    with pytest.raises(ValueError, match="split must be one of"):
        read_karpathy(_karpathy(tmp_path, []), "training")
    entry = {"split": "train", "filename": "a.jpg", "id": 1,
             "sentences": [{"raw": "", "tokens": []}, {"raw": "A dog.", "tokens": ["a", "dog"]}]}
    records = read_karpathy(_karpathy(tmp_path, [entry, {**entry, "id": 2, "sentences": [{"raw": " "}]}]), "train")
    assert len(records) == 1 and records[0].captions == [["a", "dog"]]
    assert "skipped 2 empty captions" in caplog.text and "no non-empty caption" in caplog.text
    with pytest.raises(ValueError, match="split 'test' has no images"):
        read_karpathy(_karpathy(tmp_path, [entry]), "test")


def test_batches_skip_and_count_unreadable_images(tmp_path):
    Image.new("RGB", (16, 16)).save(tmp_path / "ok.png")
    (tmp_path / "broken.png").write_bytes(b"")
    images = [{"split": "train", "filename": f, "id": i, "sentences": [{"tokens": ["a", "dog"]}]}
              for i, f in enumerate(["ok.png", "broken.png", "gone.png"])]
    records = read_karpathy(_karpathy(tmp_path, images), "train")
    ds = CaptionDataset(records, Vocabulary.build([["a", "dog"]]), lambda im: torch.zeros(3, 16, 16))
    batch = collate([ds[i] for i in range(3)])
    assert batch.indices == [0] and batch.images.shape == (1, 3, 16, 16) and batch.captions.shape[0] == 1
    assert len(batch.skipped) == 2 and "broken.png" in batch.skipped[0] and "gone.png" in batch.skipped[1]
    empty = collate([ds[1]])
    assert empty.indices == [] and len(empty.skipped) == 1


def _coco_files(tmp_path, images, annotations, val=None):
    train = tmp_path / "captions_train2014.json"
    train.write_text(json.dumps({"images": images, "annotations": annotations}))
    valf = tmp_path / "captions_val2014.json"
    valf.write_text(json.dumps(val if val is not None else {
        "images": [{"id": 900 + k, "file_name": f"v{k}.jpg"} for k in range(2)],
        "annotations": [{"id": 9000 + k, "image_id": 900 + k, "caption": "A cat."} for k in range(2)]}))
    return train, valf


def test_malformed_coco_caption_files_name_the_file_and_entry(tmp_path):
    from captioning.data.coco_captions import read_coco_captions

    img = {"id": 1, "file_name": "a.jpg"}
    ann = {"id": 10, "image_id": 1, "caption": "A dog runs."}
    cases = [
        ({"images": [img]}, "top-level 'images' and 'annotations' lists"),  # no annotations
        ({"images": [{"id": 1}], "annotations": [ann]}, r"images\[0\] is malformed .*'file_name'"),
        ({"images": [{"id": "1", "file_name": "a.jpg"}], "annotations": [ann]}, r"images\[0\] is malformed .*integer 'id'"),
        ({"images": [{"id": True, "file_name": "a.jpg"}], "annotations": [ann]}, r"images\[0\] is malformed .*integer 'id'"),
        ({"images": [img], "annotations": [{**ann, "image_id": True}]}, r"annotations\[0\] is malformed"),
        ({"images": [img, img], "annotations": [ann]}, r"images\[1\] repeats image id 1"),
        ({"images": [img], "annotations": [{"image_id": 1}]}, r"annotations\[0\] is malformed .*'caption'"),
        ({"images": [img], "annotations": [ann, {"id": 11, "image_id": 7, "caption": "x"}]},
         r"1 annotations refer to image ids not in its 'images' list \(e.g. \[7\]\)"),
    ]
    for data, message in cases:
        (tmp_path / "captions_train2014.json").write_text(json.dumps(data))
        train, val = _coco_files(tmp_path, data.get("images"), data.get("annotations"))
        if "annotations" not in data:
            train.write_text(json.dumps(data))
        with pytest.raises(ValueError, match=message) as err:
            read_coco_captions(train, val, ["train"], tmp_path)
        assert "captions_train2014.json" in str(err.value)
    train, val = _coco_files(tmp_path, [img], [ann])
    (tmp_path / "broken.json").write_text('{"images": [], "annotations": [')
    with pytest.raises(ValueError, match=r"broken.json is not valid JSON"):
        read_coco_captions(tmp_path / "broken.json", val, ["train"], tmp_path)
    with pytest.raises(FileNotFoundError, match="annotation file not found: .*missing.json"):
        read_coco_captions(tmp_path / "missing.json", val, ["train"], tmp_path)


def test_coco_empty_captions_are_skipped_and_counted(tmp_path, caplog):
    from captioning.data.coco_captions import read_coco_captions

    images = [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"}, {"id": 3, "file_name": "c.jpg"}]
    anns = [{"id": 1, "image_id": 1, "caption": "A dog."}, {"id": 2, "image_id": 1, "caption": "  "},
            {"id": 3, "image_id": 2, "caption": "..."}]  # image 2: only punctuation; image 3: no caption at all
    train, val = _coco_files(tmp_path, images, anns)
    records = read_coco_captions(train, val, ["train"], tmp_path, num_val=1, num_test=1)["train"]
    assert [r.image_id for r in records] == [1] and records[0].captions == [["a", "dog"]]
    assert "skipped 2 empty captions and 2 images without a caption" in caplog.text


def test_dataset_format_and_coco_section_are_checked():
    from omegaconf import OmegaConf

    from captioning.data.build import load_records

    with pytest.raises(ValueError, match="dataset.format must be one of .*'karpathy', 'coco'.* got 'csv'"):
        load_records(OmegaConf.create({"format": "csv"}), ["train"])
    with pytest.raises(ValueError, match="dataset.format=coco needs a dataset.coco section"):
        load_records(OmegaConf.create({"format": "coco", "image_root": "."}), ["train"])
