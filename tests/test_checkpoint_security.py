"""Checkpoints and feature caches are data, never code: a file naming a callable is refused and nothing runs.

Each payload below is live: handed to Hydra's `instantiate` (as the loader once did) it creates its marker
(`test_payloads_are_live`; Hydra's own blocklist stops `builtins.exec`). Through `load_model` and every console entry point that reads a checkpoint the
same payloads are refused with one line naming the key, and the marker never appears.
"""

from __future__ import annotations

import copy
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from fixtures import TINY_MODEL, compose_config
from hydra.utils import instantiate

from captioning.checkpoint import save_checkpoint
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import Vocabulary
from captioning.evaluate import evaluate
from captioning.factory import registry
from captioning.factory.load import UnsafeCheckpointError, load_model
from captioning.factory.models import build_captioner
from captioning.features.cache import FeatureCache
from captioning.features.extract import extract_features
from captioning.models import captioner
from captioning.runtime import CONF_DIR
from captioning.tools import caption
from captioning.tools import html as html_report

HUBCONF = "import pathlib\n\ndef evil(*args, **kwargs):\n    pathlib.Path({marker!r}).write_text('ran')\n"


def _payload(kind: str, marker: Path) -> dict[str, Any]:
    """A spec that, instantiated, creates `marker` (a folder or a file)."""
    if kind == "os.makedirs":
        return {"_target_": "os.makedirs", "name": str(marker)}
    if kind == "pathlib.Path.write_text":
        return {"_target_": "pathlib.Path.write_text", "_args_": [{"_target_": "pathlib.Path", "_args_": [str(marker)]},
                                                                  "ran"]}
    if kind == "torch.hub.load":
        hub = marker.parent / "hub"
        hub.mkdir(exist_ok=True)
        (hub / "hubconf.py").write_text(HUBCONF.format(marker=str(marker)))
        return {"_target_": "torch.hub.load", "repo_or_dir": str(hub), "model": "evil", "source": "local"}
    if kind == "builtins.exec":
        return {"_target_": "builtins.exec", "_args_": [f"open({str(marker)!r}, 'w').write('ran')"]}
    raise ValueError(kind)


KINDS = ("os.makedirs", "pathlib.Path.write_text", "torch.hub.load", "builtins.exec")
GROUPS = ("encoder", "attention", "decoder")


def _arguments(marker: Path) -> list[tuple[str, Callable[[dict], None], str]]:
    """(name, edit of the stored config, the key the error must name) with a registered class but bad arguments."""
    nested = _payload("os.makedirs", marker)
    return [
        ("nested _target_", lambda c: c["model"]["encoder"].update(channels=nested), "model.encoder.channels._target_"),
        ("nested in a list", lambda c: c["model"]["encoder"].update(channels=[8, nested]),
         "model.encoder.channels[1]._target_"),
        ("_args_", lambda c: c["model"]["decoder"].update(_args_=[nested]), "model.decoder._args_"),
        ("_partial_", lambda c: c["model"]["attention"].update(_partial_=True), "model.attention._partial_"),
        ("interpolation", lambda c: c["model"]["decoder"].update(hidden_dim="${oc.env:HOME}"), "model.decoder.hidden_dim"),
        ("unknown kwarg", lambda c: c["model"]["encoder"].update(evil=1), "model.encoder.evil"),
        ("str for int", lambda c: c["model"]["decoder"].update(hidden_dim="32"), "model.decoder.hidden_dim"),
        ("float for int", lambda c: c["model"]["decoder"].update(embed_dim=16.5), "model.decoder.embed_dim"),
        ("bool for int", lambda c: c["model"]["encoder"].update(num_pools=True), "model.encoder.num_pools"),
        ("str for bool", lambda c: c["model"]["decoder"].update(selector="yes"), "model.decoder.selector"),
        ("int for list", lambda c: c["model"]["encoder"].update(channels=8), "model.encoder.channels"),
        ("builder argument", lambda c: c["model"]["attention"].update(hidden_dim=4), "model.attention.hidden_dim"),
        ("missing group", lambda c: c["model"].pop("decoder"), "model.decoder"),
        ("extra group", lambda c: c["model"].update(evil=nested), "model.evil"),
        ("dataset.generate", lambda c: c["dataset"].update(generate=nested), "dataset.generate._target_"),
        ("dataset.reader", lambda c: c["dataset"].update(reader=nested), "dataset.reader._target_"),
        ("reader argument", lambda c: c["dataset"]["reader"].update(annotations=nested),
         "dataset.reader.annotations._target_"),
        ("reader splits", lambda c: c["dataset"]["reader"].update(splits=["train"]), "dataset.reader.splits"),
        ("nested in dataset", lambda c: c["dataset"].update(coco={"split_file": nested}), "dataset.coco.split_file._target_"),
        ("dataset interpolation", lambda c: c["dataset"].update(annotations="${oc.env:HOME}"), "dataset.annotations"),
    ]


