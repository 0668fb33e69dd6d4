"""The one checkpoint format: a plain dict of state_dicts, the resolved config and the vocabulary.

Written atomically (tmp file, then os.replace) and read with `weights_only=True`, so loading a
checkpoint never runs code and an interrupted save never leaves a broken file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from captioning.data.vocab import Vocabulary
from captioning.models.captioner import Captioner, build_captioner

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


def load_model(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> tuple[Captioner, Vocabulary, dict[str, Any]]:
    """Rebuild the model from a checkpoint's config and load its weights; returns model, vocab, checkpoint."""
    ckpt = read_checkpoint(path, map_location)
    vocab = Vocabulary(ckpt["vocab"])
    model_cfg = dict(ckpt["config"]["model"])
    if "pretrained" in model_cfg["encoder"]:  # the checkpoint holds the weights: never download them again
        model_cfg["encoder"] = {**model_cfg["encoder"], "pretrained": False}
    model = build_captioner(model_cfg, len(vocab))
    model.load_state_dict(ckpt["model"])
    model.to(map_location).eval()
    return model, vocab, ckpt
