"""Files from strangers, second probe (issue 29): a checkpoint's data section writes only where the user said and
within bounds, sizes are bounded before anything is allocated, one process writes into an output folder at a time,
outputs replace a planted symlink instead of writing through it, and printed names cannot forge a line."""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from fixtures import TINY_MODEL, compose_config
from PIL import Image

from captioning.base.files import NoFollowFileHandler, append_bytes, write_text_atomic
from captioning.base.lock import LOCK_NAME, FolderInUseError
from captioning.base.messages import one_line, printable
from captioning.checkpoint import save_checkpoint
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.shapes.generate import META_NAME, build_shapes
from captioning.data.vocab import Vocabulary
from captioning.evaluate import evaluate
from captioning.factory.load import UnsafeCheckpointError, load_model
from captioning.factory.models import build_captioner
from captioning.tools import caption

SMALL = {"seed": 1, "num_train": 8, "num_val": 4, "num_test": 4, "image_size": 32, "object_scale": 1.0}
HOLDER = """
import sys, time
from captioning.base.lock import FolderLock
FolderLock(sys.argv[1], "evaluation").acquire()
print("locked", flush=True)
time.sleep(600)
"""


def _checkpoint(tmp_path: Path, root: Path, shapes_json: Path, **generate) -> Path:
    """A tiny model's checkpoint whose stored data set is `shapes` generated under `root`."""
    torch.manual_seed(0)
    vocab = Vocabulary.build(c for r in read_karpathy(shapes_json, "train") for c in r.captions)
    model = build_captioner(TINY_MODEL, len(vocab))
    dataset = {"name": "shapes", "root": str(root), "annotations": str(root / "dataset_shapes.json"),
               "image_root": str(root), "min_word_freq": 1, "max_vocab": 10000, "max_caption_len": 20,
               "batch_size": 8, "captions_per_image": 2, "num_workers": 0, "features": None, "prepared": None,
               "reader": {"_target_": "karpathy",
                          "annotations": str(root / "dataset_shapes.json"), "image_root": str(root)},
               "generate": {"_target_": "shapes", "root": str(root),
                            **{**SMALL, **generate}}}
    return save_checkpoint(tmp_path / "model.pt", model, vocab, {"model": TINY_MODEL, "dataset": dataset})


def _evaluate_cfg(checkpoint: Path, data_dir: Path):
    return compose_config(f"checkpoint={checkpoint}", f"data_dir={data_dir}", "device=cpu", "eval.metrics=[bleu]",
                          "eval.num_figures=1", "eval.beam_size=1", "eval.max_len=4", name="evaluate")


def _planted(folder: Path) -> dict[Path, bytes]:
    """Another folder's files, as a generator would write them: train_00000.png, dataset_shapes.json, meta.json."""
    (folder / "images").mkdir(parents=True)
    files = {folder / "images" / "train_00000.png": b"a photo", folder / "dataset_shapes.json": b'{"mine": 1}',
             folder / META_NAME: b'{"not": "shapes"}', folder / "images" / "test_00003.png": b"another"}
    for path, data in files.items():
        path.write_bytes(data)
    return files


def _unchanged(files: dict[Path, bytes]) -> bool:
    return all(p.read_bytes() == data for p, data in files.items())


# -- 1. a checkpoint's dataset.generate ---------------------------------------------------------------------
def test_a_checkpoint_cannot_generate_into_a_folder_outside_data_dir(shapes_json, tmp_path):
    victim = tmp_path / "victim"
    files = _planted(victim)
    ckpt = _checkpoint(tmp_path, victim, shapes_json)
    with pytest.raises(ValueError) as err:
        evaluate(_evaluate_cfg(ckpt, tmp_path / "data"), tmp_path / "eval")
    message = str(err.value)
    assert "\n" not in message and f"dataset.generate.root {victim} is outside data_dir" in message, message
    assert "pass dataset=NAME" in message
    assert _unchanged(files) and sorted(p.name for p in (victim / "images").iterdir()) == ["test_00003.png",
                                                                                         "train_00000.png"]


def test_inside_data_dir_a_folder_that_is_not_a_shapes_data_set_is_not_written(shapes_json, tmp_path):
    data_dir = tmp_path / "data"
    files = _planted(data_dir / "coco")
    ckpt = _checkpoint(tmp_path, data_dir / "coco", shapes_json)
    with pytest.raises(ValueError, match="holds other files and no meta.json of a shapes data set") as err:
        evaluate(_evaluate_cfg(ckpt, data_dir), tmp_path / "eval")
    assert "\n" not in str(err.value) and _unchanged(files)
    with pytest.raises(ValueError, match="refusing to write images there"):  # the generator itself, called directly
        build_shapes(data_dir / "coco", **SMALL)
    assert _unchanged(files)


