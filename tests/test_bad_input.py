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
