"""The learning-rate schedule's step at the end of an epoch (conf/scheduler/)."""

from __future__ import annotations

import warnings
from typing import Any

import torch


def step_schedule(scheduler: Any, score: float) -> None:
    """One epoch's step: ReduceLROnPlateau takes the monitored validation score, an epoch schedule none.

    A run resumed from a stop at its first epoch's last batch steps the restored schedule before the new process has
    made an optimizer step; torch then warns that a learning rate is skipped, but none is (the schedule's state came
    from the checkpoint; tests/training/test_resume.py ends such runs bit-identical), so that warning is not shown.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            scheduler.step(score)
        else:
            scheduler.step()
