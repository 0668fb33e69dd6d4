"""`train(cfg, out_dir)`: one training run in its locked run folder, from a fresh start or a checkpoint."""

from __future__ import annotations

import json
import logging
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from torch.utils.tensorboard import SummaryWriter

from captioning.config import validate_train_config
from captioning.runtime import set_seed
from captioning.training import distributed
from captioning.training.run_folder import RunFolder, RunFolderError
from captioning.training.stop import StopRequest, TrainingInterrupted
from captioning.training.trainer import Trainer

logger = logging.getLogger(__name__)


def claim_run_folder(cfg: DictConfig, out_dir: Path) -> tuple[RunFolder | None, Path | None]:
    """Rank 0 locks the run folder and applies its policy (captioning.training.run_folder); every rank gets the
    checkpoint to resume from (None: a new run), or the same RunFolderError. Returns rank 0's locked folder (else
    None)."""
    if not distributed.is_main():
        outcome = distributed.broadcast_object(None)
        if isinstance(outcome, RunFolderError):
            raise RunFolderError(str(outcome))
        return None, outcome
    folder = RunFolder(out_dir)
    try:
        resume_from = folder.claim(cfg.resume, bool(cfg.get("overwrite", False)))
    except RunFolderError as err:
        distributed.broadcast_object(err)
        raise
    return folder, distributed.broadcast_object(resume_from)


def train(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """Train, then evaluate the best checkpoint on the test split; returns the test metrics. The run holds its
    folder's lock throughout; RunFolderError for a folder in use or holding a run it may not touch."""
    validate_train_config(cfg)  # a typo or bad value fails here, naming the key, before any work
    distributed.init_from_env()  # under torchrun: join the process group (a no-op in a plain process)
    folder, resume_from = claim_run_folder(cfg, out_dir)
    with folder or nullcontext():
        return _train(cfg, out_dir, resume_from)


def _train(cfg: DictConfig, out_dir: Path, resume_from: Path | None) -> dict[str, Any]:
    set_seed(cfg.seed)  # the same initial weights on every rank (a random encoder then matches its feature cache)
    if not distributed.is_main():
        logging.getLogger().setLevel(logging.WARNING)  # rank 0 reports progress, the others only warnings
    trainer = Trainer(cfg, out_dir)
    if distributed.is_main():  # only rank 0 creates files; from here on the folder holds a run
        (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))  # what this run used, resolved
    if distributed.rank() > 0:  # ranks draw their own dropout masks and samples (rank 0 keeps the plain run's stream)
        set_seed(cfg.seed + distributed.rank())
    if resume_from is not None:
        trainer.resume(resume_from)  # its RNG states replace the seeded ones
    elif cfg.get("init_from"):  # a new run from another run's weights (objective=scst after cross-entropy)
        trainer.init_weights(Path(cfg.init_from))
    elif trainer.objective.fine_tunes:
        logger.warning("this objective fine-tunes a trained model but starts from random weights here; give it a "
                       "cross-entropy run's checkpoint: init_from=<run>/checkpoints/best.pt")
    with SummaryWriter(str(out_dir / "tensorboard")) if distributed.is_main() else distributed.NullWriter() as writer:
        with StopRequest() as trainer.stop:  # Ctrl-C / SIGTERM: a resumable checkpoint, then TrainingInterrupted
            try:
                trainer.fit(writer)
            except TrainingInterrupted:
                trainer.write_curves()  # what the finished epochs show; history.json is written at each epoch's end
                raise
    metrics = trainer.test()
    logger.info("test metrics: %s", json.dumps(metrics))
    return metrics
