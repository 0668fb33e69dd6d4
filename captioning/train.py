"""Train a captioner: `captioning-train [overrides]` (Hydra). With no arguments: soft attention on `shapes`."""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from captioning.cli import EXIT_INTERRUPTED, EXPECTED_ERRORS, fail, run_cli
from captioning.config.overrides import check_overrides
from captioning.runtime import CONF_DIR
from captioning.training import distributed
from captioning.training.run import train
from captioning.training.run_folder import LOCK_NAME, RunFolderError
from captioning.training.stop import TrainingInterrupted

PROG = "captioning-train"
HYDRA_FILES = (".hydra", LOCK_NAME)  # with *.log: what a launch leaves before the run itself writes anything


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def hydra_main(cfg: DictConfig) -> float:
    """The Hydra app; returns the best validation score so Hydra sweepers (Optuna) can optimise it. A user error
    (bad config, missing file, a run folder in use or holding another run) is one `error:` line, exit status 2, and
    leaves no empty run folder; Ctrl-C saves the run and prints the command that continues it (exit status 130)."""
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    with open_dict(cfg):  # stored in checkpoints: evaluation and the notebook then find the data from any folder
        cfg.data_dir = str(Path(cfg.data_dir).absolute())
    try:
        metrics = run_cli(lambda: train(cfg, out_dir), PROG, (*EXPECTED_ERRORS, RunFolderError))
    except TrainingInterrupted as stop:
        fail(PROG, f"{stop}; continue it with: {continue_command(out_dir)}", EXIT_INTERRUPTED)
    except SystemExit:
        remove_if_unused(out_dir)
        raise
    return float(metrics[f"val_{cfg.trainer.monitor}"])


def continue_command(out_dir: Path) -> str:
    """The command line that continues this run: its overrides, its folder and resume=auto."""
    kept = [o for o in HydraConfig.get().overrides.task
            if o.split("=", 1)[0].lstrip("+~") not in ("resume", "overwrite", "hydra.run.dir")]
    return shlex.join([PROG, *kept, f"hydra.run.dir={out_dir}", "resume=auto"])


def remove_if_unused(out_dir: Path) -> None:
    """Delete a run folder that holds nothing but what Hydra and the lock put there (a launch that failed early)."""
    if not out_dir.is_dir() or any(p.name not in HYDRA_FILES and p.suffix != ".log" for p in out_dir.iterdir()):
        return
    shutil.rmtree(out_dir, ignore_errors=True)
    day = out_dir.parent  # the default layout's outputs/<date>/, when this was the day's only run
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", day.name) and day.is_dir() and not any(day.iterdir()):
        day.rmdir()


def main() -> None:
    """Console entry point `captioning-train [overrides]`, also under `torchrun --nproc_per_node=N -m
    captioning.train [overrides]` (one process per GPU; global batch = N x dataset.batch_size)."""
    if distributed.init_from_env() is not None:
        sys.argv += distributed.torchrun_overrides(sys.argv[1:], CONF_DIR / "train.yaml")
    run_cli(lambda: check_overrides(sys.argv[1:], CONF_DIR, "train"), PROG)  # typos: one line, before Hydra starts
    try:
        hydra_main()
    finally:
        distributed.cleanup()


if __name__ == "__main__":
    main()
