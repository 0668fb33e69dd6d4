"""Where a process runs: the config groups (conf/), the device, the seed (one copy each, for every entry point).

torch and NumPy are imported by the functions that use them, so a command that only needs CONF_DIR (its --help,
a misspelt override) answers before torch has loaded (tests/tools/test_cli_startup.py)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def _conf_dir() -> Path:
    """The config groups: the top-level conf/ of a source tree (a checkout, `pip install -e`), where they are edited,
    else the copy the build step put into the installed package (a wheel, `pip install .` or `pip install git+...`:
    setup.py copies conf/ into captioning/conf/; there is no second copy in the source tree)."""
    package = Path(__file__).resolve().parent
    source = package.parent / "conf"
    if (package.parent / "pyproject.toml").is_file() and (source / "train.yaml").is_file():
        return source
    return package / "conf"


CONF_DIR = _conf_dir()


def _absolute(path: str) -> str:
    """`${abspath:PATH}` in a config: PATH made absolute against the folder the command runs in, so a run's stored
    config (and every checkpoint's) names the same files from any folder (conf/experiment/flickr8k_1k.yaml)."""
    return str(Path(path).expanduser().absolute())


def _register_resolvers() -> None:
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("abspath", _absolute, replace=True)


_register_resolvers()


class DeviceError(ValueError):
    """A device this machine does not have (device=cuda on a CPU-only machine, cuda:N past the last GPU)."""


def device_problem(name: str) -> str | None:
    """Why `device=name` cannot run on this machine, or None when it can ('auto' and 'cpu' always can)."""
    if name in ("auto", "cpu"):
        return None
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        return "not a device; use auto, cpu, mps, cuda or cuda:N"
    if device.type == "cuda" and not torch.cuda.is_available():
        build = "this torch is a CPU-only build" if torch.version.cuda is None else "no CUDA GPU or driver is visible"
        return f"CUDA is not available on this machine ({build}); use device=cpu or device=auto"
    if device.type == "cuda" and device.index is not None and device.index >= (n := torch.cuda.device_count()):
        return f"this machine has {n} CUDA device(s), cuda:0 to cuda:{n - 1}"
    if device.type == "mps" and not torch.backends.mps.is_available():
        return "MPS (Apple GPU) is not available on this machine; use device=cpu or device=auto"
    return None


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when available; anything else is passed to torch.device. DeviceError (a ValueError: one
    line in every command) for a device this machine does not have."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if (problem := device_problem(name)) is not None:
        raise DeviceError(f"device={name}: {problem}")
    return torch.device(name)


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch so runs repeat."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

