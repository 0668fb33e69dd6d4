"""One run per folder: an OS lock on the run folder, and what a run may do with a folder that already holds one.

A run holds an OS lock (flock; msvcrt.locking on Windows) on `<run>/.lock` (its PID written inside) for its whole
life (captioning/base/lock.py, shared with captioning-evaluate and captioning-extract-features); the OS drops the
lock when the process ends, however it ends (kill -9 included), so a dead run never blocks the next one. Under the
lock, `RunFolder.claim` applies the folder policy (a folder "holds a run" once it has config.yaml or checkpoints/):

- a new or empty folder: a new run starts. `resume=auto` is accepted there and starts the run, so a job script
  may always pass it (first launch and every relaunch after a preemption alike); the log says so.
- a folder that holds a run: `resume=auto` continues from its checkpoints/last.pt; a run that stopped before its
  first checkpoint (no *.pt, no metrics.json) starts again from the beginning, its old files moved aside as below
  and a warning saying so; with results but no last.pt it is an error;
  `resume=PATH` may continue from one of the folder's own checkpoints; `overwrite=true` moves the old run's files
  aside, into the sibling folder `<run>.replaced-<time>`, and starts a new run; anything else is refused.
- stale `*.tmp` files of interrupted checkpoint writes in checkpoints/ are removed.

Hydra writes its own `.hydra/` and `<job>.log` into the folder before the run starts; they are left in place.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from omegaconf import DictConfig

from captioning.base.lock import LOCK_NAME, FolderInUseError, FolderLock
from captioning.training import distributed

logger = logging.getLogger(__name__)
KEPT = (LOCK_NAME, ".hydra")  # never moved aside: the lock itself and the Hydra files of this launch


class RunFolderError(Exception):
    """A run folder that is in use, or that holds a run this launch may not touch (a one-line user error)."""


class RunFolder:
    """The run folder, locked for the life of this object (`with RunFolder(path) as folder: ...`)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.ckpt_dir = self.path / "checkpoints"
        self._lock = FolderLock(self.path, "training run", "train into another folder (hydra.run.dir=...)")

    # -- the lock ----------------------------------------------------------------------------
    def lock(self) -> None:
        """Take the folder's lock (captioning/base/lock.py); RunFolderError naming the holder's PID if taken."""
        try:
            self._lock.acquire()
        except FolderInUseError as err:
            raise RunFolderError(str(err)) from None

    def release(self) -> None:
        """Drop the lock (the OS also drops it when the process dies); the .lock file stays, empty."""
        self._lock.release()

    def __enter__(self) -> RunFolder:
        if not self._lock.held:
            self.lock()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- the policy --------------------------------------------------------------------------
    def holds_run(self) -> bool:
        """Whether a run has already used this folder (its config.yaml or checkpoints/ exist)."""
        return (self.path / "config.yaml").exists() or self.ckpt_dir.exists()

    def claim(self, resume: str | None, overwrite: bool) -> Path | None:
        """Lock the folder and decide how this launch uses it; returns the checkpoint to resume from (or None).

        Raises RunFolderError (the lock is then released) for a folder in use or one this launch may not touch.
        """
        if not self._lock.held:
            self.lock()
        try:
            path = self._decide(resume, overwrite)
        except BaseException:
            self.release()
            raise
        self.remove_stale_tmp()
        return path

    def _decide(self, resume: str | None, overwrite: bool) -> Path | None:
        where = str(self.path)
        if overwrite and resume:
            raise RunFolderError(f"overwrite=true starts a new run in {where}, resume={resume} continues one; "
                                 "choose one")
        if not self.holds_run():
            if resume == "auto":
                logger.info("resume=auto: %s holds no run yet, so a new run starts there", where)
                return None
            return Path(resume) if resume else None
        if resume == "auto":
            last = self.ckpt_dir / "last.pt"
            if last.is_file():
                return last
            if self.has_results():
                raise RunFolderError(f"resume=auto: nothing to resume in {where} (it holds a run's results but no "
                                     "checkpoints/last.pt); start it afresh with overwrite=true")
            # The run there stopped before its first checkpoint: there is nothing to lose, so it starts again (an
            # identical run, being seeded), its old files kept aside.
            aside = self.move_aside()
            logger.warning("resume=auto: nothing to resume in %s (its run stopped before its first checkpoint); "
                           "starting the run from the beginning (the old files are in %s)", where, aside)
            return None
        if resume:
            path = Path(resume)
            if self.ckpt_dir.resolve() != path.resolve().parent:
                raise RunFolderError(f"{where} already holds a run; resume={resume} may only continue from its "
                                     "own checkpoints/; train into another folder (hydra.run.dir=...), or pass "
                                     "overwrite=true to move that run aside first")
            return path
        if not overwrite:
            raise RunFolderError(f"{where} already holds a run; continue it with resume=auto, replace it with "
                                 "overwrite=true (its files are moved aside), or train into another folder "
                                 "(hydra.run.dir=...)")
        self.move_aside()
        return None

    def has_results(self) -> bool:
        """Whether the folder holds anything a run produced that a restart would lose: a checkpoint or metrics."""
        checkpoints = self.ckpt_dir.is_dir() and any(self.ckpt_dir.glob("*.pt"))
        return checkpoints or (self.path / "metrics.json").exists()

    def move_aside(self) -> Path:
        """Move the folder's run files (all but the lock, .hydra/ and log files) into `<run>.replaced-<time>`."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = self.path.with_name(f"{self.path.name}.replaced-{stamp}")
        n = 1
        while target.exists():
            n += 1
            target = self.path.with_name(f"{self.path.name}.replaced-{stamp}-{n}")
        target.mkdir(parents=True)
        for entry in sorted(self.path.iterdir()):
            if entry.name not in KEPT and entry.suffix != ".log":
                shutil.move(str(entry), str(target / entry.name))
        logger.warning("overwrite=true: moved the previous run's files from %s to %s", self.path, target)
        return target

    def remove_stale_tmp(self) -> list[Path]:
        """Delete `*.tmp` files in checkpoints/ (half-written checkpoints of an interrupted run); returns them."""
        stale = sorted(self.ckpt_dir.glob("*.tmp")) if self.ckpt_dir.is_dir() else []
        for path in stale:
            path.unlink()
            logger.info("removed %s, an unfinished checkpoint write of an interrupted run", path)
        return stale


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
