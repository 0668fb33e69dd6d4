"""TorchScript export folders for the runner: each graph a traced module, called with NumPy arrays (needs torch).

`captioning.export.runner.Runner` imports this only for a folder whose backend is torchscript, so the ONNX path
never imports torch. The modules run on the CPU under no_grad; their outputs come back as NumPy arrays.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from captioning.export.manifest import GRAPHS, Manifest

Graph = Callable[[list[np.ndarray]], list[np.ndarray]]


def _load(path: Path) -> torch.jit.ScriptModule:
    """A traced module from the folder; one clear error for a file that is not one."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*torch\.jit\.\w+` is deprecated")
            return torch.jit.load(str(path), map_location="cpu")
    except Exception as err:  # torch.jit raises RuntimeError and others for a foreign file
        raise ValueError(f"{path} is not a loadable TorchScript graph ({type(err).__name__})") from err


def _graph(module: torch.jit.ScriptModule) -> Graph:
    def run(inputs: list[np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            out = module(*(torch.from_numpy(x) for x in inputs))
        return [t.numpy() for t in (out if isinstance(out, tuple | list) else (out,))]

    return run


def load_graphs(folder: Path, manifest: Manifest) -> dict[str, Graph]:
    """The encoder, init and step graphs of a torchscript export folder as functions of NumPy arrays."""
    return {name: _graph(_load(manifest.graph_file(folder, name))) for name in GRAPHS}
