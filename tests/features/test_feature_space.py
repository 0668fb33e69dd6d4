"""Feature caches at COCO size: their size per preset, and the free-space check before extraction writes rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from fixtures import TINY_CHANNELS, TINY_MODEL, TINY_POOLS

from captioning.data.readers.karpathy import read_karpathy
from captioning.features import disk
from captioning.features.cache import FeatureCache
from captioning.features.disk import MARGIN_BYTES, MARGIN_PER_ROW, NotEnoughSpaceError, cache_bytes, check_free_space
from captioning.features.extract import _row_shape, extract_features
from captioning.models.encoder import ResNetEncoder, SmallCNN

COCO_IMAGES = 123_287  # Karpathy train + restval + val + test: every image of train2014 and val2014
# A frozen, randomly initialised ResNet-18: 64 px -> 2 x 2 x 512 (its transform gives every image one size).
RESNET_CFG = {"_target_": "resnet", "arch": "resnet18", "pretrained": False,
              "fine_tune": "none", "grid_size": 2, "image_size": 64}


def _resnet() -> ResNetEncoder:
    torch.manual_seed(0)
    return ResNetEncoder(**{k: v for k, v in RESNET_CFG.items() if k != "_target_"})


def _need(rows: int, grid_values: int) -> int:
    """What check_free_space asks for: the rows' float16 values plus the index-file margin."""
    return rows * grid_values * 2 + MARGIN_BYTES + MARGIN_PER_ROW * rows


