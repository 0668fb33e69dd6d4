"""Feature caches crafted the way a stranger's could be (issue 29, item 5): NaN or inf in the grids, malformed
meta.json / index.json / progress.json, FIFOs and folders in place of files, grids.npy of another dtype or shape.
Each is one refusal line (a ValueError or FileNotFoundError naming the file, ending with what to do) from
FeatureCache.open / open_features / the training entry, or a row refused when read; never a traceback from deep
inside, a hang, or numbers computed from garbage. The crafted caches are copies of one tiny real cache."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fixtures import TINY_CHANNELS, TINY_ENCODER, TINY_POOLS, compose_config, tiny_overrides

from captioning.data.dataset import CaptionDataset
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import Vocabulary
from captioning.features.cache import FeatureCache, open_features
from captioning.features.checks import HOW_TO_EXTRACT, SAMPLE_ROWS
from captioning.features.extract import extract_features
from captioning.models.encoder import SmallCNN
from captioning.tools.extract_features import extract
from captioning.train import train

CFG = {"_target_": "small_cnn", "channels": list(TINY_CHANNELS), "num_pools": TINY_POOLS,
       "image_size": 32}
D = TINY_CHANNELS[-1]


def _encoder() -> SmallCNN:
    torch.manual_seed(0)
    return SmallCNN(channels=tuple(TINY_CHANNELS), num_pools=TINY_POOLS, image_size=32).requires_grad_(False)


@pytest.fixture(scope="module")
def records(shapes_json: Path):
    """All 72 images of the `shapes_json` set: more rows than FeatureCache.open samples."""
    return [r for split in ("train", "val", "test") for r in read_karpathy(shapes_json, split)]


@pytest.fixture(scope="module")
def made(records, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny cache (72 x 64 x 16 float16), copied by each test before it is damaged."""
    out = tmp_path_factory.mktemp("made") / "cache"
    extract_features(records, _encoder(), CFG, out, batch_size=16, progress=False)
    return out


@pytest.fixture
def cache_dir(made: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(made, tmp_path / "cache"))


@pytest.fixture
def no_hang() -> Iterator[None]:
    """A test that would block (reading a FIFO) fails after 20 s instead of hanging the run."""
    def stop(signum, frame):
        raise TimeoutError("blocked for 20 s: a FIFO was opened")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def refusal(kind: type[Exception], call: Callable[[], Any], *names: str) -> str:
    """Run `call`, which must raise `kind` with one line that names each of `names` and ends with how to extract."""
    with pytest.raises(kind) as err:
        call()
    assert type(err.value) is kind  # not a subclass such as JSONDecodeError or UnicodeDecodeError
    message = str(err.value)
    assert "\n" not in message and message.endswith(HOW_TO_EXTRACT), message
    for name in names:
        assert name in message, message
    return message


def _poison(cache_dir: Path, row: int, value: float) -> None:
    grids = np.load(cache_dir / "grids.npy", mmap_mode="r+")
    grids[row, 1, 3] = value
    grids.flush()


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("row", [0, 71])  # the sample spans the file: its first and last rows are always in it
def test_non_finite_grids_are_refused_when_opened(cache_dir, records, value, row):
    _poison(cache_dir, row, value)
    image_id = sorted(r.image_id for r in records)[row]
    message = refusal(ValueError, lambda: FeatureCache.open(cache_dir), str(cache_dir / "grids.npy"),
                      f"row {row} (image {image_id}) holds NaN or inf")
    assert refusal(ValueError, lambda: open_features(cache_dir, _encoder(), CFG)) == message


