"""Sweeps: a parallel joblib sweep gives one folder per run and one report; the SLURM and Optuna presets compose
into valid configs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fixtures import tiny_overrides
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep
from omegaconf import OmegaConf

from captioning.config.schema import validate_train_config
from captioning.reporting.sweep import collect_runs
from captioning.runtime import CONF_DIR
from captioning.tools.report import main as report_main

CONF = str(CONF_DIR)


def _tiny(root):
    """Overrides of the tiny run (debug=tiny) on a data set generated under `root`: a run takes seconds."""
    return tiny_overrides(root, "eval.num_figures=0", "trainer.max_epochs=1")


def _multirun(tmp_path, *args):
    """`captioning-train -m ARGS` in a fresh process (as from the shell); its sweep folder is tmp_path/sweep."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    proc = subprocess.run([sys.executable, "-m", "captioning.train", "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                           *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return tmp_path / "sweep"


def _compose_hydra(*overrides):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


@pytest.mark.integration
def test_joblib_sweep_of_two_values_and_its_report(tmp_path, capsys):
    # Beam size only changes test decoding, so both runs train the same seeded model: a check of repeatability
    # across two parallel worker processes. The data folder is new: both jobs ask for the data set at once, one
    # generates it and the other waits (or finds it made), as on a fresh machine.
    data = tmp_path / "data"
    sweep = _multirun(tmp_path, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "eval.beam_size=1,2",
                      *_tiny(data))
    runs = collect_runs(sweep)
    assert [r.path.name for r in runs] == ["0", "1"] and all(r.finished for r in runs)
    logs = [(r.path / "train.log").read_text() for r in runs]
    assert sum("generated 72 shapes images" in log for log in logs) == 1, logs
    assert [r.overrides["eval.beam_size"] for r in runs] == ["1", "2"]
    assert [r.metrics["beam_size"] for r in runs] == [1, 2]
    for run in runs:  # the resolved config of each run, beside its results
        text = (run.path / "config.yaml").read_text()
        cfg = OmegaConf.create(text)
        assert "${" not in text and cfg.eval.beam_size == run.metrics["beam_size"]
        assert cfg.dataset.root == str(data) and cfg.seed == 0
    histories = [json.loads((r.path / "history.json").read_text()) for r in runs]
    for key in ("loss", "token_nll", "val_CIDEr", "val_Bleu_4"):
        assert histories[0][0][key] == histories[1][0][key], key
    assert runs[0].metrics["val_CIDEr"] == runs[1].metrics["val_CIDEr"]

    report_main([str(sweep), "--metrics", "CIDEr,val_CIDEr", "--out", str(tmp_path / "report.md")])
    out = capsys.readouterr().out
    table = (tmp_path / "report.md").read_text().splitlines()
    assert table[0] == "| eval.beam_size | CIDEr | val_CIDEr | run |"  # overrides that vary; the others below it
    assert "same in every run: dataset.root=" in out and " debug=tiny " in out and " trainer.max_epochs=1" in out
    assert [row.split(" | ")[0] for row in table[2:]] == ["| 1", "| 2"]  # one row per run, both finished
    assert "failed/unfinished" not in out and (tmp_path / "report.csv").is_file()
    assert (tmp_path / "report.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.integration
def test_a_joblib_sweep_on_a_fresh_data_folder_passes_ten_times_in_a_row(tmp_path):
    """The CI case of a parallel sweep's first jobs generating the data set at once, repeated (about 3 min)."""
    for attempt in range(10):
        data, folder = tmp_path / f"data{attempt}", tmp_path / f"try{attempt}"
        folder.mkdir()
        runs = collect_runs(_multirun(folder, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                                      "eval.beam_size=1,2", *_tiny(data)))
        assert [r.finished for r in runs] == [True, True], attempt
        logs = [(r.path / "train.log").read_text() for r in runs]
        assert sum("generated 72 shapes images" in log for log in logs) == 1, (attempt, logs)


def test_joblib_launcher_preset():
    launcher = _compose_hydra("hydra/launcher=joblib", "hydra.launcher.n_jobs=2").hydra.launcher
    assert launcher._target_.endswith("JoblibLauncher") and launcher.n_jobs == 2


def test_slurm_launcher_preset():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e .[cluster]")
    launcher = _compose_hydra("hydra/launcher=slurm", "hydra.launcher.partition=gpu").hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.partition, launcher.gpus_per_node, launcher.tasks_per_node, launcher.timeout_min,
            launcher.cpus_per_task, launcher.mem_gb) == ("gpu", 1, 1, 240, 8, 32)
    assert OmegaConf.to_container(launcher, resolve=False)["submitit_folder"] == "${hydra.sweep.dir}/.submitit/%j"


def _search_space(sweeper):
    parser = OverridesParser.create()
    return {k: parser.parse_override(f"{k}={v}").value() for k, v in sweeper.params.items()}


def test_optuna_preset_maximises_over_a_valid_search_space():
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e .[cluster]")
    sweeper = _compose_hydra("hydra/sweeper=optuna_cider").hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and sweeper.direction == "maximize"
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler" and sweeper.sampler.seed == 0
    space = _search_space(sweeper)
    assert {"optim.lr", "decoder.dropout", "attention.attention_dim"} <= set(space)
    assert space["optim.lr"].tags == {"log"}
    # Every corner of the search space is a config the schema accepts (no trial is wasted on a bad value).
    for key, sweep in space.items():
        values = list(sweep.list) if isinstance(sweep, ChoiceSweep) else [sweep.start, sweep.end]
        assert isinstance(sweep, (ChoiceSweep, IntervalSweep)) and values, key
        for value in values:
            validate_train_config(_compose_hydra(f"{key}={value}"))


def test_sweep_presets_are_documented():
    for preset in ("launcher/slurm.yaml", "sweeper/optuna_cider.yaml"):
        text = (Path(CONF) / "hydra" / preset).read_text()
        assert text.startswith("#") and "captioning-train -m hydra/" in text
        settings = yaml.safe_load(text)
        assert settings and "defaults" in settings


@pytest.mark.integration
@pytest.mark.slow
def test_optuna_sweep_returns_the_best_validation_cider(shapes_json, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e .[cluster]")
    # Fixed values on the command line take their keys out of the preset's search space.
    sweep = _multirun(tmp_path, "hydra/sweeper=optuna_cider", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1",
                      *_tiny(Path(shapes_json).parent))
    runs = collect_runs(sweep)
    assert len(runs) == 2 and all(r.finished for r in runs)
    assert {"optim.lr", "decoder.dropout", "objective.attention_weight"} <= set(runs[0].overrides)
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(max(r.metrics["val_CIDEr"] for r in runs))


@pytest.mark.integration
@pytest.mark.slow
def test_submitit_launcher_runs_a_sweep(shapes_json, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e .[cluster]")
    # The SLURM preset's launcher code with submitit's local executor: jobs are pickled, run in their own
    # processes and write their folders as on a cluster.
    sweep = _multirun(tmp_path, "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10", "eval.beam_size=1,2",
                      *_tiny(Path(shapes_json).parent))
    runs = collect_runs(sweep)
    assert [r.metrics.get("beam_size") for r in runs] == [1, 2]
    assert (sweep / ".submitit").is_dir()
