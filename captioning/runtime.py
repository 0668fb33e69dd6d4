"""Where a process runs: the conf/ folder, the device, the seed (one copy each, for every entry point)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

# The config groups live in the top-level conf/ folder of the source tree (installed with `pip install -e`).
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when available; anything else is passed to torch.device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={name} was requested but CUDA is not available; use device=cpu")
    return device


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch so runs repeat."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