def test_open_samples_a_fixed_number_of_rows_and_every_row_read_is_checked(cache_dir, records, shapes_json):
    """Opening reads SAMPLE_ROWS rows whatever N; a NaN in a row the sample left out is refused when that row is
    read, for training or evaluation (a ValueError: not an unreadable image to skip and count)."""
    ids = sorted(r.image_id for r in records)
    vocab = Vocabulary.build(c for r in records for c in r.captions)
    caught_at_open = []
    for row in range(len(ids)):
        _poison(cache_dir, row, np.nan)
        try:
            cache = FeatureCache.open(cache_dir)
        except ValueError as err:
            assert f"row {row} (image {ids[row]}) holds NaN or inf" in str(err)
            caught_at_open.append(row)
        else:
            image_id = ids[row]
            refusal(ValueError, lambda c=cache, i=image_id: c[i], str(cache_dir / "grids.npy"), f"image {image_id}")
            one = [r for r in records if r.image_id == image_id]
            data = CaptionDataset(one, vocab, lambda im: im, features=cache)  # as training and evaluation read it
            refusal(ValueError, lambda d=data: d[0], f"row {row} (image {image_id})")
            assert torch.isfinite(cache[ids[row - 1]]).all()  # the other rows still read
        _poison(cache_dir, row, 0.0)
    assert len(caught_at_open) == SAMPLE_ROWS < len(ids) and {0, len(ids) - 1} <= set(caught_at_open)


@pytest.mark.parametrize("scale, message", [(float("nan"), "the encoder gives NaN or inf for image"),
                                            (1e6, "exceed float16's range (65504)")])
def test_extraction_refuses_to_store_a_non_finite_grid_and_resumes(records, tmp_path, scale, message):
    """The batch holding the image is not stored; earlier batches are, and a rerun resumes at it."""
    encoder, ids = _encoder(), sorted(r.image_id for r in records)
    bad = records[[r.image_id for r in records].index(ids[20])]  # row 20: the second batch of 16

    batches = []

    def corrupt(module, args, out):
        if not args[0].any():  # the grid-size probe on a blank image
            return out
        batches.append(len(out))
        if len(batches) == 2:
            out = out.clone()
            out[4] *= scale  # the 5th image of rows 16..31
        return out

    hook = encoder.register_forward_hook(corrupt)
    with pytest.raises(ValueError) as err:
        extract_features(records, encoder, CFG, tmp_path / "cache", batch_size=16, progress=False)
    assert message in str(err.value) and f"image {bad.image_id} ({bad.path})" in str(err.value)
    assert "\n" not in str(err.value)
    assert json.loads((tmp_path / "cache" / "progress.json").read_text())["rows_done"] == 16
    hook.remove()
    cache = extract_features(records, encoder, CFG, tmp_path / "cache", batch_size=16, progress=False)
    assert cache.meta["checked_finite"] is True and np.isfinite(np.asarray(cache.grids)).all()


def _meta(change: dict) -> Callable[[Path], None]:
    return _edit("meta.json", lambda meta: {**meta, **change})


def _edit(name: str, how: Callable[[Any], Any]) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        (root / name).write_text(json.dumps(how(json.loads((root / name).read_text()))))
    return edit


def _raw(name: str, content: bytes) -> Callable[[Path], None]:
    return lambda root: (root / name).write_bytes(content)


def _replace(name: str, make: Callable[[Path], Any]) -> Callable[[Path], None]:
    def replace(root: Path) -> None:
        (root / name).unlink()
        make(root / name)
    return replace


def _ids(how: Callable[[list[int]], list[Any]]) -> Callable[[Path], None]:
    return _edit("index.json", lambda index: {**index, "image_ids": how(index["image_ids"])})


def _progress(change: dict) -> Callable[[Path], None]:
    return _edit("progress.json", lambda progress: {**progress, **change})


def _both(*damages: Callable[[Path], None]) -> Callable[[Path], None]:
    def both(root: Path) -> None:
        for damage in damages:
            damage(root)
    return both


