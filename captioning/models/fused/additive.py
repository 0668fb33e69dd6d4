"""The additive attention score e = w^T tanh(keys + q) + b, hand-fused for a CPU: cache-sized chunks, tanh as a
sigmoid, and a backward that recomputes the hidden layer rather than storing it.

`captioning.models.attention.additive_scores` calls it for CPU tensors unless the model runs its plain kernels
(`captioning.models.fused.plain_kernels`); on any other device the model's plain formula runs.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

_CHUNK_ELEMENTS = 1 << 19  # (rows, L, A) chunks of 2 MiB in float32: the hidden layer stays in a core's L2 cache


def _chunk(keys: torch.Tensor, k: int) -> int:
    """Images per chunk of the (B, k, L, A) hidden layer: a cache-sized piece on a CPU, everything on a GPU."""
    B, L, A = keys.shape
    return max(1, _CHUNK_ELEMENTS // (k * L * A)) if keys.device.type == "cpu" else B


def tanh_(x: torch.Tensor) -> torch.Tensor:
    """tanh in place as 2 sigmoid(2x) - 1: the same function within float rounding (absolute error < 2e-7), and on
    a CPU 4-5x faster than torch's own tanh, whose vectorised kernel is far slower than its sigmoid (both measured
    in experiments/README.md, "Decoder benchmark"). On a GPU, where tanh is as cheap as any element-wise op,
    torch's tanh is kept."""
    if x.device.type != "cpu":
        return x.tanh_()
    return x.mul_(2.0).sigmoid_().mul_(2.0).sub_(1.0)


def _hidden(keys: torch.Tensor, q: torch.Tensor, i: int, j: int, buf: torch.Tensor) -> torch.Tensor:
    """s = tanh(keys_i + q) for images i..j-1, written into buf: (j - i, k, L, A)."""
    s = buf[: j - i]
    return tanh_(torch.add(keys[i:j].unsqueeze(1), q[i:j].unsqueeze(2), out=s))  # (b, k, L, A)


class _AdditiveScore(torch.autograd.Function):
    """e = w^T tanh(keys_i + q) + b for k queries per image, a few images at a time in one reused buffer.

    A hidden layer (B, k, L, A) larger than one chunk is not stored: the backward recomputes it chunk by chunk (an
    add and a tanh), which on a CPU costs less than writing it to fresh memory and reading it back, and saves
    B k L A floats a step. One that fits in a chunk is kept (recomputing it would cost more than keeping it).
    """

    @staticmethod
    def forward(ctx, keys, q, w, b):  # keys (B, L, A), q (B, k, A), w (A,), b (1,) or None
        e, hidden = _scores(keys, q, w, b)
        ctx.save_for_backward(keys, q, w, hidden)
        ctx.has_bias = b is not None
        return e

    @staticmethod
    @once_differentiable
    def backward(ctx, de):  # de (B, k, L)
        keys, q, w, hidden = ctx.saved_tensors
        (B, L, A), k, need = keys.shape, q.shape[1], ctx.needs_input_grad
        dtype = torch.result_type(keys, q)
        de, w_ = de.to(dtype), w.to(dtype)
        dkeys = keys.new_empty((B, L, A), dtype=dtype) if need[0] else None
        dq = q.new_empty((B, k, A), dtype=dtype) if need[1] else None
        dw = keys.new_zeros((A, 1), dtype=dtype)
        per = _chunk(keys, k)
        buf = keys.new_empty((min(per, B), k, L, A), dtype=dtype) if hidden.numel() == 0 else hidden
        grad = buf if k == 1 and dkeys is not None else torch.empty_like(buf)  # unused for k = 1
        for i in range(0, B, per):
            j = min(B, i + per)
            s = hidden if hidden.numel() else _hidden(keys, q, i, j, buf)  # (b, k, L, A)
            de_c = de[i:j]  # (b, k, L)
            # with one query per image, d keys is d s itself: written in place, no copy
            g = dkeys[i:j].unsqueeze(1) if k == 1 and dkeys is not None else grad[: j - i]  # (b, k, L, A)
            dw.addmm_(s.view(-1, A).t(), de_c.reshape(-1, 1))  # (A, b k L) @ (b k L, 1)
            torch.mul(de_c.unsqueeze(-1), w_, out=g)  # d e / d s
            torch.ops.aten.tanh_backward.grad_input(g, s, grad_input=g)  # in place: g * (1 - s^2)
            if k > 1 and dkeys is not None:
                torch.sum(g, 1, out=dkeys[i:j])  # (b, L, A)
            if dq is not None:
                torch.sum(g, 2, out=dq[i:j])  # (b, k, A)
        db = de.sum().view(1) if ctx.has_bias and need[3] else None
        return dkeys, dq, dw.view(A) if need[2] else None, db


def _scores(keys: torch.Tensor, q: torch.Tensor, w: torch.Tensor,
            b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """e (B, k, L) = w^T tanh(keys + q) + b chunk by chunk without autograd, and the hidden layer tanh(keys + q)
    (B, k, L, A) when it fits in one chunk (else an empty tensor)."""
    (B, L, A), k = keys.shape, q.shape[1]
    dtype = torch.result_type(keys, q)
    per = _chunk(keys, k)
    w = w.to(dtype).view(A, 1)
    if per >= B:  # one chunk (a GPU, an exported graph, a small batch): no loop over images, whose count tracing
        hidden = tanh_(torch.add(keys.unsqueeze(1), q.unsqueeze(2)))  # would fix; (B, k, L, A)
        e = torch.mm(hidden.view(-1, A), w).view(B, k, L)
        return (e if b is None else e.add_(b.to(dtype))), hidden
    buf = keys.new_empty((per, k, L, A), dtype=dtype)
    e = keys.new_empty((B, k, L), dtype=dtype)
    for i in range(0, B, per):
        j = min(B, i + per)
        e[i:j] = torch.mm(_hidden(keys, q, i, j, buf).view(-1, A), w).view(j - i, k, L)  # (b k L, A) @ (A, 1)
    return (e if b is None else e.add_(b.to(dtype))), buf.new_empty(0)


def additive_scores(keys: torch.Tensor, q: torch.Tensor, w: torch.Tensor,
                    b: torch.Tensor | None = None) -> torch.Tensor:
    """`captioning.models.attention.additive_scores` (e_ti = w^T tanh(keys_i + q_t) + b, (N, L)) in cache-sized
    chunks, with a backward that recomputes the hidden layer instead of storing it."""
    B, L, A = keys.shape
    q = q.view(B, -1, A)  # (N, A) -> (B, k, A)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (keys, q, w, b)):
        return _AdditiveScore.apply(keys, q, w, b).view(-1, L)  # (B, k, L) -> (N, L)
    return _scores(keys, q, w, b)[0].view(-1, L)  # (N, L)
