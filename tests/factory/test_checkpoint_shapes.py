"""A checkpoint cannot make the loader allocate more than its weights need (issue 27, SECURITY.md).

The model a checkpoint's config describes is built on the `meta` device first and every parameter's and buffer's
shape and dtype compared with the stored weights; a config that asks for more (the "memory bomb": one number of the
stored config changed) is refused with one line naming the first mismatching key and both shapes, before a real
model is built. Every entry point that reads a checkpoint goes through it: captioning-caption, captioning-evaluate,
captioning-html --checkpoint, captioning-export, captioning-demo and the Python API (`captioning.load`, the
notebook's loader); resume and init_from compare the stored model config with the run's before reading weights.
"""

from __future__ import annotations

import copy
import json
import re
import resource
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fixtures import TINY_MODEL, compose_config, compose_tiny_train

import captioning
from captioning.checkpoint import save_checkpoint
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import Vocabulary
from captioning.evaluate import evaluate
from captioning.export.exporter import export_checkpoint
from captioning.factory import load as checkpoints
from captioning.factory.models import build_captioner
from captioning.tools import caption, demo
from captioning.tools import html as html_report
from captioning.train import train

BOMB = 10_000_000  # hidden units: a 4 x 10^7 x 10^7-sized LSTM if it were built


@pytest.fixture
def good(shapes_json: Path, tmp_path: Path) -> Path:
    """A tiny model's checkpoint with the dataset section training writes."""
    torch.manual_seed(0)
    vocab = Vocabulary.build(c for r in read_karpathy(shapes_json, "train") for c in r.captions)
    model = build_captioner(TINY_MODEL, len(vocab))
    root = str(shapes_json.parent)
    dataset = {"name": "shapes", "root": root, "annotations": str(shapes_json), "image_root": root,
               "reader": {"_target_": "karpathy",
                          "annotations": str(shapes_json), "image_root": root}}
    return save_checkpoint(tmp_path / "good.pt", model, vocab, {"model": copy.deepcopy(TINY_MODEL),
                                                                 "dataset": dataset})


def _edited(src: Path, dst: Path, edit: Callable[[dict[str, Any]], Any]) -> Path:
    ckpt = torch.load(src, weights_only=True)
    edit(ckpt)
    torch.save(ckpt, dst)
    return dst


@pytest.fixture
def bomb(good: Path, tmp_path: Path) -> Path:
    """The good checkpoint with one number of its stored config changed: decoder.hidden_dim = 10^7."""
    return _edited(good, tmp_path / "bomb.pt", lambda c: c["config"]["model"]["decoder"].update(hidden_dim=BOMB))