@pytest.fixture
def good_checkpoint(shapes_json: Path, tmp_path: Path) -> Path:
    """A real checkpoint of a tiny model, with the dataset section training writes for `shapes`."""
    torch.manual_seed(0)
    vocab = Vocabulary.build(c for r in read_karpathy(shapes_json, "train") for c in r.captions)
    model = build_captioner(TINY_MODEL, len(vocab))
    root = str(Path(shapes_json).parent)
    dataset = {"name": "shapes", "root": root, "annotations": str(shapes_json),
               "reader": {"_target_": "karpathy", "annotations": str(shapes_json),
                          "image_root": root},
               "image_root": root, "min_word_freq": 1, "max_vocab": 10000, "max_caption_len": 20, "batch_size": 8,
               "captions_per_image": 2, "num_workers": 0, "features": None,
               "generate": {"_target_": "shapes", "root": root, "seed": 1,
                            "num_train": 48, "num_val": 12, "num_test": 12, "image_size": 32}}
    return save_checkpoint(tmp_path / "good.pt", model, vocab, {"model": copy.deepcopy(TINY_MODEL), "dataset": dataset})


def _edited(src: Path, dst: Path, edit: Callable[[dict], Any]) -> Path:
    """A copy of checkpoint `src` whose stored config was changed by `edit`."""
    ckpt = torch.load(src, weights_only=True)
    edit(ckpt["config"])
    torch.save(ckpt, dst)
    return dst


def _replace(group: str, spec: dict) -> Callable[[dict], None]:
    return lambda c: c["model"].__setitem__(group, spec)


def _refused(err: BaseException, key: str) -> None:
    message = str(err)
    assert isinstance(err, UnsafeCheckpointError) and isinstance(err, ValueError)
    assert "\n" not in message and key in message and "refusing to load it" in message, message


# -- the payloads are real ------------------------------------------------------------------------------------------
# builtins.exec is left out: Hydra 1.3.8's own blocklist refuses it (a best-effort list; os.makedirs and
# torch.hub.load pass it), so it shows nothing here. The registry refuses it like any name not in it.
@pytest.mark.parametrize("kind", KINDS[:3])
def test_payloads_are_live(kind, tmp_path):
    marker = tmp_path / "marker"
    try:
        instantiate(_payload(kind, marker))  # what `build_captioner` did with a checkpoint's config before
    except Exception:  # noqa: BLE001 - some fail after they ran; that they ran is the point
        pass
    assert marker.exists()


# -- load_model ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("kind", KINDS)
def test_load_model_refuses_a_foreign_target_and_runs_nothing(good_checkpoint, tmp_path, kind, group):
    marker = tmp_path / "marker"
    bad = _edited(good_checkpoint, tmp_path / "bad.pt", _replace(group, _payload(kind, marker)))
    with pytest.raises(UnsafeCheckpointError) as err:
        load_model(bad)
    _refused(err.value, f"model.{group}._target_ '{kind}' is not one of this project's")
    assert not marker.exists()


def test_the_error_lists_the_project_classes(good_checkpoint, tmp_path):
    bad = _edited(good_checkpoint, tmp_path / "bad.pt", _replace("encoder", _payload("os.makedirs", tmp_path / "m")))
    with pytest.raises(UnsafeCheckpointError, match=r"checkpoint .*bad\.pt: model\.encoder\._target_ 'os\.makedirs' is "
                       r"not one of this project's encoders \(small_cnn, vgg, resnet, torchvision, multi, regions\); "
                       r"refusing to load it"):
        load_model(bad)


