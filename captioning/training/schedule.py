"""The learning-rate schedule's step at the end of an epoch (conf/scheduler/), and a learning rate changed on resume."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping
from typing import Any

import torch

logger = logging.getLogger(__name__)


def step_schedule(scheduler: Any, score: float) -> None:
    """One epoch's step: ReduceLROnPlateau takes the monitored validation score, an epoch schedule none.

    A score that is not finite (NaN: validation decoded nothing scorable) counts as no improvement: the plateau
    schedule gets its mode's worst value instead.

    A run resumed from a stop at its first epoch's last batch steps the restored schedule before the new process has
    made an optimizer step; torch then warns that a learning rate is skipped, but none is (the schedule's state came
    from the checkpoint; tests/training/test_resume.py ends such runs bit-identical), so that warning is not shown.
    """
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
