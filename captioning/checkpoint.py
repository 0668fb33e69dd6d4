"""The one checkpoint format: a plain dict of state_dicts, the resolved config and the vocabulary.

Written atomically (tmp file, then os.replace), so an interrupted save never leaves a broken file. A
checkpoint is data, never code: it is read with `weights_only=True` (no pickled objects). Rebuilding a model
from one (its config checked against the registry first) is `captioning.factory.checkpoints.load_model`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from captioning.data.vocab import Vocabulary
from captioning.models.captioner import Captioner

FORMAT = "captioning/v1"


def save_checkpoint(path: str | os.PathLike, model: Captioner, vocab: Vocabulary, config: dict[str, Any],
                    **extra: Any) -> Path:
    """Write model weights, config (plain containers), vocabulary and `extra` (optimizer state, epoch...)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "model": model.state_dict(), "config": config, "vocab": vocab.to_list(), **extra}
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
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
