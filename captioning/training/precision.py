"""Mixed-precision training (trainer.precision): the autocast dtype, float32 losses and the fp16 loss-scaled step.

fp32 runs as plain float32; bf16 autocasts the forward pass to bfloat16 (CPU or a GPU that supports it) and needs
no loss scaling, since bfloat16 has float32's range; fp16 autocasts to float16 on CUDA only and scales the loss
with a `torch.amp.GradScaler`, whose state the trainer keeps in its checkpoints. Losses are always computed in
float32 from the model's outputs (`to_float32`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from captioning.training import schedule

# trainer.precision -> the autocast dtype of the forward pass (None: plain float32, no autocast).
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `trainer.precision` on `device`; a clear error where it cannot run."""
    if precision not in PRECISIONS:
        raise ValueError(f"trainer.precision={precision!r} is not known; choose one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and device.type != "cuda":
        raise ValueError(f"trainer.precision=fp16 needs a CUDA device (float16 autocast with loss scaling), "
                         f"but training runs on {device}; use trainer.precision=bf16 or fp32 there")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"trainer.precision=bf16: this GPU ({torch.cuda.get_device_name(device)}) has no bfloat16 "
                         "support; use trainer.precision=fp16")
    return PRECISIONS[precision]


def autocast(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager:
    """Autocast to `dtype` on `device`'s type for the forward pass; no autocast at all when dtype is None (fp32)."""
    return torch.autocast(device.type, dtype=dtype) if dtype else nullcontext()


def grad_scaler(dtype: torch.dtype | None, device: torch.device) -> torch.amp.GradScaler | None:
    """A loss scaler for float16 autocast, None otherwise (fp16's range is small; bf16 has float32's)."""
    return torch.amp.GradScaler(device.type) if dtype == torch.float16 else None


def to_float32(x: torch.Tensor | None) -> torch.Tensor | None:
    """Model outputs in float32 for the loss (a no-op in fp32), so log-softmax and sums never run in 16 bits."""
    return None if x is None else x.float()


def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether every floating-point tensor holds finite numbers only (e.g. a model's weights and buffers)."""
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


def optimizer_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None,
                   parameters: Iterable[torch.nn.Parameter], grad_clip: float | None,
                   loss_finite: bool = True, scheduler: Any = None) -> str | None:
    """Backward (DDP averages gradients over the ranks here), clipping to `grad_clip` (if set) and one step of
    `optimizer`; with a scaler (fp16) the loss is scaled and the step skipped when the gradients overflowed.

    A step whose loss (`loss_finite`, decided by the caller for every rank) or, without a scaler, gradient norm is
    not finite is skipped: the gradients are dropped and the optimizer (its moments and step counts) and the scaler
    are left as they were; the return value says which ("loss" or "gradient norm"), None when the step was taken.
    With a scaler an overflowing gradient is the scaler's business (it skips the step and lowers its scale), not a
    skipped step here. Backward always runs, so that under DDP every rank takes part in its gradient all-reduce.
    A per-step learning-rate schedule (warm-up) steps after each step taken.
    """
    optimizer.zero_grad(set_to_none=True)
    (loss if scaler is None else scaler.scale(loss)).backward()
    if not loss_finite:
        optimizer.zero_grad(set_to_none=True)
        return "loss"
    if scaler is not None:
        scaler.unscale_(optimizer)  # clip the true gradients
    if grad_clip or scaler is None:  # the total norm also without clipping: max_norm=inf scales by exactly 1
        norm = torch.nn.utils.clip_grad_norm_(parameters, grad_clip or math.inf)
        if scaler is None and not torch.isfinite(norm):
            optimizer.zero_grad(set_to_none=True)
            return "gradient norm"
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)  # skipped when the scaled gradients overflowed
        scaler.update()
    schedule.after_optimizer_step(scheduler)
    return None
