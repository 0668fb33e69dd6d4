"""Train a captioner: `captioning-train [overrides]` (Hydra). With no arguments: soft attention on `shapes`.

`train(cfg, out_dir)` is the plain function the Hydra app wraps (the tests and the notebook call it): the config
checked, the run folder locked, the run's parts built (captioning/factory/run.py) and handed to the Trainer.

At module level only Hydra and the light helpers are imported: torch, the models and the trainer load when a run
starts, so `--help` and a misspelt override answer at once (tests/tools/test_cli_startup.py)."""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from captioning.base.files import write_text_atomic
from captioning.base.lock import LOCK_NAME
from captioning.checkpoint import check_checkpoint_file, read_checkpoint, same_model
from captioning.checkpoint.moved import moved_override
from captioning.cli import EXPECTED_ERRORS, exit_status, no_unused_folder, run_cli, stopped
from captioning.config.choices import implied_choices
from captioning.config.help import bare_help
from captioning.config.overrides import check_overrides, searched_folder
from captioning.runtime import CONF_DIR

PROG = "captioning-train"
HYDRA_FILES = (".hydra", LOCK_NAME)  # with *.log: what a launch leaves before the run itself writes anything
logger = logging.getLogger(__name__)


def validate_train_config(cfg: DictConfig) -> None:
    """The config checked by captioning.config, which loads the models to check their groups; a checkpoint to
    start from (resume, init_from) that is not one is refused first, before torch loads."""
    for key in ("resume", "init_from"):
        path = cfg.get(key)
        if isinstance(path, str) and path != "auto" and Path(path).is_file():  # a missing one: the check says so
            check_checkpoint_file(path)
    from captioning.config import validate_train_config as validate

    validate(cfg)


def train(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """Train, then evaluate the best checkpoint on the test split; returns the test metrics. The run holds its
    folder's lock throughout; RunFolderError for a folder in use or holding a run it may not touch."""
    from captioning.factory.models import model_config
    from captioning.factory.registry import with_added_defaults
    from captioning.training import distributed
    from captioning.training.run_folder import claim_run_folder
    from captioning.training.run_state import SAME_MODEL

    validate_train_config(cfg)  # a typo or bad value fails here, naming the key, before any work
    distributed.init_from_env()  # under torchrun: join the process group (a no-op in a plain process)
    folder, resume_from = claim_run_folder(cfg, out_dir)
    with folder or nullcontext():
        # a checkpoint of another model is refused before any data is read (its weights are checked on loading)
        for key, path in (("resume", resume_from), ("init_from", cfg.get("init_from"))):
            if path is not None:
                same_model(read_checkpoint(path, mmap=True), path, model_config(cfg), None, *SAME_MODEL[key],
                           upgrade=with_added_defaults)
        return _train(cfg, out_dir, resume_from)


def _train(cfg: DictConfig, out_dir: Path, resume_from: Path | None) -> dict[str, Any]:
    from captioning.factory.run import build_trainer
    from captioning.runtime import set_seed
    from captioning.training import distributed
    from captioning.training.stop import StopRequest, TrainingDiverged, TrainingInterrupted
    from captioning.training.tensorboard import open_writer

    set_seed(cfg.seed)  # the same initial weights on every rank (a random encoder then matches its feature cache)
    if not distributed.is_main():
        logging.getLogger().setLevel(logging.WARNING)  # rank 0 reports progress, the others only warnings
    trainer = build_trainer(cfg, out_dir)
    if distributed.is_main():  # only rank 0 creates files; from here on the folder holds a run
        write_text_atomic(out_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))  # what this run used, resolved
    if distributed.rank() > 0:  # ranks draw their own dropout masks and samples (rank 0 keeps the plain run's stream)
        set_seed(cfg.seed + distributed.rank())
    if resume_from is not None:
        trainer.resume(resume_from)  # its RNG states replace the seeded ones
    elif cfg.get("init_from"):  # a new run from another run's weights (objective=scst after cross-entropy)
        trainer.init_weights(Path(cfg.init_from))
    elif trainer.objective.fine_tunes:
        logger.warning("this objective fine-tunes a trained model but starts from random weights here; give it a "
                       "cross-entropy run's checkpoint: init_from=<run>/checkpoints/best.pt")
    with open_writer(out_dir) as writer:
        with StopRequest() as trainer.stop:  # Ctrl-C / SIGTERM: a resumable checkpoint, then TrainingInterrupted
            try:
                trainer.fit(writer)
            except (TrainingInterrupted, TrainingDiverged):
                trainer.write_curves()  # what the finished epochs show; history.json is written at each epoch's end
                raise
    metrics = trainer.test()
    logger.info("test metrics: %s", json.dumps(metrics))
    return metrics


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def hydra_main(cfg: DictConfig) -> float:
    """The Hydra app; returns the best validation score so Hydra sweepers (Optuna) can optimise it. A user error
    (bad config, missing file, a run folder in use or holding another run) is one `error:` line, exit status 2, and
    leaves no empty run folder; Ctrl-C saves the run and prints the command that continues it (exit status 130); a
    diverging run (trainer.max_bad_steps non-finite steps in a row) is one `error:` line with that command (status 2;
    in a Hydra multirun a failed job, logged)."""
    from captioning.training.run_folder import RunFolderError
    from captioning.training.stop import TrainingDiverged, TrainingInterrupted

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    log_implied_choices()
    with open_dict(cfg):  # stored in checkpoints: evaluation and the notebook then find the data from any folder
        cfg.data_dir = str(Path(cfg.data_dir).absolute())

    def run() -> dict[str, Any]:
        try:
            return train(cfg, out_dir)
        except TrainingDiverged as err:
            err.command = continue_command(out_dir)
            raise

    try:
        with no_unused_folder(out_dir, HYDRA_FILES):
            metrics = run_cli(run, PROG, (*EXPECTED_ERRORS, RunFolderError, TrainingDiverged))
    except TrainingInterrupted as stop:  # `captioning-train: stopped by Ctrl-C (SIGINT) in epoch ...`
        stopped(PROG, f"{stop}; continue it with: {continue_command(out_dir)}")
    return float(metrics[f"val_{cfg.trainer.monitor}"])


