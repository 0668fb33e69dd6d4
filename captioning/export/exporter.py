"""Export a captioner as three graphs (ONNX or TorchScript) plus `captioning.json`, and check them against the model.

The graphs are those of captioning/export/graphs.py, traced with example inputs of 2 rows and a dynamic row dim
(torch.onnx's dynamo exporter for ONNX, torch.jit.trace for TorchScript). After writing, the folder is read back as
the runner reads it and every output of every graph is compared with the PyTorch model at other row counts (1 and
3): a graph that fixed a size or a branch of the example, or an operation the backend computes differently, is
refused with one line rather than written silently wrong.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

import captioning
from captioning.base.files import atomic_file, write_error
from captioning.data.vocab import Vocabulary
from captioning.export.graphs import (
    EncoderGraph,
    InitGraph,
    StepGraph,
    fixed_size,
    flatten_state,
    preprocess_steps,
    refusal,
    traceable,
)
from captioning.export.manifest import BACKENDS, MANIFEST, SUFFIX, Manifest, graph_names, write_manifest
from captioning.export.preprocess import check_steps
from captioning.export.runner import Runner
from captioning.factory.load import load_model
from captioning.models.attention import HardAttention, core_of
from captioning.models.captioner import Captioner
from captioning.models.ensemble import Ensemble

EXAMPLE_ROWS, CHECK_ROWS = 2, (1, 3)  # 2: torch.export treats sizes 0 and 1 as constants
TOLERANCE = 1e-4  # on every output, relative to its largest magnitude (float32 rounding is ~1e-7)


def _one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0][:300] if lines else ''}"


def _os_error(err: BaseException) -> OSError | None:
    """The OSError (a full disk, say) behind an exporter's error, if any: then the file failed, not the model."""
    seen: BaseException | None = err
    while seen is not None and not isinstance(seen, OSError):
        seen = seen.__cause__ or seen.__context__
    return seen


def _dynamic(name: str, growing: list[list[int]]) -> dict[str, Any]:
    """torch.export's dynamic shapes of a graph's inputs: the first dim (the row) of every one, one shared size, and
    the dims of state tensors that grow by a position each step (`growing`, per state tensor: a Transformer's cache)."""
    rows, positions = torch.export.Dim("rows", min=1), torch.export.Dim("positions", min=0)
    if name == "encoder":
        return {"images": {0: rows}}
    if name == "init":
        return {"a": {0: rows}}
    state = tuple({0: rows, **{d: positions for d in dims}} for dims in growing)
    return {"words": {0: rows}, "a": {0: rows}, "keys": {0: rows}, "state": state}


def _grown(model: Captioner, state: Any, a: torch.Tensor, keys: torch.Tensor) -> tuple[Any, list[list[int]]]:
    """The example state for tracing the step, and the dims of each state tensor that grow with the steps.

    A state that keeps its shape is traced as it starts. One that grows (a key/value cache (N, H, t, d_k)) starts
    with t = 0, a size torch.export would fix: it is traced after EXAMPLE_ROWS steps, its t declared dynamic."""
    words = torch.full((a.shape[0],), Vocabulary.start_id, dtype=torch.long)
    later = state
    for _ in range(EXAMPLE_ROWS):
        later = model.decoder.step(words, later, a, keys, None)[1]
    start, end = flatten_state(state)[0], flatten_state(later)[0]
    growing = [[d for d in range(1, x.dim()) if x.shape[d] != y.shape[d]] for x, y in zip(start, end)]
    return (later if any(growing) else state), growing


