"""Stopping a training run cleanly: on Ctrl-C (SIGINT) or SIGTERM (e.g. a cluster's preemption notice), and when it
diverges.

While a `StopRequest` is active, the first signal only raises a flag; the trainer looks at it after every optimizer
step and after every epoch, writes a resumable checkpoint there (checkpoints/last.pt with the position inside the
epoch, so `resume=auto` continues bit-identically) and raises `TrainingInterrupted`. A second Ctrl-C aborts at once
(KeyboardInterrupt), as usual. Signal handlers can only be installed in the main thread; elsewhere (e.g. a thread of
a Hydra launcher) the request is a no-op and signals keep their default behaviour.

An optimizer step whose loss or gradient norm is not finite is skipped (captioning/training/precision.py);
`BadSteps` counts those steps, warns about the first few of an epoch, and after `trainer.max_bad_steps` of them in a
row raises `TrainingDiverged` without writing anything, so checkpoints/last.pt keeps the last finite state.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from captioning.training import distributed

logger = logging.getLogger(__name__)
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def signal_words(signame: str) -> str:
    """A signal as a user knows it: SIGINT is the Ctrl-C they pressed."""
    return "Ctrl-C (SIGINT)" if signame == "SIGINT" else signame


class TrainingInterrupted(Exception):
    """Training stopped on a signal after writing a resumable checkpoint."""

    def __init__(self, signame: str, epoch: int, step: int, checkpoint: Path):
        self.signame, self.epoch, self.step, self.checkpoint = signame, epoch, step, checkpoint
        super().__init__(f"stopped by {signal_words(signame)} in epoch {epoch + 1} after step {step}; the run is "
                         f"saved in {checkpoint}")


class TrainingDiverged(Exception):
    """`trainer.max_bad_steps` optimizer steps in a row had a non-finite loss or gradient norm; checkpoints/last.pt
    (if any) was left as it was. `command`, when the app sets it, is the command line that continues the run."""

    def __init__(self, in_row: int, epoch: int, step: int, saved: str | None, advice: str):
        self.in_row, self.epoch, self.step, self.saved, self.advice = in_row, epoch, step, saved, advice
        self.command: str | None = None
        super().__init__(in_row, epoch, step, saved, advice)

    def __str__(self) -> str:
        kept = (f"checkpoints/last.pt holds the last finite state ({self.saved})" if self.saved else
                "it had written no checkpoint yet (resume=auto starts it again)")
        text = (f"training diverged: {self.in_row} steps in a row had a non-finite loss or gradient norm "
                f"(epoch {self.epoch + 1}, step {self.step}); {kept}; {self.advice}")
        return text + (f", then continue with: {self.command}" if self.command else "")


class BadSteps:
    """The optimizer steps skipped for a non-finite loss or gradient norm: this epoch's count (`in_epoch`, part of
    a mid-epoch checkpoint's position), the current run of them in a row (`in_row`, across epochs) and, for the
    error that stops the run after `limit` in a row, what checkpoints/last.pt holds (`saved`, kept by the trainer)
    and what to change (from the run's `lr` and `grad_clip`). Under torchrun rank 0 warns."""

    LOGGED = 3  # steps warned about one by one per epoch; the epoch's end sums up the rest

    def __init__(self, limit: int, lr: float | None, grad_clip: float | None):
        self.limit, self.logs, self.in_epoch, self.in_row = limit, distributed.is_main(), 0, 0
        self.saved: str | None = None
        clip = f"trainer.grad_clip={grad_clip}" if grad_clip else "set trainer.grad_clip (e.g. 5.0)"
        self.advice = f"lower optim.lr={lr} or {clip}"

    def record(self, what: str | None, epoch: int, batch: int, step: int, writer: Any) -> bool:
        """Count one step (`what`: None for a good one, else what was not finite); True when it was skipped (also
        written to TensorBoard as train/bad_steps, the epoch's count). TrainingDiverged at the limit."""
        if what is None:
            self.in_row = 0
            return False
        self.in_epoch, self.in_row = self.in_epoch + 1, self.in_row + 1
        if self.logs and self.in_epoch <= self.LOGGED:
            logger.warning("epoch %d, batch %d (step %d): non-finite %s; the optimizer step was skipped (%d in a "
                           "row, trainer.max_bad_steps=%d)", epoch + 1, batch, step, what, self.in_row, self.limit)
        writer.add_scalar("train/bad_steps", self.in_epoch, step)
        if self.in_row >= self.limit:
            raise TrainingDiverged(self.in_row, epoch, step, self.saved, self.advice)
        return True

    def end_epoch(self, epoch: int) -> int:
        """The finished epoch's count (one summary warning if some went unlogged); the next epoch starts at 0."""
        count, self.in_epoch = self.in_epoch, 0
        if self.logs and count > self.LOGGED:
            logger.warning("epoch %d: %d optimizer steps skipped for a non-finite loss or gradient norm (the first "
                           "%d logged above)", epoch + 1, count, self.LOGGED)
        return count


class StopRequest:
    """Context manager: the first SIGINT/SIGTERM sets `requested` (the signal's name); a second SIGINT raises
    KeyboardInterrupt. The previous handlers come back on exit."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = name
        logger.warning("%s: stopping after this step and saving the run (Ctrl-C again to abort at once)",
                       signal_words(name))

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}
