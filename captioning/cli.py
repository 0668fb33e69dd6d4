"""What every console command shares: one-line errors, exit status, option checks, output checks before work.

Each entry point's `main()` runs its work through `run_cli`: success exits 0 (the console script's
`sys.exit(main())` receives 0 or None); an error a user can cause (ValueError - ConfigError and
UnsafeCheckpointError included -, OSError - FileNotFoundError and ImageError included) prints one line
`PROG: error: MESSAGE` on stderr and exits 2; Ctrl-C, a deliberate stop, prints `PROG: stopped by Ctrl-C` and
exits 130. Anything else is a bug and keeps its traceback. Inside a Hydra multirun the error is logged on one
line and re-raised, so the sweeper records a failed job and goes on (or stops) by its own rules instead of the
whole process exiting.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn, TypeVar

from captioning.base.messages import one_line

logger = logging.getLogger(__name__)

T = TypeVar("T")
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError)
EXIT_ERROR, EXIT_INTERRUPTED = 2, 130


def fail(prog: str, message: BaseException | str, status: int = EXIT_ERROR) -> NoReturn:
    """Print `prog: error: message` on one stderr line and exit with `status`."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr, flush=True)
    sys.exit(status)


def stopped(prog: str, message: str = "stopped by Ctrl-C") -> NoReturn:
    """A deliberate stop (Ctrl-C), not an error: `prog: message` on one stderr line, exit status 130."""
    print(f"{prog}: {one_line(message)}", file=sys.stderr, flush=True)
    sys.exit(EXIT_INTERRUPTED)


def exit_status(stop: SystemExit) -> int:
    """The status Python exits with for `stop`: its code, 0 for None; a message (sys.exit("...")) is printed on
    stderr, as Python prints it, and gives 1. For a process that must end by os._exit (distributed.exit_process)."""
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, file=sys.stderr)
    return 1


def _in_hydra_multirun() -> bool:
    if "hydra" not in sys.modules:
        return False
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def run_cli(fn: Callable[[], T], prog: str | None = None,
            expected: tuple[type[BaseException], ...] = EXPECTED_ERRORS) -> T:
    """Run an entry point's work; an expected error becomes one stderr line and exit status 2 (see the docstring).

    Returns fn's result on success, so a Hydra task function can still return its metric to a sweeper.
    """
    prog = prog or Path(sys.argv[0]).name or "captioning"
    try:
        return fn()
    except KeyboardInterrupt:
        if _in_hydra_multirun():
            raise
        stopped(prog)
    except expected as err:
        if _in_hydra_multirun():
            logger.error("%s: error: %s", prog, one_line(err))
            raise
        fail(prog, err)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line usage error (`prog: error: message (see --help)`), exit status 2."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (see --help)")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def writable_dir(path: str | os.PathLike) -> Path:
    """Prove, before any work starts, that files can be written in a folder (or in the nearest existing folder
    above it, which the writer will create it under); OSError if not. Nothing is left behind."""
    path = Path(path)
    existing = next((p for p in (path, *path.absolute().parents) if p.exists()), Path("/"))
    if not existing.is_dir():
        raise NotADirectoryError(f"cannot write to the folder {path}: {existing} is a file, not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".write_test_"):
            pass
    except OSError as err:
        raise OSError(f"cannot write to the folder {path}: {existing}: {err.strerror or err}") from err
    return path


def writable_file(path: str | os.PathLike) -> Path:
    """Prove, before any work starts, that an output file can be written (its folder may still be missing)."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"cannot write to {path}: it is a folder, not a file")
    writable_dir(path.parent)
    if path.exists():
        try:
            with open(path, "r+b"):  # opened for writing without truncating what is there
                pass
        except OSError as err:
            raise OSError(f"cannot write to {path}: {err.strerror or err}") from err
    return path


# The folders above an output folder that its default layout creates: outputs/<date>/<time> (captioning-train),
# <run>/eval/<split>-beam<K>-<name> (captioning-evaluate), outputs/features/<date>/<time> (its log, for
# captioning-extract-features).
LAYOUT_PARENTS = re.compile(r"\d{4}-\d{2}-\d{2}|outputs|eval|features")


@contextlib.contextmanager
def no_unused_folder(out_dir: Path, kept: tuple[str, ...] = (".hydra",)) -> Iterator[None]:
    """Around a Hydra app's work: when it exits the process (a one-line error of run_cli), its output folder is
    removed if it holds nothing the work wrote (remove_unused_folder)."""
    try:
        yield
    except SystemExit:
        remove_unused_folder(out_dir, kept)
        raise


def remove_unused_folder(out_dir: Path, kept: tuple[str, ...] = (".hydra",)) -> None:
    """Delete an output folder that holds nothing but `kept` names and *.log files (what Hydra puts there before
    the work writes anything: a launch that failed early), then the layout's parents above it that it left empty."""
    if not out_dir.is_dir() or any(p.name not in kept and p.suffix != ".log" for p in out_dir.iterdir()):
        return
    shutil.rmtree(out_dir, ignore_errors=True)
    parent = out_dir.parent
    while LAYOUT_PARENTS.fullmatch(parent.name) and parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