@pytest.fixture(autouse=True)
def only_meta_builds_before_the_check(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Fail a test at once (before allocating) if a checkpoint's model is built for real before its shapes were
    checked: the guard is the meta build, whose result must have passed `check_weights` first."""
    built: list[str] = []
    build, check = checkpoints._build, checkpoints.check_weights

    def guarded_build(*args: Any) -> Any:
        device = str(torch.get_default_device())
        assert device == "meta" or built[-1:] == ["checked"], "a model was built before its shapes were checked"
        built.append(device)
        return build(*args)

    def recorded_check(*args: Any) -> None:
        check(*args)
        built.append("checked")

    monkeypatch.setattr(checkpoints, "_build", guarded_build)
    monkeypatch.setattr(checkpoints, "check_weights", recorded_check)
    yield built


def _bomb_message(text: str) -> None:
    assert "\n" not in text.strip(), text
    assert "its config describes another model than its weights" in text, text
    assert re.search(rf"is \(\d+, {BOMB}\) in the model and \(\d+, 32\) in the file", text), text  # both shapes


def test_load_model_refuses_the_bomb_naming_the_key_and_both_shapes(bomb):
    with pytest.raises(ValueError) as err:
        checkpoints.load_model(bomb)
    _bomb_message(str(err.value))
    assert "decoder.attention.W_h.weight is" in str(err.value)  # the first parameter whose shape differs


def test_a_good_checkpoint_is_built_once_for_real_after_the_check(good, only_meta_builds_before_the_check):
    model, vocab, _ = checkpoints.load_model(good)
    assert only_meta_builds_before_the_check == ["meta", "checked", "cpu"]
    stored = torch.load(good, weights_only=True)["model"]
    assert all(torch.equal(v, stored[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("edit, words", [
    (lambda c: c["config"]["model"]["encoder"].update(channels=[8, 4096]), ["encoder.", "4096"]),
    (lambda c: c["config"]["model"]["attention"].update(attention_dim=1 << 20), ["attention", f"{1 << 20}"]),
    (lambda c: c["config"]["model"]["decoder"].update(embed_dim=1 << 22), ["decoder.embed.weight", f"{1 << 22}"]),
    (lambda c: c["config"]["model"]["decoder"].update(selector=False),
     ["weights for 'decoder.selector.weight', which its model does not have (2 extra)"]),
    (lambda c: c["model"].pop("decoder.embed.weight"), ["no weights for 'decoder.embed.weight' (1 missing)"]),
    (lambda c: c["model"].update(extra=torch.zeros(2)), ["'extra'", "which its model does not have"]),
    (lambda c: c["model"].update({k: v.double() for k, v in c["model"].items() if k.endswith("embed.weight")}),
     ["stored as torch.float64"]),
])
def test_every_difference_is_refused_in_one_line_naming_it(good, tmp_path, edit, words):
    bad = _edited(good, tmp_path / "bad.pt", edit)
    with pytest.raises(ValueError) as err:
        checkpoints.load_model(bad)
    assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), str(err.value)


def test_a_vocabulary_of_another_size_is_named_as_the_vocabulary(good, tmp_path):
    bad = _edited(good, tmp_path / "bad.pt", lambda c: c["vocab"].extend(["zebra", "giraffe"]))
    n = len(torch.load(good, weights_only=True)["vocab"])
    with pytest.raises(ValueError, match=rf"its vocabulary has {n + 2} words but its weights are for {n} "):
        checkpoints.load_model(bad)


@pytest.mark.parametrize("vocab", [None, "abc", [1, 2, 3], ["<pad>", "<start>", "<end>", "<unk>", 7],
                                   ["a", "b", "c", "d"], ["<pad>", "<start>", "<end>", "<unk>", "x", "x"]])
def test_a_vocabulary_that_is_not_a_word_list_is_refused_in_one_line(good, tmp_path, vocab):
    bad = _edited(good, tmp_path / "bad.pt", lambda c: c.update(vocab=vocab))
    with pytest.raises(ValueError, match="vocabulary") as err:
        checkpoints.load_model(bad)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("weights", [None, [1, 2], {"decoder.embedding.weight": [1.0]}])
def test_weights_that_are_not_a_state_dict_are_refused(good, tmp_path, weights):
    bad = _edited(good, tmp_path / "bad.pt", lambda c: c.update(model=weights))
    with pytest.raises(ValueError, match="not a state_dict of tensors"):
        checkpoints.load_model(bad)


# -- every entry point ----------------------------------------------------------------------------------------------
def _one_error_line(capsys: pytest.CaptureFixture[str], exc: pytest.ExceptionInfo[SystemExit]) -> None:
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and ": error: checkpoint " in err, err
    _bomb_message(err)


def test_captioning_caption(bomb, shapes_json, tmp_path, capsys):
    image = read_karpathy(shapes_json, "test")[0].path
    with pytest.raises(SystemExit) as exc:
        caption.main([str(image), "--checkpoint", str(bomb), "--figures", str(tmp_path / "figs")])
    _one_error_line(capsys, exc)
    assert not (tmp_path / "figs").exists()


def test_captioning_html(bomb, shapes_json, tmp_path, capsys):
    results = [{"image_id": r.image_id, "caption": "a red square"} for r in read_karpathy(shapes_json, "test")]
    (tmp_path / "results.json").write_text(json.dumps(results))
    with pytest.raises(SystemExit) as exc:
        html_report.main(["--results", str(tmp_path / "results.json"), "--annotations", str(shapes_json),
                          "--metrics", "bleu", "--tokenizer", "python", "--checkpoint", str(bomb)])
    _one_error_line(capsys, exc)


def test_captioning_evaluate(bomb, tmp_path):
    cfg = compose_config(f"checkpoint={bomb}", "eval.metrics=[bleu]", "eval.num_figures=0", name="evaluate")
    with pytest.raises(ValueError) as err:
        evaluate(cfg, tmp_path / "eval")
    _bomb_message(str(err.value))
    assert not (tmp_path / "eval").exists()


def test_the_python_api_and_the_demo(bomb, capsys):
    with pytest.raises(ValueError) as err:
        captioning.load(bomb, device="cpu")  # the notebook's loader
    _bomb_message(str(err.value))
    with pytest.raises(SystemExit) as exc:
        demo.main(["--checkpoint", str(bomb), "--port", "0", "--device", "cpu"])
    _one_error_line(capsys, exc)


def test_captioning_export(bomb, tmp_path):
    with pytest.raises(ValueError) as err:
        export_checkpoint(bomb, tmp_path / "export", "onnx")
    _bomb_message(str(err.value))
    assert not (tmp_path / "export").exists()


@pytest.mark.parametrize("key", ["resume", "init_from"])
def test_resume_and_init_from(shapes_json, tmp_path, key):
    run = tmp_path / "run"
    train(compose_tiny_train(shapes_json, "trainer.max_epochs=1", "eval.num_figures=0", "eval.metrics=[bleu]"), run)
    bomb = _edited(run / "checkpoints/last.pt", tmp_path / "bomb.pt",
                   lambda c: c["config"]["model"]["decoder"].update(hidden_dim=BOMB))
    cfg = compose_tiny_train(shapes_json, "trainer.max_epochs=2", f"{key}={bomb}")
    with pytest.raises(ValueError, match="different model config"):
        train(cfg, tmp_path / "second")
    assert not (tmp_path / "second" / "config.yaml").exists()  # refused before the run was built
    # the same config with weights of other shapes: refused naming the key, not a load_state_dict traceback
    reshaped = _edited(run / "checkpoints/last.pt", tmp_path / "reshaped.pt",
                       lambda c: c["model"].update({"decoder.embed.weight": c["model"]["decoder.embed.weight"][:, :8]}))
    with pytest.raises(ValueError) as err:
        train(compose_tiny_train(shapes_json, "trainer.max_epochs=2", f"{key}={reshaped}"), tmp_path / "third")
    assert re.search(r"decoder.embed.weight is \(\d+, 16\) in the model and \(\d+, 8\) in the file", str(err.value))


LOAD = """
import resource, sys, time
from captioning.factory.load import load_model
load_model(sys.argv[2])  # imports and first-use costs paid on a good file
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
try:
    load_model(sys.argv[1])
except ValueError as err:
    print(f"{time.perf_counter() - start:.3f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before} {err}")
"""


def test_the_bomb_costs_no_memory(bomb, good):
    """In a fresh process under a 6 GiB address-space limit (a regression fails, not swaps): refusing the bomb
    raises the peak memory by less than 100 MB over loading a good checkpoint."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    proc = subprocess.run([sys.executable, "-c", LOAD, str(bomb), str(good)], capture_output=True, text=True,
                          timeout=120, preexec_fn=limit)
    assert proc.returncode == 0, proc.stderr
    seconds, grown_kb, message = proc.stdout.split(" ", 2)
    _bomb_message(message)
    assert int(grown_kb) < 100_000, proc.stdout