def _write(backend: str, module: torch.nn.Module, args: tuple[torch.Tensor, ...], path: Path, name: str,
           names: dict[str, list[str]], growing: list[list[int]], optimize: bool = True) -> None:
    """One graph: torch.onnx's dynamo exporter, or torch.jit.trace (whose sizes read from tensors stay dynamic).

    Their chatter is silenced: progress lines, the warning that every input's row dim shares one name, TorchScript's
    deprecation notice and the tracer's warnings about values it fixed (`verify` tests the graph at other sizes)."""
    with traceable(module), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.filterwarnings("ignore", message=r".*axis name")
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.\w+` is deprecated")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        if backend == "torchscript":
            traced = torch.jit.trace(module, args, check_trace=False)
            with atomic_file(path) as f:  # its own file error, not the zip writer's RuntimeError
                torch.jit.save(traced, f)
            return
        torch.onnx.export(module, args, str(path), dynamo=True, input_names=names["inputs"],
                          output_names=names["outputs"], dynamic_shapes=_dynamic(name, growing),
                          external_data=False, verbose=False, optimize=optimize)


def _graphs(model: Captioner, images: torch.Tensor) -> tuple[dict[str, Any], dict[str, Any]]:
    """The three graph modules with their example inputs, and what the manifest says about their shapes."""
    with traceable(model):
        a, grid = model.encode(images)  # (B, L, D)
        keys = model.decoder.attention.prepare(a, grid)
        state = model.decoder.init_state(a, None)
        example, growing = _grown(model, state, a, keys)
    leaves, tree = flatten_state(state)
    words = torch.full((a.shape[0],), Vocabulary.start_id, dtype=torch.long)
    modules = {"encoder": (EncoderGraph(model).eval(), (images,)),
               "init": (InitGraph(model, grid).eval(), (a,)),
               "step": (StepGraph(model, state).eval(), (words, a, keys, *flatten_state(example)[0]))}
    shapes = {"grid": list(grid), "annotation_dim": int(a.shape[2]), "keys_shape": list(keys.shape[1:]),
              "state": {"count": len(leaves), "tree": tree, "shapes": [list(x.shape[1:]) for x in leaves]},
              "growing": growing}
    return modules, shapes


def _compare(name: str, got: list[np.ndarray], want: tuple[torch.Tensor, ...]) -> None:
    """Refuse a graph whose outputs differ from the model's beyond float rounding."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        w_np = w.numpy()
        if g.shape != w_np.shape:
            raise ValueError(f"the exported {name} graph gives output {i} of shape {g.shape}, the model "
                             f"{w_np.shape}: this model cannot be exported to this format")
        scale = max(1.0, float(np.abs(w_np).max()) if w_np.size else 0.0)
        diff = float(np.abs(g.astype(np.float64) - w_np).max()) if w_np.size else 0.0
        if not diff <= TOLERANCE * scale:
            raise ValueError(f"the exported {name} graph differs from the model (output {i}: max |difference| "
                             f"{diff:.3g}): this model cannot be exported to this format")


def verify(folder: Path, model: Captioner, input_size: tuple[int, int]) -> None:
    """Read the folder back as the runner does; compare each graph with the model on the same inputs at CHECK_ROWS."""
    runner, gen = Runner(folder), torch.Generator().manual_seed(1)
    for rows in CHECK_ROWS:
        modules, _ = _graphs(model, torch.randn(rows, 3, *input_size, generator=gen))
        words = torch.randint(0, len(runner.vocab), (rows,), generator=gen)
        modules["step"] = (modules["step"][0], (words, *modules["step"][1][1:]))
        with traceable(model):
            want = {name: module(*args) for name, (module, args) in modules.items()}
        inputs = {name: [x.numpy() for x in args] for name, (_, args) in modules.items()}
        _compare("encoder", [runner.encode(*inputs["encoder"])], (want["encoder"],))
        keys, state = runner.init(*inputs["init"])
        _compare("init", [keys, *state], want["init"])
        words_np, a_np, keys_np, *state_np = inputs["step"]
        logits, alpha, new = runner.step(words_np, a_np, keys_np, state_np)
        _compare("step", [logits, alpha, *new], want["step"])


def input_size(model: Captioner, image_size: int | None) -> tuple[list[dict[str, Any]], tuple[int, int]]:
    """The encoder's preprocessing steps and the (H, W) of the images its graph takes; ValueError if it cannot say."""
    reason = refusal(model)
    if reason:
        raise ValueError(f"cannot export this model: {reason}")
    steps = preprocess_steps(model.encoder.transform())
    check_steps(steps)
    size = fixed_size(steps) or ((image_size, image_size) if image_size else None)
    if size is None:
        raise ValueError("the encoder takes images at their own size (it does not resize them): give the size it "
                         "was trained on with --image-size N")
    return steps, size


def _write_all(model: Captioner, vocab: Vocabulary, folder: Path, backend: str, image_size: int | None,
               info: dict[str, Any], optimize: bool) -> list[str]:
    """Write the three graphs and the manifest into `folder` and check them; returns the file names (manifest last)."""
    steps, size = input_size(model, image_size)
    modules, shapes = _graphs(model, torch.randn(EXAMPLE_ROWS, 3, *size, generator=torch.Generator().manual_seed(0)))
    growing = shapes.pop("growing")
    names = graph_names(shapes["state"]["count"])
    files = {name: f"{name}{SUFFIX[backend]}" for name in names}
    for name, (module, args) in modules.items():
        try:
            _write(backend, module, args, folder / files[name], name, names[name], growing, optimize)
        except ImportError as err:
            raise ValueError(f"exporting to {backend} needs {err.name or 'a missing package'}: pip install onnx "
                             "onnxscript onnxruntime (the project's 'export' extra)") from err
        except Exception as err:  # the exporters raise many types; all but a file's error mean "it does not export"
            if (cause := _os_error(err)) is not None:
                raise write_error(folder / files[name], cause) from err
            raise ValueError(f"cannot export the {name} graph of this model to {backend} ({_one_line(err)})") from err
    manifest = Manifest(backend=backend, graphs={name: {"file": files[name], **names[name]} for name in names},
                        vocab=vocab.to_list(), preprocess={"steps": steps, "input_size": list(size)},
                        model=info.get("model") or {}, source=info.get("source") or {}, **shapes)
    write_manifest(folder, manifest)
    verify(folder, model, size)
    return [*files.values(), MANIFEST]


def export_model(model: Captioner, vocab: Vocabulary, out: str | os.PathLike, backend: str = "onnx",
                 image_size: int | None = None, model_config: dict[str, Any] | None = None,
                 source: dict[str, Any] | None = None, optimize: bool = True) -> list[Path]:
    """Write the model's three graphs and `captioning.json` into `out`; returns the files written (manifest last).

    `image_size` is the (square) size of the images for an encoder whose transform() does not fix one (SmallCNN
    without image_size); it is ignored otherwise. `optimize`: run the ONNX exporter's graph optimizer (off: a faster
    export of a graph ONNX Runtime optimizes when it loads it anyway). Everything is written and checked in a
    staging folder inside `out` first, then moved in (the manifest last), so a failed export leaves no half-written
    export behind. Raises ValueError (one line) for a model that cannot be exported.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown export format {backend!r}; choose one of {', '.join(BACKENDS)}")
    if isinstance(model, Ensemble):
        raise ValueError("an ensemble cannot be exported (ONNX or TorchScript): its graphs hold one model; export "
                         "each checkpoint alone")
    was_training = model.training
    model.eval()  # dropout off, hard attention in its test mode: the model's captions
    try:
        input_size(model, image_size)  # refuse before anything is written
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
        info = {"model": model_config, "source": {"captioning": captioning.__version__, "torch": torch.__version__,
                                                  **(source or {})}}
        try:
            names = _write_all(model, vocab, stage, backend, image_size, info, optimize)
            (out / MANIFEST).unlink(missing_ok=True)  # an older export's manifest never describes the new graphs
            for name in names:
                try:
                    os.replace(stage / name, out / name)
                except OSError as err:
                    raise write_error(out / name, err) from err
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    finally:
        model.train(was_training)
    return [out / name for name in names]


def export_checkpoint(checkpoint: str | os.PathLike, out: str | os.PathLike, backend: str = "onnx",
                      image_size: int | None = None, hard_test_mode: str | None = None,
                      optimize: bool = True) -> list[Path]:
    """Export a checkpoint (see `export_model`); the image size defaults to its data set's generated image size.

    `hard_test_mode` (expectation or argmax) replaces a hard attention's test mode in the export.
    """
    model, vocab, ckpt = load_model(checkpoint)
    config = ckpt.get("config") or {}
    model_cfg = copy.deepcopy(config.get("model") or {})
    if hard_test_mode is not None:
        attention = core_of(model.decoder.attention)
        if not isinstance(attention, HardAttention):
            raise ValueError(f"--hard-test-mode applies to hard attention only; this model has "
                             f"{type(attention).__name__}")
        attention.test_mode = hard_test_mode  # type: ignore[assignment]  # the CLI offers the valid choices only
        model_cfg.setdefault("attention", {})["test_mode"] = hard_test_mode
    generate = (config.get("dataset") or {}).get("generate") or {}
    if image_size is None and isinstance(generate.get("image_size"), int):
        image_size = generate["image_size"]  # the built-in data set's images: what the model was trained on
    return export_model(model, vocab, out, backend, image_size, model_cfg, {"checkpoint": Path(checkpoint).name},
                        optimize)