def log_implied_choices() -> None:
    """Say which group choices also chose other groups or set their keys (decoder=transformer selects
    attention=multihead, optim=transformer_adam): in the console and the run's train.log (rank 0 only)."""
    if os.environ.get("RANK", "0") != "0":
        return
    hydra_cfg = HydraConfig.get()
    chosen = {o.split("=", 1)[0].lstrip("+~") for o in hydra_cfg.overrides.task}
    own = [f for entry in hydra_cfg.searchpath if (f := searched_folder(entry)) is not None]  # a user's folders
    for line in implied_choices(hydra_cfg.runtime.choices, [CONF_DIR, *own], chosen):
        logger.info(line)


def continue_command(out_dir: Path) -> str:
    """The command line that continues this run: its overrides, its folder and resume=auto."""
    kept = [o for o in HydraConfig.get().overrides.task
            if o.split("=", 1)[0].lstrip("+~") not in ("resume", "overwrite", "hydra.run.dir")]
    return shlex.join([PROG, *kept, f"hydra.run.dir={out_dir}", "resume=auto"])


def rename_moved(argv: list[str]) -> list[str]:
    """The command line with keys that moved renamed (trainer.attention_weight -> objective.attention_weight, ...),
    one note on stderr for each."""
    out = []
    for arg in argv:
        new = moved_override(arg) if "=" in arg and not arg.startswith("-") else None
        if new is not None:
            print(f"{PROG}: note: {arg.partition('=')[0].lstrip('+~')} is now {new.partition('=')[0].lstrip('+~')} "
                  f"(conf/objective/); running with {new}", file=sys.stderr)
        out.append(new or arg)
    return out


def main() -> None:
    """Console entry point `captioning-train [overrides]`, also under `torchrun --nproc_per_node=N -m
    captioning.train [overrides]` (one process per GPU; global batch = N x dataset.batch_size)."""
    if (text := bare_help(sys.argv[1:], CONF_DIR, "train")) is not None:  # Hydra's text, without composing
        print(text)
        return
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ  # what distributed.env_from_os reads
    if torchrun:  # join the process group first; a plain process imports torch only when its run starts
        from captioning.training import distributed

        distributed.init_from_env()
        sys.argv += distributed.torchrun_overrides(sys.argv[1:], CONF_DIR / "train.yaml")
    sys.argv[1:] = rename_moved(sys.argv[1:])
    # typos, bad values, missing files, a device this machine lacks: one line, before Hydra makes a run folder
    run_cli(lambda: check_overrides(sys.argv[1:], CONF_DIR, "train", validate_train_config), PROG)
    if not torchrun:
        hydra_main()
        return
    status = 0
    try:
        hydra_main()
    except SystemExit as stop:
        status = exit_status(stop)
    finally:
        distributed.cleanup()
    distributed.exit_process(status)  # past torch's teardown at exit, which aborts now and then (see there)


if __name__ == "__main__":
    main()
