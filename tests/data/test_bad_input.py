"""Bad input gets a clear error naming the file, or a counted skip: never a crash mid-epoch or silent garbage."""

import io
import json
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from captioning.data.dataset import CaptionDataset, collate
from captioning.data.images import DEFAULT_MAX_PIXELS, ImageError, load_image, to_rgb
from captioning.data.readers import karpathy
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import Vocabulary
from captioning.models.encoder import ResNetEncoder, SmallCNN


def _jpeg_bytes(size=(32, 32)):
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, format="JPEG")
    return buf.getvalue()


def test_unreadable_files_raise_image_error_naming_the_file(tmp_path):
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "truncated.jpg").write_bytes(_jpeg_bytes((64, 64))[:300])
    (tmp_path / "garbage.png").write_bytes(b"\x89PNG this is not really a png")
    (tmp_path / "folder.jpg").mkdir()
    cases = {"missing.jpg": "not found", "empty.jpg": "empty", "truncated.jpg": "cannot read", "garbage.png": "cannot read",
             "folder.jpg": "folder"}
    for name, message in cases.items():
        with pytest.raises(ImageError, match=message) as err:
            load_image(tmp_path / name)
        assert name in str(err.value)


def _png_header(width, height):
    """A PNG whose header claims width x height RGB pixels (with almost no data): a decompression bomb's shape."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


def _rgb(path):
    return np.asarray(load_image(path), dtype=np.int64)


def test_image_table_every_mode_becomes_the_same_rgb(tmp_path):
    """One loader, one rule per kind of file (captioning/data/images.py); alpha is composited on white."""
    grey = np.arange(256, dtype=np.uint8).reshape(16, 16)
    Image.fromarray(grey).save(tmp_path / "grey8.png")
    Image.fromarray(grey.astype(np.uint16) * 257).save(tmp_path / "grey16.png")  # the same picture in 16 bits
    assert Image.open(tmp_path / "grey16.png").mode.startswith("I")
    t8, t16 = (T.ToTensor()(load_image(tmp_path / n)) for n in ("grey8.png", "grey16.png"))
    assert t8.shape == t16.shape == (3, 16, 16) and (t8 - t16).abs().max() <= 1 / 255  # scaled, not clipped
    big_endian = Image.frombytes("I;16B", (16, 16), (grey.astype(">u2") * 257).tobytes())
    as_int32 = Image.fromarray(grey.astype(np.int32) * 257)  # mode I
    for im in (big_endian, as_int32):
        np.testing.assert_array_equal(np.asarray(to_rgb(im))[..., 0], grey)
    Image.new("CMYK", (4, 4), (0, 255, 255, 0)).save(tmp_path / "cmyk.jpg")
    r, g, b = _rgb(tmp_path / "cmyk.jpg")[0, 0]
    assert r > 200 and g < 50 and b < 50  # CMYK (0, 1, 1, 0) is red
    pal = Image.new("P", (4, 4), 0)
    pal.putpalette([0, 0, 0, 200, 10, 10] + [0] * 762)
    pal.putpixel((1, 1), 1)
    pal.save(tmp_path / "palette.png", transparency=0)  # index 0 (black) is transparent
    rgb = _rgb(tmp_path / "palette.png")
    assert tuple(rgb[0, 0]) == (255, 255, 255) and tuple(rgb[1, 1]) == (200, 10, 10)
    Image.new("RGBA", (4, 4), (10, 20, 30, 0)).save(tmp_path / "clear.png")
    Image.new("RGBA", (4, 4), (10, 20, 30, 255)).save(tmp_path / "opaque.png")
    Image.new("LA", (4, 4), (0, 128)).save(tmp_path / "half.png")
    assert tuple(_rgb(tmp_path / "clear.png")[0, 0]) == (255, 255, 255)  # on white: what a viewer shows
    assert tuple(_rgb(tmp_path / "opaque.png")[0, 0]) == (10, 20, 30)
    assert tuple(_rgb(tmp_path / "half.png")[0, 0]) == (127, 127, 127)
    Image.new("L", (4, 4), 77).save(tmp_path / "grey.png")
    assert tuple(_rgb(tmp_path / "grey.png")[0, 0]) == (77, 77, 77)


def test_exif_rotation_and_animation_first_frame(tmp_path):
    im = Image.new("RGB", (40, 20), "red")
    im.paste((0, 0, 255), (20, 0, 40, 20))  # left half red, right half blue
    exif = im.getexif()
    exif[0x0112] = 6  # shown rotated 90 degrees clockwise: the left half comes on top
    im.save(tmp_path / "rotated.jpg", exif=exif)
    rgb = _rgb(tmp_path / "rotated.jpg")
    assert rgb.shape == (40, 20, 3)
    assert rgb[5, 10, 0] > 200 and rgb[5, 10, 2] < 50 and rgb[35, 10, 2] > 200 and rgb[35, 10, 0] < 50
    frames = [Image.new("RGB", (8, 8), c) for c in ("red", "green", "blue")]
    frames[0].save(tmp_path / "anim.gif", save_all=True, append_images=frames[1:], duration=100, loop=0)
    frames[0].save(tmp_path / "anim.png", save_all=True, append_images=frames[1:], duration=100)
    for name in ("anim.gif", "anim.png"):
        assert Image.open(tmp_path / name).n_frames == 3
        r, g, b = _rgb(tmp_path / name)[4, 4]
        assert r > 200 and g < 50 and b < 50, name  # the first frame


def test_decompression_bombs_are_refused_per_image(tmp_path, recwarn):
    (tmp_path / "claims_9000.png").write_bytes(_png_header(9000, 9000))  # over our default, under PIL's own limit
    (tmp_path / "claims_1e10.png").write_bytes(_png_header(100_000, 100_000))  # over PIL's own limit too
    Image.new("RGB", (40, 40)).save(tmp_path / "big.png")
    before = Image.MAX_IMAGE_PIXELS
    for name, limit in (("claims_9000.png", DEFAULT_MAX_PIXELS), ("claims_1e10.png", DEFAULT_MAX_PIXELS),
                        ("big.png", 500)):
        with pytest.raises(ImageError, match=f"image too large: .*{name}"):
            load_image(tmp_path / name, max_pixels=limit)
    assert load_image(tmp_path / "big.png", max_pixels=1600).size == (40, 40)  # the limit is per call
    assert Image.MAX_IMAGE_PIXELS == before  # PIL's process-wide guard untouched
    assert not [w for w in recwarn if issubclass(w.category, Image.DecompressionBombWarning)]
    records = [karpathy.ImageRecord(k, tmp_path / n, [["a"]], ["a"]) for k, n in enumerate(["big.png", "claims_9000.png"])]
    ds = CaptionDataset(records, Vocabulary.build([["a"]]), T.ToTensor())
    batch = collate([ds[0], ds[1]])
    assert batch.indices == [0] and len(batch.skipped) == 1 and "image too large" in batch.skipped[0]
    assert "claims_9000.png" in batch.skipped[0]


def test_tiny_images_batch_with_the_others(tmp_path):
    for name, size in (("one.png", (1, 1)), ("wide.png", (300, 2)), ("normal.png", (64, 48))):
        Image.new("RGB", size, "green").save(tmp_path / name)
    records = [karpathy.ImageRecord(k, tmp_path / n, [["a"]], ["a"]) for k, n in
               enumerate(["one.png", "wide.png", "normal.png"])]
    vocab = Vocabulary.build([["a"]])
    resnet = ResNetEncoder("resnet18", pretrained=False, grid_size=2, image_size=32)
    for encoder in (SmallCNN(channels=(8,), num_pools=1, image_size=32), resnet):
        batch = collate([CaptionDataset(records, vocab, encoder.transform())[i] for i in range(3)])
        assert batch.images.shape == (3, 3, 32, 32) and batch.skipped == []
    # Without a resize (SmallCNN's default) the odd sizes are skipped with the reason, never a crash mid-epoch.
    ds = CaptionDataset(records, vocab, SmallCNN(channels=(8,), num_pools=1).transform())
    batch = collate([ds[2], ds[0], ds[1]] + [ds[2]])
    assert batch.indices == [2, 2] and len(batch.skipped) == 2 and "one.png" in batch.skipped[0]
    assert "image_size" in batch.skipped[0]


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
    with pytest.raises(ValueError, match=r"images\[0\]: 'filename' is missing"):
        read_karpathy(_karpathy(tmp_path, [{"split": "train", "sentences": [{"tokens": ["a"]}]}]), "train")
    with pytest.raises(ValueError, match="split must be one of"):
        read_karpathy(_karpathy(tmp_path, []), "training")
    entry = {"split": "train", "filename": "a.jpg", "id": 1,
             "sentences": [{"raw": "", "tokens": []}, {"raw": "A dog.", "tokens": ["a", "dog"]}]}
    records = read_karpathy(_karpathy(tmp_path, [entry, {**entry, "id": 2, "filename": "b.jpg",
                                                         "sentences": [{"raw": " "}]}]), "train")
    assert len(records) == 1 and records[0].captions == [["a", "dog"]]
    assert "skipped 2 empty captions" in caplog.text and "no non-empty caption" in caplog.text
    with pytest.raises(ValueError, match="split 'test' has no images"):
        read_karpathy(_karpathy(tmp_path, [entry]), "test")


GOOD = {"split": "train", "filename": "a.jpg", "cocoid": 7, "sentences": [{"raw": "A dog.", "tokens": ["a", "dog"]}]}


@pytest.mark.parametrize("images, message", [
    ([GOOD, {**GOOD, "filename": "b.jpg"}], r"images\[1\] \(id 7\): 'cocoid' repeats the image id 7 of images\[0\]"),
    ([{**GOOD, "cocoid": None}], r"images\[0\] \(id None\): 'cocoid' must be an integer"),
    ([{k: v for k, v in GOOD.items() if k != "cocoid"} | {"imgid": 3},
      {k: v for k, v in GOOD.items() if k != "cocoid"} | {"imgid": 3, "filename": "b.jpg"}],
     r"images\[1\] \(id 3\): 'imgid' repeats the image id 3"),
    ([GOOD, {**GOOD, "cocoid": 8}], r"images\[1\] \(id 8\): 'filepath/filename' repeats the image file .*a.jpg"),
    ([{**GOOD, "cocoid": True}], r"images\[0\] \(id True\): 'cocoid' must be an integer image id, got bool"),
    ([{**GOOD, "sentences": [{"tokens": "ab"}]}], r"images\[0\] \(id 7\): 'sentences\[0\].tokens' must be a list of str"),
    ([{**GOOD, "sentences": [{"tokens": ["a", 3]}]}], r"'sentences\[0\].tokens' must be a list of strings"),
    ([{**GOOD, "sentences": "A dog."}], r"images\[0\] \(id 7\): 'sentences' must be a list .*got str"),
    ([{**GOOD, "sentences": {"raw": "A dog."}}], r"'sentences' must be a list .*got dict"),
    ([{**GOOD, "sentences": [{"raw": 5}]}], r"images\[0\] \(id 7\): 'sentences\[0\].raw' must be a string, got int 5"),
    ([{**GOOD, "sentences": ["A dog."]}], r"'sentences\[0\]' must be an object"),
    ([{k: v for k, v in GOOD.items() if k != "sentences"}], r"'sentences' is missing"),
    ([{**GOOD, "filename": 3}], r"'filename' must be a non-empty string"),
    ([{**GOOD, "height": "480", "width": 640}], r"'height/width' must be positive integers"),
    ([{**GOOD, "word_boxes": [1, 2]}], r"'word_boxes' must be an object"),
    (["a.jpg"], r"images\[0\] must be an object, got str"),
])
def test_bad_karpathy_files_name_file_entry_and_field(tmp_path, images, message):
    with pytest.raises(ValueError, match=message) as err:
        read_karpathy(_karpathy(tmp_path, images), "train")
    assert "dataset.json" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe{}", r"bad.json is not UTF-8 text \(byte 0"),
    ('{"images": [{"filename": "caf\u00e9.jpg"}]}'.encode("latin-1"), r"bad.json is not UTF-8 text \(byte 29: b'\\xe9'\)"),
    (b'{"images": [}', r"bad.json is not valid JSON \(line 1, column 13"),
    (b"", r"bad.json is not valid JSON \(line 1, column 1"),
])
def test_undecodable_files_are_named(tmp_path, content, message):
    from captioning.data.readers.coco_captions import read_coco_captions
    from captioning.data.readers.references import load_references

    (tmp_path / "bad.json").write_bytes(content)
    for read in (lambda p: read_karpathy(p, "train"), load_references,
                 lambda p: read_coco_captions(p, p, ["train"], tmp_path)):
        with pytest.raises(ValueError, match=message):
            read(tmp_path / "bad.json")
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps({"images": [GOOD]}).encode())
    assert [r.image_id for r in read_karpathy(tmp_path / "bom.json", "train")] == [7]  # a byte-order mark is fine


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
    from captioning.data.readers.coco_captions import read_coco_captions

    img = {"id": 1, "file_name": "a.jpg"}
    ann = {"id": 10, "image_id": 1, "caption": "A dog runs."}
    cases = [
        ({"images": [img]}, "top-level 'images' and 'annotations' lists"),  # no annotations
        ({"images": [{"id": 1}], "annotations": [ann]}, r"images\[0\] is malformed .*'file_name'"),
        ({"images": [{"id": "1", "file_name": "a.jpg"}], "annotations": [ann]}, r"images\[0\] is malformed .*integer 'id'"),
        ({"images": [{"id": True, "file_name": "a.jpg"}], "annotations": [ann]}, r"images\[0\] is malformed .*integer 'id'"),
        ({"images": [img], "annotations": [{**ann, "image_id": True}]}, r"annotations\[0\] is malformed"),
        ({"images": [img, img], "annotations": [ann]}, r"images\[1\] \(id 1\): 'id' repeats image id 1 of images\[0\]"),
        ({"images": [img], "annotations": [{"image_id": 1}]}, r"annotations\[0\] is malformed .*'caption'"),
        ({"images": [img], "annotations": [ann, {"id": 11, "image_id": 7, "caption": "x"}]},
         r"1 annotations refer to image ids not in its 'images' list \(e.g. \[7\]\)"),
        ({"images": [img], "annotations": [{"image_id": 1, "caption": "A dog."}]},
         r"annotations\[0\] \(image id 1\): 'id' must be an integer annotation id, got None \(missing\)"),
        ({"images": [img], "annotations": [{**ann, "id": "10"}]}, r"annotations\[0\] \(image id 1\): 'id' must be"),
        ({"images": [img], "annotations": [ann, {**ann, "caption": "Another."}]},
         r"annotations\[1\] \(image id 1\): 'id' repeats annotation id 10 of annotations\[0\]"),
        ({"images": [{**img, "height": "480", "width": 640}], "annotations": [ann]},
         r"images\[0\] \(id 1\): 'height' and 'width' must be positive integers"),
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
    with pytest.raises(FileNotFoundError, match="file not found: .*missing.json"):
        read_coco_captions(tmp_path / "missing.json", val, ["train"], tmp_path)


def test_coco_empty_captions_are_skipped_and_counted(tmp_path, caplog):
    from captioning.data.readers.coco_captions import read_coco_captions

    images = [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"}, {"id": 3, "file_name": "c.jpg"}]
    anns = [{"id": 1, "image_id": 1, "caption": "A dog."}, {"id": 2, "image_id": 1, "caption": "  "},
            {"id": 3, "image_id": 2, "caption": "..."}]  # image 2: only punctuation; image 3: no caption at all
    train, val = _coco_files(tmp_path, images, anns)
    records = read_coco_captions(train, val, ["train"], tmp_path, num_val=1, num_test=1)["train"]
    assert [r.image_id for r in records] == [1] and records[0].captions == [["a", "dog"]]
    assert "skipped 2 empty captions and 2 images without a caption" in caplog.text


def test_the_reader_is_checked_and_an_old_dataset_format_still_reads(shapes_json, tmp_path):
    from captioning.data.readers.karpathy import read_karpathy
    from captioning.factory.datasets import load_records
    from captioning.factory.registry import ModelSpecError

    with pytest.raises(ModelSpecError, match=r"dataset\.reader\._target_ 'os\.makedirs' is not one of this project's "
                       r"data set readers \(karpathy, coco, table\)"):
        load_records({"reader": {"_target_": "os.makedirs", "name": str(tmp_path / "marker")}}, ["train"])
    assert not (tmp_path / "marker").exists()
    with pytest.raises(ModelSpecError, match="dataset.reader lacks train_captions, required by read_coco_captions"):
        load_records({"reader": {"_target_": "coco", "image_root": "."}},
                     ["train"])
    # A dataset section stored before dataset.reader (an older checkpoint's) names its reader with `format`.
    legacy = {"format": "karpathy", "annotations": str(shapes_json), "image_root": str(shapes_json.parent)}
    assert load_records(legacy, ["val"])["val"] == read_karpathy(shapes_json, "val")
    with pytest.raises(ValueError, match="dataset.format must be one of .*'karpathy', 'coco'.* got 'csv'"):
        load_records({"format": "csv"}, ["train"])
