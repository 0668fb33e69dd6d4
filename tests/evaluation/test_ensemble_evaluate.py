"""captioning-evaluate with checkpoint=[A,B]: a test-time ensemble decoded and scored end to end (the captions of
the library's ensemble, the maps of ensemble.maps_from, the checkpoints named in metrics.json, a folder of its own),
a list of one checkpoint evaluated as that checkpoint, and each mistake one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fixtures import compose_config
from omegaconf import OmegaConf
from shapes_checkpoints import LUONG_MODEL, shapes_checkpoint, shapes_vocabulary

from captioning.config.check import ConfigError
from captioning.config.schema import validate_evaluate_config
from captioning.data.dataset import CaptionDataset
from captioning.data.readers.karpathy import read_karpathy
from captioning.evaluate import eval_dir, evaluate, from_images
from captioning.evaluation.split import decode_split
from captioning.factory.load import load_ensemble
from captioning.models.ensemble import Ensemble

FAST = ("device=cpu", "eval.metrics=[bleu]", "eval.max_len=6", "eval.num_figures=0")


@pytest.fixture(scope="module")
def checkpoints(shapes_json: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two untrained models of one vocabulary: SAT on an 8 x 8 grid, and Luong's decoder on a 4 x 4 grid."""
    folder = tmp_path_factory.mktemp("ensemble")
    return (shapes_checkpoint(folder / "sat.pt", shapes_json),
            shapes_checkpoint(folder / "luong.pt", shapes_json, LUONG_MODEL, seed=1))


def _config(checkpoint: str, *overrides: str):
    return compose_config(f"checkpoint={checkpoint}", *FAST, *overrides, name="evaluate")


def test_evaluate_scores_the_ensembles_captions_with_the_chosen_models_maps(checkpoints, shapes_json, tmp_path):
    a, b = checkpoints
    out = tmp_path / "eval"
    metrics = evaluate(_config(f"[{a},{b}]", "ensemble.maps_from=1", "ensemble.mean=logprob"), out)
    assert metrics["checkpoints"] == [str(a), str(b)] and metrics["num_images"] == 12
    assert (metrics["ensemble_mean"], metrics["ensemble_maps_from"]) == ("logprob", 1)
    stored = json.loads((out / "metrics.json").read_text())
    assert stored["checkpoints"] == [str(a), str(b)] and stored["Bleu_4"] == pytest.approx(metrics["Bleu_4"])
    # the captions are the library's ensemble's, decoded on the split's images
    model, vocab, _ = load_ensemble([a, b], mean="logprob", maps_from=1)
    assert isinstance(model, Ensemble)
    test = CaptionDataset(read_karpathy(shapes_json, "test"), vocab, model.encoder.transform())
    preds = decode_split(model, test, beam_size=3, max_len=6, progress=False)
    results = {r["image_id"]: r["caption"] for r in json.loads((out / "results.json").read_text())}
    assert results == {p.image_id: p.caption for p in preds}
    with np.load(out / "attention.npz") as maps:  # the second model's 4 x 4 grid
        assert {maps[k].shape[1:] for k in maps.files if k.startswith("alphas_")} == {(4, 4)}


def test_a_list_of_one_checkpoint_is_that_checkpoint(checkpoints, tmp_path):
    a, _ = checkpoints
    evaluate(_config(str(a)), tmp_path / "alone")
    assert "checkpoints" not in evaluate(_config(f"[{a}]"), tmp_path / "listed")
    for name in ("metrics.json", "results.json"):  # metrics.json: NaN scores stored as null, comparable
        assert (tmp_path / "alone" / name).read_text() == (tmp_path / "listed" / name).read_text()


def test_an_ensemble_writes_next_to_the_first_checkpoint_in_a_folder_of_its_own(checkpoints):
    a, b = checkpoints
    single = eval_dir(str(a), "test", 3)
    assert single == str(a.parent / "eval" / "test-beam3-sat")
    both = eval_dir([str(a), str(b)], "test", 3, "prob")
    assert Path(both).parent == a.parent / "eval" and Path(both).name.startswith("test-beam3-ensemble2-prob-")
    assert eval_dir([str(b), str(a)], "test", 3, "prob") != both  # another ensemble (another maps' model): apart
    cfg = compose_config(f"checkpoint=[{a},{b}]", name="evaluate")  # what conf/evaluate.yaml's hydra.run.dir gives
    assert eval_dir(OmegaConf.to_container(cfg.checkpoint), "test", 3, "prob") == both  # type: ignore[arg-type]


@pytest.mark.parametrize("overrides, named", [
    (("checkpoint=[]",), "checkpoint=[]: an ensemble needs at least one checkpoint"),
    (("checkpoint=[{a},missing.pt]",), "checkpoint[1]='missing.pt': checkpoint not found"),
    (("checkpoint=[{a},{b}]", "ensemble.maps_from=2"), "ensemble.maps_from=2: names no model of the 2 checkpoints"),
    (("checkpoint=[{a},{b}]", "ensemble.mean=median"), "ensemble.mean='median'"),
])
def test_a_bad_ensemble_config_names_its_key(checkpoints, overrides, named):
    a, b = checkpoints
    cfg = compose_config(*(o.format(a=a, b=b) for o in overrides), name="evaluate")
    with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
        validate_evaluate_config(cfg)


def test_checkpoints_of_other_vocabularies_are_refused_in_one_line(checkpoints, shapes_json, tmp_path):
    a, _ = checkpoints
    smaller = shapes_checkpoint(tmp_path / "small.pt", shapes_json, vocab=shapes_vocabulary(shapes_json, max_size=5))
    with pytest.raises(ValueError, match="another vocabulary") as err:
        evaluate(_config(f"[{a},{smaller}]"), tmp_path / "eval")
    assert "\n" not in str(err.value) and "must share one vocabulary" in str(err.value)
    assert not (tmp_path / "eval" / "metrics.json").exists()


def test_an_ensemble_reads_images_instead_of_a_feature_cache(tmp_path):
    section = OmegaConf.create({"name": "shapes", "image_root": str(tmp_path), "features": str(tmp_path / "cache")})
    assert from_images(section).features is None and from_images(section).image_root == str(tmp_path)
    plain = OmegaConf.create({"image_root": str(tmp_path), "features": None})
    assert from_images(plain) is plain
    with pytest.raises(ValueError, match="an ensemble decodes from the images") as err:
        from_images(OmegaConf.create({"image_root": None, "features": str(tmp_path)}))
    assert "\n" not in str(err.value)


@pytest.mark.integration
def test_the_console_command_takes_a_hydra_list(checkpoints):
    a, b = checkpoints
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {"OMP_NUM_THREADS": "1"}
    run = subprocess.run([str(Path(sys.executable).parent / "captioning-evaluate"), f"checkpoint=[{a},{b}]", *FAST,
                          "eval.report=false"], capture_output=True, text=True, cwd=a.parent, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    folder = Path(eval_dir([str(a), str(b)], "test", 3, "prob"))
    assert json.loads((folder / "metrics.json").read_text())["checkpoints"] == [str(a), str(b)]