@pytest.mark.parametrize("name", [name for name, _, _ in _arguments(Path("marker"))])
def test_load_model_refuses_bad_arguments_and_runs_nothing(good_checkpoint, tmp_path, name):
    marker = tmp_path / "marker"
    edit, key = next((e, k) for n, e, k in _arguments(marker) if n == name)
    bad = _edited(good_checkpoint, tmp_path / "bad.pt", edit)
    with pytest.raises(UnsafeCheckpointError) as err:
        load_model(bad)
    _refused(err.value, key)
    assert not marker.exists(), name


def test_a_legitimate_checkpoint_round_trips_with_identical_outputs(good_checkpoint, shapes_json):
    torch.manual_seed(0)
    vocab = Vocabulary.build(c for r in read_karpathy(shapes_json, "train") for c in r.captions)
    original = build_captioner(TINY_MODEL, len(vocab)).eval()  # the fixture's seed and config: the same weights
    loaded, vocab2, ckpt = load_model(good_checkpoint)
    assert vocab2 == vocab and not loaded.training
    assert all(torch.equal(a, b) for a, b in zip(original.state_dict().values(), loaded.state_dict().values()))
    images, captions = torch.randn(2, 3, 32, 32), torch.randint(4, len(vocab), (2, 6))
    with torch.no_grad():
        want, got = original(images, captions), loaded(images, captions)
    assert torch.equal(want.logits, got.logits) and torch.equal(want.alphas, got.alphas)


@pytest.mark.parametrize("dataset", sorted(p.stem for p in (Path(CONF_DIR) / "dataset").glob("[!_]*.yaml")))
@pytest.mark.parametrize("decoder", sorted(p.stem for p in (Path(CONF_DIR) / "decoder").glob("*.yaml")))
def test_every_config_the_project_ships_makes_a_loadable_checkpoint_config(dataset, decoder):
    """What a checkpoint of each data set and decoder stores passes the check (else its runs could not be loaded)."""
    from captioning.factory.load import check_config
    from captioning.factory.run import stored_config

    own = ["dataset.annotations=/d/captions.csv", "dataset.image_root=/d/images"] if dataset == "table" else []
    cfg = compose_config(f"dataset={dataset}", f"decoder={decoder}", *own)  # dataset=table: the user's files
    stored = stored_config(cfg)  # what a training run stores in its checkpoints
    assert check_config({"config": stored}, "x.pt") is stored


def test_no_module_on_the_load_path_can_import_a_name_from_a_file():
    for module in (captioner, registry, *(sys.modules[f"captioning.{name}"] for name in
                                         ("checkpoint.file", "checkpoint.moved", "factory.models", "factory.load"))):
        source = inspect.getsource(module)
        assert not re.search(r"\binstantiate\b|importlib|_locate|get_method|get_class|__import__", source), module


# -- console entry points ---------------------------------------------------------------------------------------
CASES = [("encoder", "os.makedirs"), ("attention", "torch.hub.load"), ("decoder", "builtins.exec"),
         ("encoder", "pathlib.Path.write_text")]


def _image(shapes_json: Path) -> Path:
    return read_karpathy(shapes_json, "test")[0].path


