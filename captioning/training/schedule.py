"""The learning-rate schedule's step at the end of an epoch (conf/scheduler/) or after every optimizer step (a warm-up
schedule), and a learning rate changed on resume."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping
from typing import Any

import torch

logger = logging.getLogger(__name__)


class InverseSqrtWarmup(torch.optim.lr_scheduler.LRScheduler):
    """Vaswani et al.'s warm-up (ruotianluo's NoamOpt), stepped after every optimizer step s = 1, 2, ...:

        lr(s) = optim.lr * min(s / warmup_steps, sqrt(warmup_steps / s))

    a linear rise to optim.lr at s = warmup_steps, then decay as 1 / sqrt(s). NoamOpt's d_model^-0.5 *
    min(s^-0.5, s warmup^-1.5) (factor 1) is this with optim.lr = (d_model warmup_steps)^-0.5: 3.125e-4 for
    d_model 512 and 20000 steps (conf/experiment/coco_transformer.yaml).
    """

    per_step = True  # the trainer steps it after each optimizer step, not at epoch ends

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int, last_epoch: int = -1):
        if warmup_steps < 1:
            raise ValueError(f"scheduler.warmup_steps must be >= 1, got {warmup_steps}")
        self.warmup_steps = warmup_steps
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:  # type: ignore[override]
        s = self.last_epoch + 1  # the step the rate is for (1 at the first update)
        factor = min(s / self.warmup_steps, math.sqrt(self.warmup_steps / s))
        return [float(base) * factor for base in self.base_lrs]


def after_optimizer_step(scheduler: Any) -> None:
    """A per-step schedule's step after an optimizer step (an epoch schedule waits for the epoch's end)."""
    if getattr(scheduler, "per_step", False):
        scheduler.step()


def step_schedule(scheduler: Any, score: float) -> None:
    """One epoch's step (none for a per-step schedule): ReduceLROnPlateau takes the monitored validation score, an
    epoch schedule nothing.

    A score that is not finite (NaN: validation decoded nothing scorable) counts as no improvement: the plateau
    schedule gets its mode's worst value instead.

    A run resumed from a stop at its first epoch's last batch steps the restored schedule before the new process has
    made an optimizer step; torch then warns that a learning rate is skipped, but none is (the schedule's state came
    from the checkpoint; tests/training/test_resume.py ends such runs bit-identical), so that warning is not shown.
    """
    if getattr(scheduler, "per_step", False):
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            worst = -math.inf if scheduler.mode == "max" else math.inf
            scheduler.step(score if math.isfinite(score) else worst)
        else:
            scheduler.step()


def follow_lr(optimizer: torch.optim.Optimizer, scheduler: Any, saved: Mapping[str, Any],
              now: Mapping[str, Any]) -> None:
    """After a resume: where this launch's optim.lr differs from the checkpoint's config (`saved`; `now`: this
    run's), scale the restored learning rates by now / saved, so that the schedule goes on from the lowered (or
    raised) rate, e.g. after a divergence. The optimizer's state dict would otherwise bring back the old rate."""
    old, new = saved.get("optim", {}).get("lr"), now.get("optim", {}).get("lr")
    if not old or not new or old == new:
        return
    factor = new / old
    for group in optimizer.param_groups:
        group["lr"] *= factor
        if "initial_lr" in group:  # what epoch schedules count from
            group["initial_lr"] *= factor
    for name in ("base_lrs", "_last_lr"):
        if isinstance(getattr(scheduler, name, None), list):
            setattr(scheduler, name, [lr * factor for lr in getattr(scheduler, name)])
    logger.warning("optim.lr=%g (the checkpoint's run had %g): the resumed learning rates are scaled by %g", new, old,
                   factor)
