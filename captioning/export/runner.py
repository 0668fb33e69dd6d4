"""Caption images from an export folder (`captioning-export --format onnx`) with ONNX Runtime, NumPy and PIL only.

    runner = Runner("exported/")
    for c in runner.caption(["photo.jpg", "other.png"], beam_size=3):
        print(" ".join(c.words), c.log_prob)

or from a shell, on a machine without torch: `captioning-run-export DIR IMAGE... [--beam-size K]`
(captioning/tools/run_export.py), which prints `path<TAB>caption` per image. Nothing here imports torch
(tests/export/test_runner_no_torch.py runs it with torch blocked): the images are read by the project's image
loader (captioning/data/images.py), preprocessed as the encoder's transform() does (captioning/export/preprocess.py)
and decoded by the NumPy ports of greedy decoding and beam search (captioning/export/search.py), which give the
PyTorch model's captions.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from captioning.base.decoding import BEAM_SIZE, MAX_LEN, SUPPRESS_UNK
from captioning.data.images import load_image
from captioning.data.vocab import Vocabulary
from captioning.export import preprocess
from captioning.export.manifest import GRAPHS, Manifest, read_manifest
from captioning.export.search import Found, State, decode, words_of

ImageInput = str | os.PathLike | Image.Image
Graph = Callable[[list[np.ndarray]], list[np.ndarray]]  # inputs in the manifest's order -> outputs in order


@dataclass
class Caption:
    """One image's caption: its words, raw log-probability (with <end> if it has one), word ids and maps (T, h, w),
    and with channel-wise attention each word's channel weights (T, C) (decoder=adaptive: each word's visual
    sentinel weight (T,) instead, as `sentinel`)."""

    words: list[str]
    log_prob: float
    tokens: list[int]
    alphas: np.ndarray
    channels: np.ndarray | None = None
    sentinel: np.ndarray | None = None


def _onnxruntime() -> Any:
    """The onnxruntime module, with a clear error where it is not installed."""
    try:
        import onnxruntime
    except ImportError as err:
        raise ImportError("captioning's export runner needs ONNX Runtime: pip install onnxruntime "
                          "(or the project's 'export' extra)") from err
    return onnxruntime


def session(path: Path, threads: int | None = None) -> Any:
    """An ONNX Runtime CPU session for one graph; `threads` intra-op threads (None: ONNX Runtime's default)."""
    ort = _onnxruntime()
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: no warnings about unused initializers on every start
    options.inter_op_num_threads = 1
    # Each of the three sessions has its own thread pool and decoding alternates between them and NumPy: threads
    # that spin waiting for work would take the cores from the next session (2 threads ran slower than 1 so).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads is not None:
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # ONNX Runtime raises its own types for a corrupt or foreign file
        raise ValueError(f"{path} is not a loadable ONNX graph ({type(err).__name__}: "
                         f"{str(err).strip().splitlines()[0][:200] if str(err).strip() else ''})") from err


def _onnx_graph(sess: Any, names: Sequence[str]) -> Graph:
    """A graph as a function of its inputs, in order."""
    return lambda inputs: sess.run(None, dict(zip(names, inputs)))


class Runner:
    """An export folder's three graphs (ONNX Runtime sessions; TorchScript modules for a torchscript export, which
    needs torch) with its vocabulary and preprocessing."""

    def __init__(self, folder: str | os.PathLike, threads: int | None = None):
        self.folder = Path(folder)
        self.manifest: Manifest = read_manifest(self.folder)
        preprocess.check_steps(self.manifest.preprocess["steps"])
        self.vocab = Vocabulary(self.manifest.vocab)  # checks the special tokens come first
        if self.manifest.backend == "onnx":
            self.graphs = {name: _onnx_graph(session(self.manifest.graph_file(self.folder, name), threads),
                                             self.manifest.graphs[name]["inputs"]) for name in GRAPHS}
        else:  # TorchScript files need torch; imported here only, so reading ONNX exports never imports it
            from captioning.export.torchscript import load_graphs

            self.graphs = load_graphs(self.folder, self.manifest)

    def _run(self, name: str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.graphs[name]([np.ascontiguousarray(x) for x in inputs])

    def encode(self, images: np.ndarray) -> np.ndarray:
        """Annotation vectors a (B, L, D) for preprocessed images (B, 3, H, W)."""
        return self._run("encoder", [images.astype(np.float32, copy=False)])[0]

    def init(self, a: np.ndarray) -> tuple[np.ndarray, State]:
        """The attention's keys and the decoder's initial state (flattened) for a (B, L, D)."""
        keys, *state = self._run("init", [a])
        return keys, state

    def step(self, words: np.ndarray, a: np.ndarray, keys: np.ndarray,
             state: State) -> tuple[np.ndarray, np.ndarray, State]:
        """One decoder step for N rows: logits (N, V), alpha (N, L; N, L + C with channel weights) and the new
        state."""
        logits, alpha, *new = self._run("step", [words.astype(np.int64, copy=False), a, keys, *state])
        return logits, alpha, new

    def pixels(self, image: ImageInput) -> np.ndarray:
        """One image (a path or a PIL image) as the encoder's input (3, H, W); a clear error for a wrong size."""
        name = image if not isinstance(image, Image.Image) else "image"
        im = load_image(image) if not isinstance(image, Image.Image) else image
        x = preprocess.apply(im, self.manifest.preprocess["steps"])
        H, W = self.manifest.input_size
        if x.shape != (3, H, W):
            raise ValueError(f"{name} is {x.shape[2]} x {x.shape[1]} pixels after preprocessing, but this export takes "
                             f"{W} x {H} images (its encoder does not resize them): resize the image first")
        return x

    def view(self, image: Image.Image) -> Image.Image:
        """The part of the image the encoder sees (after its resize and crop): what attention maps cover."""
        return preprocess.view(image, self.manifest.preprocess["steps"])

    def caption(self, images: Sequence[ImageInput], beam_size: int = BEAM_SIZE, max_len: int = MAX_LEN,
                length_penalty: float = 0.0, batch_size: int = 32, suppress_unk: bool = SUPPRESS_UNK) -> list[Caption]:
        """Caption images (paths or PIL images) as `Captioner.generate` does: greedy for beam 1, else beam search."""
        out: list[Caption] = []
        for i in range(0, len(images), batch_size):
            batch = np.stack([self.pixels(im) for im in images[i: i + batch_size]])  # (B, 3, H, W)
            out += self.caption_pixels(batch, beam_size, max_len, length_penalty, suppress_unk)
        return out

    def caption_pixels(self, images: np.ndarray, beam_size: int = BEAM_SIZE, max_len: int = MAX_LEN,
                       length_penalty: float = 0.0, suppress_unk: bool = SUPPRESS_UNK) -> list[Caption]:
        """Caption preprocessed images (B, 3, H, W) in one batch."""
        h, w = self.manifest.grid
        found: list[Found] = decode(self, self.encode(images), beam_size, max_len, length_penalty, suppress_unk)
        sentinel = (self.manifest.model.get("decoder") or {}).get("_target_") == "adaptive"
        out = []
        for f in found:
            extra = f.alphas[:, h * w:] if f.alphas.shape[1] > h * w else None
            out.append(Caption(words_of(f.tokens, self.vocab.itos), f.log_prob, f.tokens,
                               f.alphas[:, : h * w].reshape(-1, h, w), None if sentinel else extra,
                               extra[:, 0] if sentinel and extra is not None else None))
        return out