def test_a_checkpoint_generates_its_data_set_under_data_dir_and_evaluates(shapes_json, tmp_path):
    data_dir = tmp_path / "data"
    ckpt = _checkpoint(tmp_path, data_dir / "shapes", shapes_json)
    metrics = evaluate(_evaluate_cfg(ckpt, data_dir), tmp_path / "eval")
    assert "Bleu_4" in metrics and (data_dir / "shapes" / "images" / "test_00003.png").is_file()
    assert len(list((data_dir / "shapes" / "images").glob("*.png"))) == 16
    # ...and outside data_dir a data set that is already there, made with the same settings, is read as it is
    other = _checkpoint(tmp_path, data_dir / "shapes", shapes_json)
    assert "Bleu_4" in evaluate(_evaluate_cfg(other, tmp_path / "elsewhere"), tmp_path / "eval2")


def test_an_interrupted_generation_continues_in_its_own_folder(tmp_path):
    root = tmp_path / "shapes"
    (root / "images").mkdir(parents=True)
    (root / "images" / "train_00000.png").write_bytes(b"half")
    write_text_atomic(root / META_NAME, json.dumps({"generator": "captioning.data.shapes", "complete": False}))
    path = build_shapes(root, **SMALL)
    assert json.loads((root / META_NAME).read_text())["params"]["num_train"] == 8 and path.is_file()
    assert Image.open(root / "images" / "train_00000.png").size == (32, 32)


@pytest.mark.parametrize("key, value, named", [
    ("num_train", 10**9, "dataset.generate.num_train=1000000000: must be <= 200000"),
    ("num_test", 10**6, "dataset.generate.num_test=1000000: must be <= 200000"),
    ("image_size", 10**6, "dataset.generate.image_size=1000000: must be <= 2048"),
])
def test_generation_sizes_are_bounded_before_anything_is_written(shapes_json, tmp_path, key, value, named):
    data_dir = tmp_path / "data"
    ckpt = _checkpoint(tmp_path, data_dir / "shapes", shapes_json, **{key: value})
    started = time.monotonic()
    with pytest.raises(UnsafeCheckpointError) as err:
        evaluate(_evaluate_cfg(ckpt, data_dir), tmp_path / "eval")
    assert named in str(err.value) and "\n" not in str(err.value)
    assert time.monotonic() - started < 10 and not data_dir.exists() and not (tmp_path / "eval").exists()


# -- 3. sizes in a checkpoint's model config -----------------------------------------------------------------
def test_an_encoder_image_size_of_a_million_is_refused_in_one_line(shapes_json, tmp_path):
    ckpt = _checkpoint(tmp_path, tmp_path / "data" / "shapes", shapes_json)
    stored = torch.load(ckpt, weights_only=True)
    stored["config"]["model"]["encoder"]["image_size"] = 10**6
    torch.save(stored, tmp_path / "big.pt")
    with pytest.raises(UnsafeCheckpointError, match=r"model\.encoder\.image_size=1000000: must be <= 2048"):
        load_model(tmp_path / "big.pt")


# -- 6. weights that are not finite ----------------------------------------------------------------------------
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_not_scored_zero(shapes_json, tmp_path, value):
    ckpt = _checkpoint(tmp_path, tmp_path / "data" / "shapes", shapes_json)
    stored = torch.load(ckpt, weights_only=True)
    for tensor in stored["model"].values():
        if tensor.is_floating_point():
            tensor.fill_(value)
    torch.save(stored, tmp_path / "nan.pt")
    with pytest.raises(ValueError, match="its weights are not finite") as err:
        load_model(tmp_path / "nan.pt")
    assert "\n" not in str(err.value) and "NaN or infinite" in str(err.value)


