"""The feature cache (captioning/features/) at the module level, on a tiny frozen SmallCNN and the generated `shapes`
set: the grids a cache holds are the encoder's (rounded to float16), meta/index/progress record what made it, a
cache of another encoder is refused, and an interrupted extraction resumes. (The extraction command, ResNet caches
and training from a cache: tests/data/test_real_data.py; the free-space check: tests/features/test_feature_space.py.)"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import TINY_CHANNELS, TINY_POOLS
from omegaconf import OmegaConf

from captioning import __version__
from captioning.data.images import ImageError, load_image
from captioning.data.readers.karpathy import read_karpathy
from captioning.features.cache import FeatureCache, open_features
from captioning.features.checks import CACHE_FORMAT
from captioning.features.extract import extract_features
from captioning.features.fingerprint import fingerprint, weights_digest
from captioning.models.encoder import SmallCNN

# The tiny encoder at a fixed 32 px (8 x 8 x 16 grids), as a config and as a frozen module.
CFG = {"_target_": "small_cnn", "channels": list(TINY_CHANNELS), "num_pools": TINY_POOLS,
       "image_size": 32}
D = TINY_CHANNELS[-1]


def _encoder(seed: int = 0, **changes) -> SmallCNN:
    torch.manual_seed(seed)
    cfg = {**CFG, **changes}
    return SmallCNN(channels=tuple(cfg["channels"]), num_pools=cfg["num_pools"],
                    image_size=cfg["image_size"]).requires_grad_(False)


@pytest.fixture(scope="module")
def records(shapes_json: Path):
    """The 12 test images and 4 train images of the `shapes_json` set, test first: not in image id order."""
    records = read_karpathy(shapes_json, "test") + read_karpathy(shapes_json, "train")[:4]
    assert [r.image_id for r in records] != sorted(r.image_id for r in records)
    return records


def _grids(encoder: SmallCNN, records, batch_size: int) -> np.ndarray:
    """What the encoder computes for the records in id order, batched as the extraction batches, as float16."""
    transform, rows = encoder.eval().transform(), sorted(records, key=lambda r: r.image_id)
    out = []
    with torch.no_grad():
        for k in range(0, len(rows), batch_size):
            fmap = encoder(torch.stack([transform(load_image(r.path)) for r in rows[k:k + batch_size]]))
            out.append(fmap.flatten(2).transpose(1, 2).numpy().astype(np.float16))  # (B, L, D)
    return np.concatenate(out)


def _batches(encoder: SmallCNN, interrupt_at: int | None = None):
    """The sizes of the image batches the encoder encodes, as a list filled as they come (the grid-size probe on
    zeros, made before any image is read, is not counted), and the hook's handle; with `interrupt_at`, batch
    number interrupt_at + 1 raises KeyboardInterrupt instead (what Ctrl-C or a killed job leaves behind)."""
    seen: list[int] = []

    def hook(module, args):
        if not args[0].any():  # the probe: a normalised image is never exactly 0
            return
        if len(seen) == interrupt_at:
            raise KeyboardInterrupt
        seen.append(len(args[0]))

    return seen, encoder.register_forward_pre_hook(hook)


def test_a_cache_holds_the_encoders_grids_in_image_id_order(records, tmp_path):
    encoder = _encoder()
    cache = extract_features(records, encoder, CFG, tmp_path / "cache", batch_size=5, progress=False)
    ids = sorted(r.image_id for r in records)
    expected = _grids(encoder, records, batch_size=5)  # 16 images: batches of 5, 5, 5, 1
    assert len(cache) == 16 and cache.grid == (8, 8) and cache.failed == {}
    assert cache.grids.dtype == np.float16 and cache.grids.shape == (16, 64, D)  # (N, L, D)
    np.testing.assert_array_equal(np.asarray(cache.grids), expected)  # exactly, once rounded to float16
    for k, image_id in enumerate(ids):
        assert image_id in cache
        row = cache[image_id]
        assert row.dtype == torch.float32 and row.shape == (64, D)
        np.testing.assert_array_equal(row.numpy(), expected[k].astype(np.float32))
    assert -1 not in cache
    # reopened from disk, checked against the encoder that made it: the same rows
    again = FeatureCache.open(tmp_path / "cache", encoder, CFG)
    np.testing.assert_array_equal(again[ids[3]].numpy(), cache[ids[3]].numpy())
    assert open_features(tmp_path / "cache", encoder, CFG).meta == again.meta
    assert open_features(None, encoder, CFG) is None  # dataset.features=null


def test_meta_index_and_progress_record_what_made_the_cache(records, tmp_path):
    encoder = _encoder()
    extract_features(records, encoder, CFG, tmp_path / "cache", batch_size=8, progress=False)
    meta = json.loads((tmp_path / "cache" / "meta.json").read_text())
    fp = meta.pop("fingerprint")
    assert meta == {"format": CACHE_FORMAT, "weights": "random initialisation (seeded by the run's `seed`)",
                    "dtype": "float16", "grid": [8, 8], "num_images": 16, "code_version": __version__,
                    "checked_finite": True}
    assert fp == {"format": CACHE_FORMAT, "code_version": __version__, "encoder": CFG, "dim": D,
                  "weights_sha256": weights_digest(encoder), "transform": repr(encoder.transform())}
    assert fp == fingerprint(encoder, OmegaConf.create(CFG))  # a DictConfig gives the same fingerprint
    index = json.loads((tmp_path / "cache" / "index.json").read_text())
    by_id = sorted(records, key=lambda r: r.image_id)
    assert index == {"image_ids": [r.image_id for r in by_id], "paths": [str(r.path) for r in by_id]}
    assert json.loads((tmp_path / "cache" / "progress.json").read_text()) == {"rows_done": 16, "failed": {}}
    # how the weights were obtained is not compared (the hash is); the weights themselves are
    assert fingerprint(encoder, {**CFG, "pretrained": True, "fine_tune": "none"}) == fp
    digest = weights_digest(encoder)
    with torch.no_grad():
        encoder.features[0].weight[0, 0, 0, 0] += 1e-3
    assert weights_digest(encoder) != digest and len(digest) == 64


def test_a_cache_made_by_another_encoder_is_refused(records, tmp_path):
    cache_dir, wider = tmp_path / "cache", [*TINY_CHANNELS[:-1], 2 * TINY_CHANNELS[-1]]
    other_channels = f"encoder.channels: cache {TINY_CHANNELS}, now {wider}"
    extract_features(records, _encoder(), CFG, cache_dir, progress=False)
    FeatureCache.open(cache_dir, _encoder(), {**CFG, "pretrained": False, "fine_tune": "none"})  # the same encoder
    for encoder, cfg, detail in (
            (_encoder(channels=wider), {**CFG, "channels": wider}, other_channels),
            (_encoder(image_size=16), {**CFG, "image_size": 16}, "encoder.image_size: cache 32, now 16"),
            (_encoder(seed=1), CFG, "weights_sha256: cache "),  # another random initialisation
    ):
        with pytest.raises(ValueError, match="made by a different encoder") as err:
            FeatureCache.open(cache_dir, encoder, cfg)
        assert detail in str(err.value) and "captioning-extract-features" in str(err.value)
    with pytest.raises(ValueError, match="needs a frozen encoder"):
        FeatureCache.open(cache_dir, _encoder().requires_grad_(True), CFG)
    # extraction into it is refused too, for another encoder or other images, until overwrite=True
    with pytest.raises(ValueError, match=r"made differently \(.*" + re.escape(other_channels)):
        extract_features(records, _encoder(channels=wider), {**CFG, "channels": wider}, cache_dir, progress=False)
    with pytest.raises(ValueError, match="made differently \\(another list of images\\)"):
        extract_features(records[:3], _encoder(), CFG, cache_dir, progress=False)
    replaced = extract_features(records, _encoder(channels=wider), {**CFG, "channels": wider}, cache_dir,
                                overwrite=True, progress=False)
    assert replaced.meta["fingerprint"]["encoder"]["channels"] == wider and replaced.grids.shape == (16, 64, wider[-1])
    with pytest.raises(ValueError, match="needs a frozen encoder"):
        extract_features(records, _encoder().requires_grad_(True), CFG, tmp_path / "other", progress=False)
    assert not (tmp_path / "other").exists()


def test_what_is_not_a_finished_cache_of_this_format_is_refused(records, tmp_path):
    with pytest.raises(FileNotFoundError, match="no feature cache at .*meta.json missing"):
        FeatureCache.open(tmp_path / "nowhere")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(ValueError, match="exists and is not a feature cache"):
        extract_features(records, _encoder(), CFG, tmp_path / "notes", progress=False)
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"
    cache_dir = tmp_path / "cache"
    extract_features(records, _encoder(), CFG, cache_dir, progress=False)
    meta = json.loads((cache_dir / "meta.json").read_text())
    (cache_dir / "meta.json").write_text(json.dumps({**meta, "format": "captioning-features/v0"}))
    with pytest.raises(ValueError, match="in format 'captioning-features/v0', not 'captioning-features/v1'"):
        FeatureCache.open(cache_dir)
    (cache_dir / "meta.json").write_text(json.dumps({**meta, "grid": [8, 4]}))
    with pytest.raises(ValueError, match=r"grids must be square .* got \[8, 4\]"):
        FeatureCache.open(cache_dir)
    (cache_dir / "meta.json").write_text("{not json")
    with pytest.raises(ValueError, match="meta.json is unreadable"):
        FeatureCache.open(cache_dir)


def test_an_interrupted_extraction_resumes_where_it_stopped(records, tmp_path):
    reference = extract_features(records, _encoder(), CFG, tmp_path / "full", batch_size=5, progress=False)
    encoder = _encoder()
    seen, hook = _batches(encoder, interrupt_at=2)
    with pytest.raises(KeyboardInterrupt):
        extract_features(records, encoder, CFG, tmp_path / "cache", batch_size=5, progress=False)
    assert seen == [5, 5]
    assert json.loads((tmp_path / "cache" / "progress.json").read_text())["rows_done"] == 10
    with pytest.raises(ValueError, match=r"unfinished \(10 of 16 images\)"):
        FeatureCache.open(tmp_path / "cache")
    hook.remove()
    seen, _ = _batches(encoder)
    cache = extract_features(records, encoder, CFG, tmp_path / "cache", batch_size=5, progress=False)
    assert seen == [5, 1]  # only the 6 images left; the grid size is read from grids.npy, without a probe
    np.testing.assert_array_equal(np.asarray(cache.grids), np.asarray(reference.grids))
    # rows recorded as done but grids.npy gone: it starts again from the first image rather than leave zeros
    (tmp_path / "cache" / "grids.npy").unlink()
    (tmp_path / "cache" / "progress.json").write_text(json.dumps({"rows_done": 10, "failed": {}}))
    seen.clear()
    cache = extract_features(records, encoder, CFG, tmp_path / "cache", batch_size=5, progress=False)
    assert seen == [5, 5, 5, 1]
    np.testing.assert_array_equal(np.asarray(cache.grids), np.asarray(reference.grids))


def test_unreadable_images_are_recorded_and_an_image_id_names_one_file(records, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"")
    bad = [dataclasses.replace(r, path=broken) if k == 5 else r for k, r in enumerate(records)]
    cache = extract_features(bad, _encoder(), CFG, tmp_path / "cache", batch_size=1, progress=False)
    image_id = records[5].image_id
    assert list(cache.failed) == [str(image_id)] and "broken.png" in cache.failed[str(image_id)]
    assert json.loads((tmp_path / "cache" / "progress.json").read_text())["failed"] == cache.failed
    with pytest.raises(ImageError, match=f"image {image_id} has no cached features"):
        cache[image_id]
    expected = _grids(_encoder(), [r for r in records if r.image_id != image_id], batch_size=1)
    readable = sorted(r.image_id for r in records if r.image_id != image_id)
    np.testing.assert_array_equal(np.stack([cache[i].numpy() for i in readable]), expected.astype(np.float32))
    with pytest.raises(ValueError, match="none of the 1 images could be read"):
        extract_features(bad[5:6], _encoder(), CFG, tmp_path / "none", progress=False)
    # the same image in two splits is cached once; one id with two files is refused
    twice = extract_features(records + records[:2], _encoder(), CFG, tmp_path / "twice", progress=False)
    assert len(twice) == 16
    clash = [*records, dataclasses.replace(records[0], path=records[1].path)]
    with pytest.raises(ValueError, match=f"image id {records[0].image_id} names two files"):
        extract_features(clash, _encoder(), CFG, tmp_path / "clash", progress=False)
    with pytest.raises(ValueError, match="no images to extract"):
        extract_features([], _encoder(), CFG, tmp_path / "empty", progress=False)


def test_a_cache_serves_only_its_images_and_pickles_without_its_mapped_file(records, shapes_json, tmp_path):
    cache = extract_features(records, _encoder(), CFG, tmp_path / "cache", progress=False)
    cache.require(records[:6])
    val = read_karpathy(shapes_json, "val")
    with pytest.raises(ValueError, match=rf"12 of 14 images are not in the feature cache .*image ids "
                                         rf"\[{val[0].image_id}, "):
        cache.require(records[:2] + val)
    assert isinstance(cache.grids, np.memmap)
    copy = pickle.loads(pickle.dumps(cache))  # what a DataLoader worker gets: it maps the file itself
    assert copy._grids is None and copy.row == cache.row and copy.grid == cache.grid
    np.testing.assert_array_equal(copy[records[7].image_id].numpy(), cache[records[7].image_id].numpy())
    assert isinstance(copy.grids, np.memmap)


def test_grids_npy_must_be_what_meta_and_index_describe_before_it_is_mapped(records, tmp_path):
    """Checked from grids.npy's header against meta.json (grid, D, dtype) and index.json (rows), with the file's
    length, before it is mapped: another shape, dtype or length, a FIFO or a damaged header is one ValueError."""
    cache_dir = tmp_path / "cache"
    extract_features(records, _encoder(), CFG, cache_dir, progress=False)
    grids_path, meta_path = cache_dir / "grids.npy", cache_dir / "meta.json"
    good, meta = grids_path.read_bytes(), json.loads(meta_path.read_text())
    n = len({r.image_id for r in records})
    assert FeatureCache.open(cache_dir).grids.shape == (n, 64, D)

    def refused(pattern: str) -> None:
        with pytest.raises(ValueError, match=pattern):
            FeatureCache.open(cache_dir)
        grids_path.unlink()
        grids_path.write_bytes(good)
        meta_path.write_text(json.dumps(meta))

    np.save(grids_path, np.zeros((n, 64, D), np.float32))
    refused(rf"holds {n}x64x{D} float32 but meta.json and index.json describe {n}x64x{D} float16")
    np.save(grids_path, np.zeros((n + 1, 64, D), np.float16))
    refused(rf"holds {n + 1}x64x{D} float16 but .* describe {n}x64x{D} float16")
    meta_path.write_text(json.dumps({**meta, "grid": [16, 16]}))
    refused(rf"describe {n}x256x{D} float16")
    meta_path.write_text(json.dumps({**meta, "fingerprint": {**meta["fingerprint"], "dim": 10**9}}))
    refused(rf"describe {n}x64x1000000000 float16")
    meta_path.write_text(json.dumps({**meta, "dtype": "no-such-type"}))
    refused("meta.json gives \"dtype\" 'no-such-type', not the name of a float type")
    meta_path.write_text(json.dumps({**meta, "grid": ["8", "8"]}))
    refused("meta.json gives \"grid\" \\['8', '8'\\], not two positive integers")
    grids_path.write_bytes(good[:-10])
    refused(r"is \d+ bytes but its header describes \d+ .* truncated")
    grids_path.write_bytes(b"\x93NUMPY garbage")
    refused("is not a readable .npy file")
    grids_path.unlink()
    os.mkfifo(grids_path)  # np.load would wait on it forever
    refused("is not a regular file")
