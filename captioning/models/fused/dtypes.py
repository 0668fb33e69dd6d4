"""The dtype custom kernels compute in: autocast's where it is on (custom autograd code is not cast for us)."""

from __future__ import annotations

import torch


def matmul_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a matmul on x runs in: autocast's where it is on (custom autograd code is not cast for us)."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def autocast_input(x: torch.Tensor) -> torch.Tensor:
    """x in autocast's matmul dtype (unchanged where autocast is off or x is not floating point): cast once for all
    steps, where autocast would cast the float32 annotations a (B, L, D) again at every step's context bmm."""
    dtype = matmul_dtype(x)
    return x.to(dtype) if x.is_floating_point() and dtype != x.dtype else x

