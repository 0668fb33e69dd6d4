"""The JSON file beside exported graphs (`captioning.json`): what the runner needs to caption without the model code.

Standard library only (no torch, no NumPy), so a folder can be checked on any machine. The file holds:

    format       "captioning-export/v1"; another value is another version of this layout and is refused
    backend      "onnx" or "torchscript": the kind of graph files
    graphs       for encoder, init and step: {"file", "inputs", "outputs"} (the tensors' names, in order)
    vocab        the words in id order (ids 0..3 are <pad>, <start>, <end>, <unk>)
    preprocess   {"steps": [...], "input_size": [H, W]}: the encoder's transform() as data (export/preprocess.py)
    grid         [h, w]: the annotation grid, L = h * w regions
    annotation_dim, keys_shape, state   D; the keys' shape after the row; {"count", "tree", "shapes"} of the state
    model        the checkpoint's model config (encoder, attention, decoder), for the record
    source       where it came from: the checkpoint's file name, the captioning and torch versions

The graphs (see captioning/export/exporter.py): encoder images (B, 3, H, W) -> a (B, L, D); init a -> keys, state_0
.. state_{n-1}; step (words (N,), a (N, L, D), keys (N, ...), state_in_*) -> logits (N, V), alpha (N, L), state_out_*.
Every first dim is the row, of any size; the state is the decoder's (possibly nested) tuple, flattened in order.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from captioning.base.constraints import MAX_IMAGE_SIDE
from captioning.base.jsonio import load_json, write_json_atomic

FORMAT = "captioning-export/v1"
MANIFEST = "captioning.json"
BACKENDS = ("onnx", "torchscript")
GRAPHS = ("encoder", "init", "step")
SUFFIX = {"onnx": ".onnx", "torchscript": ".pt"}


@dataclass(frozen=True)
class Manifest:
    """The contents of `captioning.json` (see the module docstring)."""

    backend: str
    graphs: dict[str, dict[str, Any]]
    vocab: list[str]
    preprocess: dict[str, Any]
    grid: list[int]
    annotation_dim: int
    keys_shape: list[int]
    state: dict[str, Any]
    model: dict[str, Any]
    source: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT

    @property
    def input_size(self) -> tuple[int, int]:
        """(H, W) of the images the encoder graph takes."""
        h, w = self.preprocess["input_size"]
        return int(h), int(w)

    @property
    def state_count(self) -> int:
        """Number of tensors in the flattened decoder state."""
        return int(self.state["count"])

    def graph_file(self, folder: Path, name: str) -> Path:
        """Path of graph `name` (encoder, init, step) in the export folder."""
        return folder / self.graphs[name]["file"]


def graph_names(state_count: int) -> dict[str, dict[str, list[str]]]:
    """The input and output tensor names of the three graphs for a state of `state_count` tensors."""
    state = [f"state_{i}" for i in range(state_count)]
    return {
        "encoder": {"inputs": ["images"], "outputs": ["a"]},
        "init": {"inputs": ["a"], "outputs": ["keys", *state]},
        "step": {"inputs": ["words", "a", "keys", *[f"state_in_{i}" for i in range(state_count)]],
                 "outputs": ["logits", "alpha", *[f"state_out_{i}" for i in range(state_count)]]},
    }


def write_manifest(folder: Path, manifest: Manifest) -> Path:
    """Write `captioning.json` into the folder (atomically); returns its path."""
    path = folder / MANIFEST
    write_json_atomic(path, asdict(manifest), indent=1)
    return path


def _need(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], path: Path) -> Any:
    """data[key], which must be of `kind`; a ValueError naming the file and the field otherwise."""
    if key not in data:
        raise ValueError(f"{path} has no '{key}' field: it is not a complete captioning export (re-export the model)")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{path}: field '{key}' is malformed ({type(value).__name__}); re-export the model")
    return value


def _check_graphs(graphs: dict[str, Any], state_count: int, backend: str, path: Path) -> None:
    """Every graph names a file of the backend's kind and the tensors this version's runner feeds and reads."""
    expected = graph_names(state_count)
    for name in GRAPHS:
        spec = graphs.get(name)
        if not isinstance(spec, dict) or not isinstance(spec.get("file"), str):
            raise ValueError(f"{path}: graph '{name}' is missing or has no file name; re-export the model")
        if Path(spec["file"]).name != spec["file"] or not spec["file"].endswith(SUFFIX[backend]):
            raise ValueError(f"{path}: graph '{name}' names {spec['file']!r}, not a {backend} file in the folder")
        if spec.get("inputs") != expected[name]["inputs"] or spec.get("outputs") != expected[name]["outputs"]:
            raise ValueError(f"{path}: graph '{name}' has inputs/outputs {spec.get('inputs')} -> "
                             f"{spec.get('outputs')}, not this version's {expected[name]}; re-export the model")


def read_manifest(folder: str | os.PathLike) -> Manifest:
    """Read and check an export folder's `captioning.json`; one clear ValueError (or OSError) if it is not one."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not folder.is_dir():
        raise FileNotFoundError(f"export folder not found: {folder}" if not folder.exists() else
                                f"{folder} is a file, not an export folder (written by captioning-export)")
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a captioning export: it has no {MANIFEST} (write one with "
                                "captioning-export --checkpoint best.pt --out DIR)")
    data = load_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a captioning export manifest (a JSON object was expected)")
    fmt = data.get("format")
    if fmt != FORMAT:
        raise ValueError(f"{path} has format {fmt!r}, but this runner reads {FORMAT!r}: re-export the model with "
                         "this version's captioning-export")
    backend = _need(data, "backend", str, path)
    if backend not in BACKENDS:
        raise ValueError(f"{path}: backend {backend!r} is not one of {', '.join(BACKENDS)}")
    state = _need(data, "state", dict, path)
    count = _need(state, "count", int, path)
    vocab = _need(data, "vocab", list, path)
    if len(vocab) < 5 or not all(isinstance(w, str) for w in vocab):
        raise ValueError(f"{path}: field 'vocab' must list the words (special tokens first); re-export the model")
    prep = _need(data, "preprocess", dict, path)
    size = _need(prep, "input_size", list, path)
    grid = _need(data, "grid", list, path)
    for name, pair in (("preprocess.input_size", size), ("grid", grid)):
        if len(pair) != 2 or not all(isinstance(x, int) and 1 <= x <= MAX_IMAGE_SIDE for x in pair):
            raise ValueError(f"{path}: field '{name}' must be two integers from 1 to {MAX_IMAGE_SIDE}, "
                             f"got {pair!r:.80}")
    _need(prep, "steps", list, path)
    graphs = _need(data, "graphs", dict, path)
    _check_graphs(graphs, count, backend, path)
    for name in GRAPHS:
        if not (folder / graphs[name]["file"]).is_file():
            raise FileNotFoundError(f"{folder} is an incomplete export: {graphs[name]['file']} ({name} graph) "
                                    "is missing")
    return Manifest(backend=backend, graphs=graphs, vocab=vocab, preprocess=prep, grid=grid,
                    annotation_dim=_need(data, "annotation_dim", int, path),
                    keys_shape=_need(data, "keys_shape", list, path), state=state,
                    model=_mapping(data.get("model")), source=_mapping(data.get("source")))


def _mapping(value: Any) -> dict[str, Any]:
    """An optional informational field: the dict, or {} when absent or not a dict."""
    return value if isinstance(value, dict) else {}