def _free(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setattr(disk, "free_bytes", lambda path: n)


def _calls(encoder: torch.nn.Module) -> list[int]:
    """Batch sizes of the encoder's forward passes, appended as they happen."""
    seen: list[int] = []
    encoder.register_forward_hook(lambda module, args, out: seen.append(len(args[0])))
    return seen


@pytest.mark.parametrize("grid, dim, gb, gib", [((14, 14), 512, 24.74, 23.04),     # VGG-16/19 conv5 at 224 px
                                                ((14, 14), 2048, 98.98, 92.18),    # ResNet, grid_size=14
                                                ((7, 7), 2048, 24.74, 23.04)])     # ResNet, grid_size=7
def test_cache_bytes_of_coco_at_the_presets(grid, dim, gb, gib):
    n = cache_bytes(COCO_IMAGES, grid, dim)
    assert n == COCO_IMAGES * grid[0] * grid[1] * dim * 2
    assert round(n / 1e9, 2) == gb and round(n / 2**30, 2) == gib
    assert cache_bytes(10, (2, 3), 4, itemsize=4) == 960


def test_check_free_space_refuses_with_both_figures_and_passes_when_it_fits(tmp_path, monkeypatch):
    need = _need(COCO_IMAGES, 196 * 512)
    assert need == 24_808_316_992  # 24.74 GB of grids and 63 MB for index.json and progress.json
    _free(monkeypatch, 3_200_000_000)
    with pytest.raises(NotEnoughSpaceError, match=r"123287 images still to extract need 24\.81 GB \(123287 x 196 "
                                                  r"x 512 values x 2 bytes.*only 3\.20 GB are free.*dataset\.features"
                                                  r"=PATH.*encoder\.grid_size=7.*encoder\.image_size=112") as err:
        check_free_space(tmp_path, COCO_IMAGES, (196, 512))
    assert isinstance(err.value, OSError)  # the CLI prints it as one `error:` line
    _free(monkeypatch, need)
    assert check_free_space(tmp_path, COCO_IMAGES, (196, 512)) == need
    assert check_free_space(tmp_path / "not" / "yet", 0, (4, 512)) == MARGIN_BYTES
    assert [disk.gigabytes(n) for n in (0, 1_100_000, 3_200_000_000)] == ["0.00 GB", "0.0011 GB", "3.20 GB"]


def test_grid_size_is_found_before_any_image_is_read_when_the_transform_fixes_the_size():
    resnet = _resnet().eval()
    with torch.no_grad():
        assert _row_shape(resnet, resnet.transform()) == (4, 512)  # 2 x 2 x 512
        small = SmallCNN(channels=TINY_CHANNELS, num_pools=TINY_POOLS)
        assert _row_shape(small, small.transform()) is None  # images kept at their size: known at the first batch
        sized = SmallCNN(channels=TINY_CHANNELS, num_pools=TINY_POOLS, image_size=32).eval()
        assert _row_shape(sized, sized.transform()) == (64, 16)  # 8 x 8 x 16


def test_extraction_is_refused_before_it_starts(shapes_json, tmp_path, monkeypatch):
    records = read_karpathy(shapes_json, "test")
    encoder = _resnet()
    seen = _calls(encoder)

    def never(path):
        raise AssertionError("an image was read before the free space was checked")

    monkeypatch.setattr("captioning.features.extract.load_image", never)
    _free(monkeypatch, 1000)
    with pytest.raises(NotEnoughSpaceError, match=rf"need {disk.gigabytes(_need(12, 4 * 512))} .*"
                                                  r"only 0\.0000010 GB are free"):
        extract_features(records, encoder, RESNET_CFG, tmp_path / "cache", progress=False)
    assert seen == [1]  # only the probe on a blank image
    assert list((tmp_path / "cache").iterdir()) == []  # no grids.npy, no index or progress


def test_without_a_fixed_image_size_the_check_runs_at_the_first_batch(shapes_json, tmp_path, monkeypatch):
    records = read_karpathy(shapes_json, "test")[:4]
    encoder = SmallCNN(channels=TINY_CHANNELS, num_pools=TINY_POOLS).requires_grad_(False)
    _free(monkeypatch, _need(4, 64 * 16) - 1)  # 32 px, two pools: 8 x 8 x 16
    with pytest.raises(NotEnoughSpaceError, match=r"4 images still to extract"):
        extract_features(records, encoder, TINY_MODEL["encoder"], tmp_path / "cache", batch_size=4, progress=False)
    assert not (tmp_path / "cache" / "grids.npy").exists() and not (tmp_path / "cache" / "progress.json").exists()
    _free(monkeypatch, _need(4, 64 * 16))
    cache = extract_features(records, encoder, TINY_MODEL["encoder"], tmp_path / "cache", batch_size=4,
                             progress=False)
    assert len(cache) == 4 and cache.grid == (8, 8) and cache[records[0].image_id].shape == (64, 16)


def test_a_resumed_cache_needs_space_only_for_the_rows_left(shapes_json, tmp_path, monkeypatch):
    records = read_karpathy(shapes_json, "test")  # 12 images
    encoder = _resnet()
    seen = _calls(encoder)

    def interrupt_after_one_batch(module, args):
        if len(seen) == 2:  # the probe and one batch of 4
            raise KeyboardInterrupt

    hook = encoder.register_forward_pre_hook(interrupt_after_one_batch)
    with pytest.raises(KeyboardInterrupt):
        extract_features(records, encoder, RESNET_CFG, tmp_path / "cache", batch_size=4, progress=False)
    hook.remove()
    assert json.loads((tmp_path / "cache" / "progress.json").read_text())["rows_done"] == 4
    _free(monkeypatch, _need(8, 4 * 512))  # room for the 8 rows left, not for all 12
    with pytest.raises(NotEnoughSpaceError, match="12 images still to extract"):
        extract_features(records, encoder, RESNET_CFG, tmp_path / "fresh", batch_size=4, progress=False)
    seen.clear()
    cache = extract_features(records, encoder, RESNET_CFG, tmp_path / "cache", batch_size=4, progress=False)
    assert seen == [4, 4]  # no probe: the grid size comes from grids.npy
    assert len(cache) == 12 and isinstance(cache.grids, np.memmap)  # rows are read from the mapped file
    assert cache[records[-1].image_id].shape == (4, 512)


def test_a_finished_cache_is_read_memory_mapped(shapes_json, tmp_path):
    records = read_karpathy(shapes_json, "test")[:4]
    extract_features(records, _resnet(), RESNET_CFG, tmp_path / "cache", progress=False)
    cache = FeatureCache.open(tmp_path / "cache")
    row = cache[records[1].image_id]
    assert isinstance(cache.grids, np.memmap) and cache.grids.shape == (4, 4, 512)
    np.testing.assert_array_equal(row.numpy(), np.asarray(cache.grids[1], dtype=np.float32))