@pytest.mark.parametrize("group, kind", CASES)
def test_captioning_caption_refuses_in_one_line(good_checkpoint, shapes_json, tmp_path, capsys, group, kind):
    marker = tmp_path / "marker"
    bad = _edited(good_checkpoint, tmp_path / "bad.pt", _replace(group, _payload(kind, marker)))
    with pytest.raises(SystemExit) as exc:
        caption.main([str(_image(shapes_json)), "--checkpoint", str(bad), "--figures", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code != 0 and len(err.splitlines()) == 1 and f"model.{group}._target_ '{kind}'" in err, err
    assert not marker.exists()


@pytest.mark.parametrize("group, kind", CASES)
def test_captioning_html_refuses_in_one_line(good_checkpoint, shapes_json, tmp_path, capsys, group, kind):
    marker = tmp_path / "marker"
    bad = _edited(good_checkpoint, tmp_path / "bad.pt", _replace(group, _payload(kind, marker)))
    results = [{"image_id": r.image_id, "caption": "a red square"} for r in read_karpathy(shapes_json, "test")]
    (tmp_path / "results.json").write_text(json.dumps(results))
    with pytest.raises(SystemExit) as exc:
        html_report.main(["--results", str(tmp_path / "results.json"), "--annotations", str(shapes_json),
                          "--metrics", "bleu", "--tokenizer", "python", "--checkpoint", str(bad)])
    err = capsys.readouterr().err.strip()
    assert exc.value.code != 0 and len(err.splitlines()) == 1 and f"model.{group}._target_ '{kind}'" in err, err
    assert not marker.exists()


@pytest.mark.parametrize("case", [*CASES, "dataset.generate", "dataset.reader"])
def test_captioning_evaluate_refuses(good_checkpoint, tmp_path, case):
    marker = tmp_path / "marker"
    if case in ("dataset.generate", "dataset.reader"):  # evaluation without dataset=... reads the checkpoint's data set
        key = f"{case}._target_"
        edit = lambda c: c["dataset"].update({case.split(".")[1]: _payload("os.makedirs", marker)})
    else:
        key, edit = f"model.{case[0]}._target_", _replace(case[0], _payload(case[1], marker))
    bad = _edited(good_checkpoint, tmp_path / "bad.pt", edit)
    cfg = compose_config(f"checkpoint={bad}", "eval.metrics=[bleu]", "eval.num_figures=0", name="evaluate")
    with pytest.raises(UnsafeCheckpointError) as err:
        evaluate(cfg, tmp_path / "eval")
    _refused(err.value, key)
    assert not marker.exists() and not (tmp_path / "eval").exists()


def _script(name: str, module: str) -> list[str]:
    """The .venv's console script, or `python -m` where it is not installed."""
    script = Path(sys.executable).parent / name
    return [str(script)] if script.is_file() else [sys.executable, "-m", module]


@pytest.mark.integration
@pytest.mark.parametrize("name, module", [("captioning-evaluate", "captioning.evaluate"),
                                          ("captioning-caption", "captioning.tools.caption")])
def test_console_scripts_exit_nonzero_and_run_nothing(good_checkpoint, shapes_json, tmp_path, name, module):
    marker = tmp_path / "marker"
    bad = _edited(good_checkpoint, tmp_path / "bad.pt", _replace("decoder", _payload("torch.hub.load", marker)))
    args = ([f"checkpoint={bad}", f"hydra.run.dir={tmp_path / 'eval'}"] if name == "captioning-evaluate"
            else [str(_image(shapes_json)), "--checkpoint", str(bad), "--figures", str(tmp_path / "out")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run([*_script(name, module), *args], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    lines = [line for line in proc.stderr.splitlines() if "refusing to load it" in line]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert "model.decoder._target_ 'torch.hub.load' is not one of this project's decoders" in lines[0]
    assert not marker.exists()


# -- feature caches -----------------------------------------------------------------------------------------------
def test_a_feature_cache_naming_a_foreign_target_is_refused_and_runs_nothing(shapes_json, tmp_path):
    torch.manual_seed(0)
    encoder = build_captioner(TINY_MODEL, vocab_size=5).encoder.eval().requires_grad_(False)
    records = read_karpathy(shapes_json, "test")[:4]
    extract_features(records, encoder, TINY_MODEL["encoder"], tmp_path / "cache", batch_size=4, progress=False)
    meta_path = tmp_path / "cache" / "meta.json"
    meta = json.loads(meta_path.read_text())
    marker = tmp_path / "marker"
    meta["fingerprint"]["encoder"] = _payload("os.makedirs", marker)
    meta["fingerprint"]["encoder"]["nested"] = _payload("builtins.exec", marker)
    meta_path.write_text(json.dumps(meta))
    # Opened alone, the metadata is only read (nothing is built from it).
    assert len(FeatureCache.open(tmp_path / "cache")) == 4 and not marker.exists()
    # Opened for a model, it is compared with that model's encoder and refused, naming the key.
    with pytest.raises(ValueError, match=r"encoder\._target_: cache 'os\.makedirs'"):
        FeatureCache.open(tmp_path / "cache", encoder, TINY_MODEL["encoder"])
    assert not marker.exists()
