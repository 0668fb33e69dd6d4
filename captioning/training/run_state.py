"""A training run's state, and how it is checkpointed and resumed: `RunState` holds the run's parts (model,
optimizer, schedule, objective) and everything besides the weights that decides the rest of the run (counters,
early stopping, the epoch's position, the REINFORCE baseline, the loss scaler, every rank's RNG states), so
that a checkpoint taken at any step resumes exactly (see captioning/training/randomness.py). The loop that
advances it is trainer.py's `Trainer`."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

from captioning.base.jsonio import write_json_atomic
from captioning.checkpoint import load_same_model, save_checkpoint
from captioning.models.captioner import Captioner
from captioning.reporting.curves import CURVES_NAME, plot_history
from captioning.training import distributed, precision, randomness, schedule
from captioning.training.losses import GlobalMeanBaseline, MovingAverageBaseline
from captioning.training.parts import RunParts
from captioning.training.stop import BadSteps

logger = logging.getLogger(__name__)
# what resume= and init_from= say of a checkpoint of another model: the action, what to do instead
SAME_MODEL = {"resume": ("resume from", "start a new run or use the same overrides"),
              "init_from": ("init_from", "give this run the checkpoint's encoder, attention, decoder and "
                            "dataset settings")}


class RunState:
    """A run's parts and its state besides the weights: what a checkpoint holds, written and read back
    here."""

    def __init__(self, parts: RunParts, out_dir: Path):
        self.parts = parts
        self.out_dir = out_dir
        self.tc = parts.trainer  # the trainer.* settings
        self.ev = parts.eval  # the eval.* settings
        self.model: Captioner = parts.model
        self.vocab = parts.vocab
        self.data = parts.data
        self.objective = parts.objective
        self.optimizer = parts.optimizer
        self.scheduler = parts.scheduler
        self.instances = parts.instances
        self.device = parts.device
        self.amp_dtype = parts.amp_dtype
        self.is_main = distributed.is_main()  # rank 0 (or the only process) writes every file
        self.epoch, self.step, self.best, self.bad_epochs = 0, 0, float("-inf"), 0
        self.history: list[dict[str, Any]] = []
        self.train_seconds, self.epoch_started = 0.0, time.monotonic()
        # Mid-epoch: where the epoch in progress stands (batches done, running sums), so a checkpoint taken
        # there resumes at the next batch; None between epochs.
        self.position: dict[str, Any] | None = None
        self.bad = BadSteps(self.tc.max_bad_steps, parts.config["optim"].get("lr"), self.tc.grad_clip)
        # under torchrun: one baseline of the global batch on every rank
        decay = self.objective.baseline_decay
        synced = distributed.initialized()
        self.baseline = GlobalMeanBaseline(decay) if synced else MovingAverageBaseline(decay)
        self.ckpt_dir = out_dir / "checkpoints"
        # fp16 only; bf16 needs no loss scaling
        self.scaler = precision.grad_scaler(self.amp_dtype, self.device)

    def config_dict(self) -> dict[str, Any]:
        """Resolved config stored in every checkpoint."""
        return self.parts.config

    def training_state(self) -> dict[str, Any]:
        """Everything but the weights that decides the rest of the run: optimizer, schedule, counters, early
        stopping, the epoch's position and every rank's RNG states (a collective: every rank calls it)."""
        seconds = self.train_seconds + (time.monotonic() - self.epoch_started if self.position else 0.0)
        return dict(optimizer=self.optimizer.state_dict(),
                    scheduler=self.scheduler.state_dict() if self.scheduler else None,
                    epoch=self.epoch, step=self.step, best=self.best, bad_epochs=self.bad_epochs,
                    history=self.history, train_seconds=seconds, baseline=self.baseline.state_dict(),
                    objective=self.objective.state_dict(), bad_in_row=self.bad.in_row,
                    scaler=self.scaler.state_dict() if self.scaler else None, position=self.position,
                    rng=distributed.all_gather_objects(randomness.rng_state(self.device)))

    def save(self, name: str, state: dict[str, Any]) -> Path:
        """Write a checkpoint: the weights and `state` (from training_state), everything needed to resume."""
        return save_checkpoint(self.ckpt_dir / name, self.model, self.vocab, self.config_dict(), **state)

    def write_history(self) -> None:
        """history.json: one entry per finished epoch (rank 0)."""
        if self.is_main:
            write_json_atomic(self.out_dir / "history.json", self.history, indent=1)

    def write_curves(self) -> None:
        """curves.png from history.json (rank 0; nothing before the first epoch has ended)."""
        if self.is_main and self.history:
            plot_history(self.out_dir / "history.json", self.out_dir / CURVES_NAME)

    def read_same_model(self, path: Path, key: str) -> dict[str, Any]:
        """Load the weights of a checkpoint of this run's model config and vocabulary (SAME_MODEL[key] says
        what to do instead); refuse any other."""
        return load_same_model(path, self.model, self.vocab, self.parts.config["model"], self.device,
                               *SAME_MODEL[key], upgrade=self.parts.upgrade_model)

    def resume(self, path: Path) -> None:
        """Restore model, optimizer, scheduler, counters, the epoch's position and the RNG states from a
        checkpoint of the same model, so that the run goes on exactly as if it had never stopped."""
        ckpt = self.read_same_model(path, "resume")
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if self.scheduler and ckpt.get("scheduler"):
            self.scheduler.load_state_dict(ckpt["scheduler"])
        self.epoch, self.step, self.best = ckpt["epoch"], ckpt["step"], ckpt["best"]
        self.bad_epochs, self.history = ckpt["bad_epochs"], ckpt["history"]
        self.train_seconds = ckpt.get("train_seconds", 0.0)
        self.baseline.load_state_dict(ckpt["baseline"])
        self.objective.load_state_dict(ckpt.get("objective") or {})
        if self.scaler is not None and ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        self.position, self.bad.in_row = ckpt.get("position"), ckpt.get("bad_in_row", 0)
        schedule.follow_lr(self.optimizer, self.scheduler, ckpt["config"], self.parts.config)
        rng = ckpt.get("rng") or []
        # no set_seed after this: the run's streams go on where they were
        if len(rng) == distributed.world_size():
            randomness.set_rng_state(rng[distributed.rank()], self.device)
        else:
            logger.warning("%s holds the random state of %d process(es), this launch has %d: the resumed run "
                           "goes on from here but will not repeat an uninterrupted one exactly", path,
                           len(rng), distributed.world_size())
        self.write_history()  # the finished epochs, whatever an interrupted run left in history.json
        self.bad.saved = (f"batch {self.position['batch']} of epoch {self.epoch + 1}" if self.position
                          else f"the end of epoch {self.epoch}")
        best = f"best {self.tc.monitor} {self.best:.4f}" if math.isfinite(self.best) else "no epoch scored"
        logger.info("resumed from %s at %s (%s)", path, self.bad.saved, best)

    def init_weights(self, path: Path) -> None:
        """init_from=PATH: start from a checkpoint's weights only (same model config and vocabulary), with
        this run's fresh optimizer, schedule and counters (e.g. self-critical training after
        cross-entropy)."""
        ckpt = self.read_same_model(path, "init_from")
        logger.info("initialised the weights from %s (epoch %s of its run)", path, ckpt.get("epoch"))

    def weights_finite(self) -> bool:
        """Whether every weight and buffer of the model is finite, on every rank (a collective)."""
        return not distributed.any_rank(not precision.all_finite(self.model.state_dict().values()))

    def save_last(self, state: dict[str, Any], where: str, finite: bool | None = None) -> None:
        """last.pt from `state` (rank 0) if the weights are `finite` (None: check them), else a warning."""
        if self.weights_finite() if finite is None else finite:
            self.bad.saved = where
            if self.is_main:
                self.save("last.pt", state)
        elif self.is_main:
            logger.warning("%s: the model's weights are not all finite; checkpoints/last.pt keeps %s", where,
                           self.bad.saved or "nothing (none was written)")