# -- 4. one writer per output folder ---------------------------------------------------------------------------
@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of tmp_path/eval; yields (folder, process)."""
    folder = tmp_path / "eval"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    yield folder, proc
    proc.kill()
    proc.wait()


@pytest.mark.integration
def test_a_second_evaluation_into_a_folder_in_use_is_refused(shapes_json, tmp_path, holder):
    folder, proc = holder
    ckpt = _checkpoint(tmp_path, shapes_json.parent, shapes_json, **{"seed": 1, "num_train": 48, "num_val": 12,
                                                                     "num_test": 12})
    with pytest.raises(FolderInUseError, match=rf"in use by another evaluation \(PID {proc.pid}\)") as err:
        evaluate(_evaluate_cfg(ckpt, tmp_path / "data"), folder)
    assert "\n" not in str(err.value) and sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]
    proc.kill()
    proc.wait()
    assert "Bleu_4" in evaluate(_evaluate_cfg(ckpt, tmp_path / "data"), folder)  # the lock dies with its holder


# -- 8. symlinks planted in an output folder; control characters in names --------------------------------------
def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_evaluation_replaces_symlinks_planted_at_its_outputs(shapes_json, tmp_path):
    ckpt = _checkpoint(tmp_path, shapes_json.parent, shapes_json, **{"seed": 1, "num_train": 48, "num_val": 12,
                                                                     "num_test": 12})
    out = tmp_path / "eval"
    out.mkdir()
    targets = {}
    for name in ("metrics.json", "results.json", "per_image_scores.json", "worst_by_cider.json", "report.html",
                 "attention.npz", LOCK_NAME):
        target = tmp_path / f"target-{name}"
        target.write_text("precious")
        (out / name).symlink_to(target)
        targets[target] = _digest(target)
    evaluate(_evaluate_cfg(ckpt, tmp_path / "data"), out)
    assert all(_digest(t) == d for t, d in targets.items())  # no target was written through its link
    written = [p for p in out.iterdir() if p.is_file() and not p.is_symlink()]
    assert {"metrics.json", "results.json", "report.html", "attention.npz", LOCK_NAME} <= {p.name for p in written}
    assert not (out / "metrics.json").is_symlink()


def test_logs_and_appends_replace_a_planted_symlink(tmp_path):
    target = tmp_path / "target.txt"
    target.write_text("precious")
    (tmp_path / "run.log").symlink_to(target)
    handler = NoFollowFileHandler(tmp_path / "run.log")
    handler.emit(logging.makeLogRecord({"msg": "a log line", "levelno": logging.INFO}))
    handler.close()
    (tmp_path / "log.jsonl").symlink_to(target)
    append_bytes(tmp_path / "log.jsonl", b'{"a": 1}\n')
    assert target.read_text() == "precious" and not (tmp_path / "run.log").is_symlink()
    assert "a log line" in (tmp_path / "run.log").read_text() and (tmp_path / "log.jsonl").read_bytes() == b'{"a": 1}\n'


def test_control_characters_in_names_cannot_forge_a_line(tmp_path, capsys):
    assert printable("a\nb\tc\x1b[2J.png") == "a\\nb\\tc\\x1b[2J.png" and printable("été.png") == "été.png"
    assert one_line(f"cannot read image {tmp_path}/x\ny.png\r") == f"cannot read image {tmp_path}/x; y.png"
    vocab = Vocabulary.build([["a", "red", "circle"]])
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "model.pt", build_captioner(TINY_MODEL, len(vocab)), vocab,
                           {"model": TINY_MODEL})
    forged = tmp_path / "x\nforged.png"
    Image.new("RGB", (32, 32), "red").save(forged, format="PNG")
    broken = tmp_path / "y\x1b[2Jz.png"
    broken.write_bytes(b"not an image")
    code = caption.main([str(forged), str(broken), "--checkpoint", str(ckpt), "--max-len", "3"])
    out, err = capsys.readouterr()
    assert code == 1 and len(out.splitlines()) == 1 and out.startswith(f"{tmp_path}/x\\nforged.png\t")
    assert "\x1b" not in err and "y\\x1b[2Jz.png" in err and len(err.splitlines()) == 2


def test_a_thin_strip_is_refused_before_an_encoder_resize_makes_it_a_bomb(tmp_path):
    from captioning.data.images import ImageError, load_image

    Image.new("RGB", (60_000, 1), "red").save(tmp_path / "strip.png")  # 60,000 pixels, a few hundred bytes
    with pytest.raises(ImageError, match=r"image too elongated: .*strip.png is 60000 x 1, over 200:1"):
        load_image(tmp_path / "strip.png")
    Image.new("RGB", (400, 2), "red").save(tmp_path / "banner.png")  # 200:1 is still an image
    assert load_image(tmp_path / "banner.png").size == (400, 2)


@pytest.mark.integration
def test_the_console_command_writes_hydra_files_and_log_in_place_of_planted_links(shapes_json, tmp_path):
    ckpt = _checkpoint(tmp_path, shapes_json.parent, shapes_json, **{"seed": 1, "num_train": 48, "num_val": 12,
                                                                     "num_test": 12})
    target = tmp_path / "target.txt"
    target.write_text("precious")
    out = tmp_path / "eval"
    (out / ".hydra").mkdir(parents=True)
    for name in (".hydra/config.yaml", ".hydra/overrides.yaml", "evaluate.log", "metrics.json"):
        (out / name).symlink_to(target)
    run = subprocess.run([str(Path(sys.executable).parent / "captioning-evaluate"), f"checkpoint={ckpt}",
                          f"hydra.run.dir={out}", "eval.metrics=[bleu]", "eval.max_len=3", "device=cpu"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    assert target.read_text() == "precious"
    for name in (".hydra/config.yaml", ".hydra/overrides.yaml", "evaluate.log", "metrics.json"):
        assert (out / name).is_file() and not (out / name).is_symlink()
    assert "checkpoint:" in (out / ".hydra" / "config.yaml").read_text()
