"""Stopping a training run cleanly on Ctrl-C (SIGINT) or SIGTERM (e.g. a cluster's preemption notice).

While a `StopRequest` is active, the first signal only raises a flag; the trainer looks at it after every optimizer
step and after every epoch, writes a resumable checkpoint there (checkpoints/last.pt with the position inside the
epoch, so `resume=auto` continues bit-identically) and raises `TrainingInterrupted`. A second Ctrl-C aborts at once
(KeyboardInterrupt), as usual. Signal handlers can only be installed in the main thread; elsewhere (e.g. a thread of
a Hydra launcher) the request is a no-op and signals keep their default behaviour.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(Exception):
    """Training stopped on a signal after writing a resumable checkpoint."""

    def __init__(self, signame: str, epoch: int, step: int, checkpoint: Path):
        self.signame, self.epoch, self.step, self.checkpoint = signame, epoch, step, checkpoint
        super().__init__(f"{signame}: stopped in epoch {epoch + 1} after step {step}; the run is saved in {checkpoint}")


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
        logger.warning("%s: stopping after this step and saving the run (Ctrl-C again to abort at once)", name)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}