MALFORMED = {  # case: (how the cache is damaged, the file the refusal names, what it says)
    "meta a list": (_edit("meta.json", lambda m: [m]), "meta.json", "holds list"),
    "meta without format": (_edit("meta.json", lambda m: {**m, "format": None}), "cache", "in format None"),
    "meta without fingerprint": (_edit("meta.json", lambda m: {k: v for k, v in m.items() if k != "fingerprint"}),
                                 "meta.json", 'no "fingerprint" object'),
    "fingerprint a list": (_meta({"fingerprint": [1]}), "meta.json", 'no "fingerprint" object'),
    "dim a string": (_edit("meta.json", lambda m: {**m, "fingerprint": {**m["fingerprint"], "dim": "16"}}),
                     "meta.json", "\"fingerprint.dim\" '16'"),
    "grid a string": (_meta({"grid": "8x8"}), "meta.json", "\"grid\" '8x8', not two positive integers"),
    "grid negative": (_meta({"grid": [-8, -8]}), "meta.json", '"grid" [-8, -8]'),
    "grid of floats": (_meta({"grid": [8.0, 8.0]}), "meta.json", '"grid" [8.0, 8.0]'),
    "grid of one": (_meta({"grid": [64]}), "meta.json", '"grid" [64]'),
    "dtype unknown": (_meta({"dtype": "float17"}), "meta.json", "\"dtype\" 'float17', not the name of a float type"),
    "dtype a number": (_meta({"dtype": 16}), "meta.json", '"dtype" 16'),
    "dtype not float": (_meta({"dtype": "int8"}), "meta.json", "\"dtype\" 'int8'"),
    "dtype objects": (_meta({"dtype": "object"}), "meta.json", "\"dtype\" 'object'"),
    "index a list": (_edit("index.json", lambda index: index["image_ids"]), "index.json", "holds list"),
    "ids missing": (_edit("index.json", lambda index: {"paths": index["paths"]}), "index.json", '"image_ids" None'),
    "ids empty": (_ids(lambda ids: []), "index.json", '"image_ids" []'),
    "ids strings": (_ids(lambda ids: [str(i) for i in ids]), "index.json", "'0' as \"image_ids\"[0]"),
    "ids floats": (_ids(lambda ids: [float(i) for i in ids]), "index.json", '0.0 as "image_ids"[0]'),
    "ids bools": (_ids(lambda ids: [True] * len(ids)), "index.json", 'True as "image_ids"[0]'),
    "ids duplicated": (_ids(lambda ids: [*ids[:-1], ids[0]]), "index.json", 'names image 0 twice in "image_ids" '
                                                                           "(entries 0 and 71)"),
    "ids fewer than rows": (_both(_ids(lambda ids: ids[:-1]), _progress({"rows_done": 71})), "grids.npy",
                            f"holds 72x64x{D} float16 but meta.json and index.json describe 71x64x{D} float16"),
    "progress a list": (_edit("progress.json", lambda p: [p]), "progress.json", "holds list"),
    "rows a string": (_progress({"rows_done": "72"}), "progress.json", "\"rows_done\" '72', not an integer from 0 "
                                                                       "to 72"),
    "rows a float": (_progress({"rows_done": 72.0}), "progress.json", '"rows_done" 72.0'),
    "rows a bool": (_progress({"rows_done": True}), "progress.json", '"rows_done" True'),
    "rows too many": (_progress({"rows_done": 73}), "progress.json", '"rows_done" 73'),
    "rows negative": (_progress({"rows_done": -1}), "progress.json", '"rows_done" -1'),
    "failed a list": (_progress({"failed": [3]}), "progress.json", '"failed" [3], not an object'),
    "failed reason a number": (_progress({"failed": {"3": 5}}), "progress.json", "\"failed\" {'3': 5}"),
    "failed image unknown": (_progress({"failed": {"-1": "gone"}}), "progress.json", "for image '-1', which "
                                                                                     "index.json does not list"),
    "meta not UTF-8": (_raw("meta.json", b'{"format": "caf\xe9"}'), "meta.json", "is not UTF-8 text"),
    "index not JSON": (_raw("index.json", b'{"image_ids": [1, 2'), "index.json", "is not valid JSON"),
    "progress empty": (_raw("progress.json", b""), "progress.json", "is not valid JSON"),
    "meta nested too deep": (_raw("meta.json", b"[" * 100_000 + b"]" * 100_000), "meta.json", "is unreadable"),
    "meta a FIFO": (_replace("meta.json", os.mkfifo), "meta.json", "is not a regular file (a FIFO"),
    "index a FIFO": (_replace("index.json", os.mkfifo), "index.json", "is not a regular file (a FIFO"),
    "progress a FIFO": (_replace("progress.json", os.mkfifo), "progress.json", "is not a regular file (a FIFO"),
    "meta a folder": (_replace("meta.json", Path.mkdir), "meta.json", "is not a regular file (a directory)"),
    "index a folder": (_replace("index.json", Path.mkdir), "index.json", "is not a regular file (a directory)"),
    "progress a folder": (_replace("progress.json", Path.mkdir), "progress.json", "is not a regular file (a dir"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_json_files_are_one_line_naming_the_file(cache_dir, case, no_hang):
    damage, name, detail = MALFORMED[case]
    damage(cache_dir)
    path = str(cache_dir if name == "cache" else cache_dir / name)
    refusal(ValueError, lambda: FeatureCache.open(cache_dir), path, detail)
    refusal(ValueError, lambda: open_features(cache_dir, _encoder(), CFG), path, detail)


def test_missing_files_are_file_not_found(cache_dir):
    (cache_dir / "index.json").unlink()
    refusal(FileNotFoundError, lambda: FeatureCache.open(cache_dir), str(cache_dir / "index.json"), "is missing")
    shutil.rmtree(cache_dir)
    cache_dir.mkdir()
    refusal(FileNotFoundError, lambda: FeatureCache.open(cache_dir), "no feature cache at", "meta.json missing")


@pytest.mark.parametrize("case", ["meta a list", "ids strings", "rows a string", "progress a FIFO", "meta a FIFO"])
def test_extraction_into_a_malformed_cache_is_refused_the_same_way(cache_dir, records, case, no_hang):
    """Resuming an extraction reads the same files through the same checks (a FIFO meta.json is not a cache)."""
    damage, name, detail = MALFORMED[case]
    damage(cache_dir)
    if case == "meta a FIFO":
        with pytest.raises(ValueError, match="exists and is not a feature cache"):
            extract_features(records, _encoder(), CFG, cache_dir, progress=False)
        return
    refusal(ValueError, lambda: extract_features(records, _encoder(), CFG, cache_dir, progress=False),
            str(cache_dir / name), detail)


@pytest.mark.parametrize("grids, meta, detail", [
    (np.zeros((72, 64, D), np.float32), {}, f"holds 72x64x{D} float32 but meta.json and index.json describe "
                                            f"72x64x{D} float16"),
    (None, {"dtype": "float32"}, f"holds 72x64x{D} float16 but meta.json and index.json describe 72x64x{D} float32"),
    (np.zeros((72, 64, D + 1), np.float16), {}, f"holds 72x64x{D + 1} float16 but .* describe 72x64x{D} float16"),
    (np.zeros((72, 16, 4 * D), np.float16), {}, f"holds 72x16x{4 * D} float16 but .* describe 72x64x{D} float16"),
])
def test_grids_of_another_dtype_or_shape_than_meta_says_are_refused(cache_dir, grids, meta, detail):
    if grids is not None:
        np.save(cache_dir / "grids.npy", grids)
    _meta(meta)(cache_dir)
    message = refusal(ValueError, lambda: open_features(cache_dir, _encoder(), CFG), str(cache_dir / "grids.npy"))
    assert re.search(detail, message), message


def test_the_training_entry_refuses_a_non_finite_cache_before_training(shapes_json, tmp_path):
    """captioning-train with dataset.features: the same one line, from train(cfg) (a frozen random ResNet-18)."""
    resnet = ["encoder=resnet50", "encoder.arch=resnet18", "encoder.pretrained=false", "encoder.fine_tune=none",
              "encoder.image_size=64", "encoder.grid_size=2", f"dataset.features={tmp_path / 'features'}"]
    overrides = [o for o in tiny_overrides(shapes_json.parent) if o not in TINY_ENCODER] + resnet
    cache = extract(compose_config(*overrides, name="extract_features"))
    cfg = compose_config(*overrides)
    assert cache.grids.shape == (72, 4, 512)  # (N, L, D)
    _poison(tmp_path / "features", 0, np.inf)
    refusal(ValueError, lambda: train(cfg, tmp_path / "run"), str(tmp_path / "features" / "grids.npy"),
            "row 0 (image 0) holds NaN or inf")
    assert not (tmp_path / "run" / "checkpoints").exists()
