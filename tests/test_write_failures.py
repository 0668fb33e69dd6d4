"""A failed write loses nothing: for every file the project writes, a write that fails (disk full, I/O error, a folder
made read-only) keeps the previous version byte for byte, leaves no temporary file, and says `cannot write FILE:
REASON` on one line; what is written bit by bit (the feature cache, the caption log) resumes where it stopped.
(The writer itself: tests/base/test_files.py; the fault injection: fixtures.fail_writes.)"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import TINY_CHANNELS, TINY_MODEL, TINY_POOLS, compose_tiny_train, fail_writes
from PIL import Image
from synthetic_text import karpathy_file

from captioning.base.lock import LOCK_NAME
from captioning.checkpoint import read_checkpoint, save_checkpoint
from captioning.data.dataset import CaptionDataset
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import Vocabulary
from captioning.evaluation.outputs import write_outputs
from captioning.factory.datasets import load_table
from captioning.factory.models import build_captioner
from captioning.features.extract import extract_features
from captioning.models.encoder import SmallCNN
from captioning.reporting.figures import plot_attention
from captioning.reporting.html import save_attention, write_report
from captioning.reporting.items import Prediction, ReportItem
from captioning.tools import caption, score
from captioning.train import train

FAULTS = [("write", errno.ENOSPC), ("fsync", errno.EIO), ("replace", errno.ENOSPC), ("create", errno.EACCES)]


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _message(path: Path, code: int) -> str:
    return f"cannot write {path}: {os.strerror(code)}"


@pytest.mark.parametrize("at, code", FAULTS)
@pytest.mark.parametrize("name", ["last.pt", "best.pt"])
def test_a_failed_checkpoint_save_keeps_the_previous_checkpoint(tiny_model, tmp_path, monkeypatch, name, at, code):
    vocab = Vocabulary.build([["a", "red", "circle"]])
    path = save_checkpoint(tmp_path / name, tiny_model, vocab, {"model": TINY_MODEL}, step=4)
    before = path.read_bytes()
    torch.nn.init.ones_(tiny_model.decoder.L_o.weight)  # the run went on: the next save holds other weights
    fail_writes(monkeypatch, code, at, name, room=4096)
    with pytest.raises(OSError, match=f"^{re.escape(_message(path, code))}$") as err:
        save_checkpoint(path, tiny_model, vocab, {"model": TINY_MODEL}, step=6)
    assert err.value.errno == code
    assert path.read_bytes() == before and _files(tmp_path) == [name]
    assert read_checkpoint(path)["step"] == 4  # the run resumes from the last good checkpoint


@pytest.fixture(scope="module")
def decoded(shapes_json):
    """Hand-made predictions of the test split (two words, uniform 8 x 8 maps) and its dataset."""
    records = read_karpathy(shapes_json, "test")
    vocab = Vocabulary.build(c for r in records for c in r.captions)
    preds = [Prediction(i, r.image_id, ["a", "shape"], torch.full((2, 8, 8), 1 / 64), {"CIDEr": 0.1 * i})
             for i, r in enumerate(records)]
    return preds, CaptionDataset(records, vocab, transform=None)


# an fsync fault knows no file name: it fails the first file written, metrics.json
@pytest.mark.parametrize("name, at, code", [("metrics.json", "write", errno.ENOSPC), ("metrics.json", "fsync", errno.EIO),
                                            ("results.json", "write", errno.EIO),
                                            ("results.json", "replace", errno.ENOSPC),
                                            ("results.json", "create", errno.EACCES)])
def test_a_failed_evaluation_output_keeps_its_previous_version(decoded, tmp_path, monkeypatch, name, at, code):
    preds, ds = decoded
    write_outputs(tmp_path, preds, ds, {"CIDEr": 0.5}, num_figures=0, report=False)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    fail_writes(monkeypatch, code, at, name, room=8)
    with pytest.raises(OSError, match=f"^{re.escape(_message(tmp_path / name, code))}$"):
        write_outputs(tmp_path, preds[:3], ds, {"CIDEr": 0.9}, num_figures=0, report=False)
    assert (tmp_path / name).read_bytes() == before[name] and _files(tmp_path) == sorted(before)


@pytest.mark.parametrize("name", ["report.html", "attention.npz"])
def test_a_failed_report_keeps_its_previous_version(tmp_path, monkeypatch, name):
    items = [ReportItem(7, ["a", "red"], ["a red circle"], {"CIDEr": 0.5}, None, np.full((2, 3, 3), 1 / 9))]

    def write(path: Path) -> None:
        write_report(path, items, {"CIDEr": 0.5}) if name == "report.html" else save_attention(path, items)

    write(tmp_path / name)
    before = (tmp_path / name).read_bytes()
    items[0].scores["CIDEr"], items[0].alphas = 0.9, np.full((2, 3, 3), 2 / 9)
    fail_writes(monkeypatch, errno.ENOSPC, "write", name)
    with pytest.raises(OSError, match=f"^{re.escape(_message(tmp_path / name, errno.ENOSPC))}$"):
        write(tmp_path / name)
    assert (tmp_path / name).read_bytes() == before and _files(tmp_path) == [name]


@pytest.mark.parametrize("at, code", FAULTS[:2])
def test_a_failed_figure_keeps_its_previous_version(tmp_path, monkeypatch, at, code):
    path = tmp_path / "figures" / "42.png"
    plot_attention(Image.new("RGB", (32, 32), "red"), ["a", "red"], np.full((2, 4, 4), 1 / 16), path)
    before = path.read_bytes()
    fail_writes(monkeypatch, code, at, "42.png", room=512)
    with pytest.raises(OSError, match=f"^{re.escape(_message(path, code))}$"):
        plot_attention(Image.new("RGB", (32, 32), "blue"), ["a", "blue"], np.full((2, 4, 4), 1 / 16), path)
    assert path.read_bytes() == before and _files(path.parent) == ["42.png"]


def _encoder() -> SmallCNN:
    torch.manual_seed(0)
    return SmallCNN(channels=tuple(TINY_CHANNELS), num_pools=TINY_POOLS, image_size=32).requires_grad_(False)


def test_a_failed_grids_write_keeps_progress_at_the_last_flushed_batch_and_a_rerun_finishes(shapes_json, tmp_path,
                                                                                         monkeypatch):
    records = read_karpathy(shapes_json, "test")  # 12 images: 3 batches of 4
    cfg = {"_target_": "small_cnn", "channels": list(TINY_CHANNELS),
           "num_pools": TINY_POOLS, "image_size": 32}
    clean = extract_features(records, _encoder(), cfg, tmp_path / "clean", batch_size=4, progress=False)
    out, flushes, progress = tmp_path / "cache", [], {}
    real_flush = np.memmap.flush

    def flush(self):
        flushes.append(1)
        if len(flushes) == 2:  # the second batch: its rows do not reach the disk
            progress["before"] = (out / "progress.json").read_bytes()
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_flush(self)

    monkeypatch.setattr(np.memmap, "flush", flush)
    with pytest.raises(OSError, match=f"^{re.escape(_message(out / 'grids.npy', errno.EIO))}$"):
        extract_features(records, _encoder(), cfg, out, batch_size=4, progress=False)
    monkeypatch.undo()
    assert (out / "progress.json").read_bytes() == progress["before"]
    assert json.loads(progress["before"])["rows_done"] == 4
    assert not [p for p in out.iterdir() if p.suffix == ".tmp"]
    cache = extract_features(records, _encoder(), cfg, out, batch_size=4, progress=False)  # resumes at row 4
    assert np.array_equal(np.asarray(cache.grids), np.asarray(clean.grids))
    assert json.loads((out / "progress.json").read_text())["rows_done"] == len(records)


def test_a_failed_prepared_set_leaves_no_set_nor_temporary_folder_and_the_next_run_builds_it(tmp_path, monkeypatch,
                                                                                            caplog):
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(karpathy_file({"train": 20, "val": 4, "test": 4}, seed=0)))
    cfg = {"reader": {"_target_": "karpathy", "annotations": str(path),
                      "image_root": str(tmp_path / "images")}, "prepared": str(tmp_path / "prepared"),
           "min_word_freq": 1, "max_vocab": None}
    failed = fail_writes(monkeypatch, errno.ENOSPC, "write", "train.tokens.npy")
    with caplog.at_level(logging.WARNING, "captioning.data.prepared.store"):
        in_memory = load_table(cfg)
    assert failed and in_memory is not None and len(in_memory.split("train")) == 20  # the run goes on in memory
    assert _message(failed[0], errno.ENOSPC) in caplog.text and failed[0].parent.name.startswith(".")
    assert _files(tmp_path / "prepared") == [LOCK_NAME]  # no set, no temporary folder (the lock file stays)
    monkeypatch.undo()
    load_table(cfg)
    (built,) = (p for p in (tmp_path / "prepared").iterdir() if p.name != LOCK_NAME)
    assert (built / "manifest.json").is_file() and not built.name.startswith(".")


@pytest.fixture
def photos(tmp_path):
    """A tiny checkpoint and six images to caption."""
    vocab = Vocabulary.build([["a", "red", "circle"], ["a", "blue", "square"]])
    torch.manual_seed(0)
    ckpt = save_checkpoint(tmp_path / "model.pt", build_captioner(TINY_MODEL, len(vocab)), vocab,
                           {"model": TINY_MODEL})
    (tmp_path / "images").mkdir()
    paths = []
    for n, colour in enumerate(("red", "blue", "green", "white", "black", "yellow")):
        paths.append(tmp_path / "images" / f"{n}.png")
        Image.new("RGB", (32, 32), colour).save(paths[-1])
    return ckpt, paths


def _full_disk_on_append(monkeypatch: pytest.MonkeyPatch, log: Path, at_call: int) -> None:
    """The disk fills during the `at_call`-th write to `log`: 5 bytes of it land, then ENOSPC."""
    real_write, calls = os.write, []

    def write(fd, data):
        if not (log.exists() and os.path.samestat(os.fstat(fd), os.stat(log))):
            return real_write(fd, data)
        calls.append(1)
        if len(calls) != at_call:
            return real_write(fd, data)
        real_write(fd, bytes(data[:5]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)


def test_a_failed_caption_log_append_keeps_the_earlier_lines_and_resume_finishes(photos, tmp_path, monkeypatch,
                                                                                capsys):
    ckpt, paths = photos
    args = [*map(str, paths), "--checkpoint", str(ckpt), "--batch-size", "2", "--max-len", "3", "--beam-size", "2"]
    full, part = tmp_path / "full.jsonl", tmp_path / "part.jsonl"
    assert caption.main([*args, "--jsonl", str(full)]) == 0
    capsys.readouterr()
    _full_disk_on_append(monkeypatch, part, at_call=2)
    with pytest.raises(SystemExit) as stop:
        caption.main([*args, "--jsonl", str(part)])
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"captioning-caption: error: {_message(part, errno.ENOSPC)}\n"
    monkeypatch.undo()
    text = part.read_text()
    assert text.endswith("\n") and len(text.splitlines()) == 2  # the first batch, whole; nothing of the second
    assert caption.main([*args, "--jsonl", str(part), "--resume"]) == 0
    assert "captioned 4 images" in capsys.readouterr().err
    assert sorted(part.read_text().splitlines()) == sorted(full.read_text().splitlines())


@pytest.mark.parametrize("at, code", [*FAULTS, ("replace", errno.EROFS)])
def test_the_score_command_stops_with_one_line_and_keeps_the_earlier_file(tmp_path, monkeypatch, capsys, at, code):
    anns = [{"image_id": 1, "id": 1, "caption": "a red circle"}, {"image_id": 2, "id": 2, "caption": "a blue square"}]
    (tmp_path / "captions.json").write_text(json.dumps({"images": [{"id": 1}, {"id": 2}], "annotations": anns}))
    (tmp_path / "results.json").write_text(json.dumps([{"image_id": 1, "caption": "a red circle"},
                                                       {"image_id": 2, "caption": "a red square"}]))
    out = tmp_path / "scores" / "metrics.json"
    out.parent.mkdir()
    out.write_text('{"CIDEr": 1.5}\n')
    argv = ["--annotations", str(tmp_path / "captions.json"), "--results", str(tmp_path / "results.json"),
            "--metrics", "bleu,cider", "--tokenizer", "python", "--out", str(out)]
    failed = fail_writes(monkeypatch, code, at, "metrics.json")
    with pytest.raises(SystemExit) as stop:
        score.main(argv)
    assert failed and stop.value.code == 2
    assert capsys.readouterr().err == f"captioning-score: error: {_message(out, code)}\n"
    assert out.read_text() == '{"CIDEr": 1.5}\n' and _files(out.parent) == ["metrics.json"]
    monkeypatch.undo()
    assert score.main(argv) == 0 and "Bleu_1" in json.loads(out.read_text())


@pytest.mark.parametrize("name", ["last.pt", "history.json"])
def test_a_training_run_stopped_by_a_failed_write_keeps_epoch_1_and_resumes(shapes_json, tmp_path, monkeypatch, name):
    """The disk fills while epoch 2's last.pt or history.json is written: the run stops with the one-line error,
    epoch 1's file is intact and no temporary file is left; `resume=auto` then finishes the run."""
    import captioning.base.files as files

    run, temporary, writes = tmp_path / "run", files._temporary, []

    def full_at_the_second(path: Path):
        writes.append(path.name)
        if path.name == name and writes.count(name) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return temporary(path)

    monkeypatch.setattr(files, "_temporary", full_at_the_second)
    settings = ("eval.num_figures=0", "eval.metrics=[bleu]", "trainer.max_epochs=2")
    target = run / "checkpoints" / name if name.endswith(".pt") else run / name
    with pytest.raises(OSError, match=f"^{re.escape(_message(target, errno.ENOSPC))}$"):
        train(compose_tiny_train(shapes_json, *settings), run)
    assert read_checkpoint(run / "checkpoints" / "last.pt")["epoch"] == 1
    # last.pt is written last: history.json then holds epoch 2 already, which the resumed run writes again
    epochs = [1] if name == "history.json" else [1, 2]
    assert [e["epoch"] for e in json.loads((run / "history.json").read_text())] == epochs
    assert not list(run.rglob("*.tmp"))
    monkeypatch.setattr(files, "_temporary", temporary)
    train(compose_tiny_train(shapes_json, *settings, "resume=auto"), run)
    assert [e["epoch"] for e in json.loads((run / "history.json").read_text())] == [1, 2]
    assert read_checkpoint(run / "checkpoints" / "last.pt")["epoch"] == 2
