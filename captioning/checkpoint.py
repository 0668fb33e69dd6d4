"""The one checkpoint format: a plain dict of state_dicts, the resolved config and the vocabulary.

Written through base/files.py's atomic writer (tmp file, fsync, rename), so an interrupted or failed save (a full
disk) never leaves a broken file: the previous last.pt stays whole and the run stays resumable. A
checkpoint is data, never code: it is read with `weights_only=True` (no pickled objects). Rebuilding a model
from one (its config checked against the registry first) is `captioning.factory.checkpoints.load_model`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from captioning.base.files import atomic_file
from captioning.data.vocab import Vocabulary
from captioning.models.captioner import Captioner

FORMAT = "captioning/v1"


def save_checkpoint(path: str | os.PathLike, model: Captioner, vocab: Vocabulary, config: dict[str, Any],
                    **extra: Any) -> Path:
    """Write model weights, config (plain containers), vocabulary and `extra` (optimizer state, epoch...).

    A failed write raises an OSError `cannot write PATH: REASON` and leaves the file at `path` as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "model": model.state_dict(), "config": config, "vocab": vocab.to_list(), **extra}
    with atomic_file(path) as f:
        torch.save(payload, f)
    return path


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint dict safely, with a clear error for a missing or foreign file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # unpickling errors come in many types; all mean "not ours"
        raise ValueError(f"{path} is not a readable captioning checkpoint ({type(err).__name__}: {err})") from err
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise ValueError(f"{path} is not a captioning checkpoint (expected format {FORMAT!r}); "
                         "was it written by another tool?")
    return ckpt
