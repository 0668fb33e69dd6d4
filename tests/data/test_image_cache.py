"""dataset.cache_images: every image is read once, the items are the same as without the cache, and unreadable
images are not kept (read again and counted again each time)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import captioning.data.dataset as dataset_module
from captioning.data.dataset import collate
from captioning.factory.datasets import build_datasets
from captioning.models.encoder import SmallCNN


def _datasets(shapes_json: Path, cache: bool) -> dict:
    cfg = {"reader": {"_target_": "karpathy", "annotations": str(shapes_json),
                      "image_root": str(shapes_json.parent)},
           "prepared": None, "min_word_freq": 1, "max_vocab": None, "max_caption_len": 20, "captions_per_image": 2,
           "cache_images": cache}
    return build_datasets(OmegaConf.create(cfg), SmallCNN(channels=(8,), num_pools=1).transform())[1]


def _counting_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    real = dataset_module.load_image

    def counted(path, *args, **kwargs):
        reads.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(dataset_module, "load_image", counted)
    return reads


def test_cached_images_are_read_once_and_equal_the_uncached_ones(shapes_json, monkeypatch):
    reads = _counting_reads(monkeypatch)
    plain, cached = _datasets(shapes_json, False)["train"], _datasets(shapes_json, True)["train"]
    n = len(plain)
    for _ in range(2):
        want = [plain[i]["image"] for i in range(n)]
        got = [cached[i]["image"] for i in range(n)]
        assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert len(reads) == 2 * n + n  # the plain data set reads every image each pass, the cached one once
    assert sorted(set(reads)) == sorted(str(cached.where(i)[1]) for i in range(n))
    # The captions drawn per image still change from read to read (captions_per_image is drawn, not cached).
    torch.manual_seed(0)
    first = [[c.tolist() for c in cached[i]["captions"]] for i in range(n)]
    second = [[c.tolist() for c in cached[i]["captions"]] for i in range(n)]
    assert first != second


def test_a_batch_from_the_cache_does_not_change_the_cache(shapes_json):
    cached = _datasets(shapes_json, True)["val"]
    before = cached[0]["image"].clone()
    batch = collate([cached[i] for i in range(4)])
    batch.images.add_(1.0)  # a caller writing into its batch
    assert torch.equal(cached[0]["image"], before)


def test_unreadable_images_are_not_cached_but_counted_each_time(shapes_json, tmp_path, monkeypatch):
    ds = _datasets(shapes_json, True)["test"]
    _, path = ds.where(0)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"")  # 0 bytes
    real_where = ds.where
    monkeypatch.setattr(ds, "where", lambda i: (real_where(i)[0], broken) if i == 0 else real_where(i))
    reads = _counting_reads(monkeypatch)
    for _ in range(2):
        item = ds[0]
        assert item["image"] is None and "empty" in item["error"]
    assert reads == [str(broken)] * 2
    assert 0 not in ds.cached
