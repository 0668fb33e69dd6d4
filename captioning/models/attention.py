"""Attention over annotation vectors: the decoder state h_{t-1} picks a context z_t from a_1..a_L.

Every attention module has the same interface so that Hydra can swap them:
    keys = attn.prepare(a, grid)                # once per image; grid = (h, w) with L = h * w
    out = attn(a, keys, h, mask, prev_alpha)    # once per step -> out.context (N, D), out.alpha (N, L)

h (N, n) may hold k consecutive rows per image of a (B, L, D), keys and mask (N = B k, row r is image r // k):
beam search attends from the k beams of an image, and training from the k captions of an image, without copying
a, keys or mask k times. With k = 1 (one row per image) this is the plain per-row attention.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from captioning.base.constraints import Range, constrained

TestMode = Literal["expectation", "argmax", "sample"]  # hard attention at test time


@dataclass
class AttentionOutput:
    """One attention step: the context z_t and the weights alpha_t (plus sampling terms for hard attention)."""

    context: torch.Tensor  # (N, D)
    alpha: torch.Tensor  # (N, L), sums to 1 over unmasked regions
    log_prob: torch.Tensor | None = None  # (N,) log p(s_t | a) of a sampled region
    entropy: torch.Tensor | None = None  # (N,) H(alpha_t)
    index: torch.Tensor | None = None  # (N,) the sampled / chosen region

    def select(self, rows: torch.Tensor) -> AttentionOutput:
        """The outputs of these rows (n,) only."""
        pick = [None if x is None else x.index_select(0, rows)
                for x in (self.context, self.alpha, self.log_prob, self.entropy, self.index)]
        return AttentionOutput(*pick)  # type: ignore[arg-type]


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over regions (last dim) that gives padded regions (mask False) exactly zero weight."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


def rows_per_image(images: int, rows: int) -> int:
    """k such that `rows` = images * k query rows hold k consecutive rows per image."""
    if images == 0:
        return 1
    if rows % images:
        raise ValueError(f"attention got {rows} query rows for {images} images; rows must be a multiple of images")
    return rows // images


def row_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """alpha (N, L) from scores (N, L) and a mask per row (N, L) or per image (B, L), k = N / B rows each."""
    if mask is None or mask.shape[0] == scores.shape[0]:
        return masked_softmax(scores, mask)
    B, L = mask.shape
    return masked_softmax(scores.view(B, -1, L), mask.unsqueeze(1)).view(-1, L)  # (B, k, L) -> (N, L)


def attend(a: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor | None) -> AttentionOutput:
    """alpha = masked softmax of the scores (N, L); context z = sum_i alpha_i a_i (N, D) for a (B, L, D)."""
    alpha = row_softmax(scores, mask)  # (N, L)
    B, L, D = a.shape
    context = torch.bmm(alpha.view(B, -1, L), a)  # (B, k, L) @ (B, L, D) -> (B, k, D)
    return AttentionOutput(context.view(-1, D), alpha)  # (N, D)


_CHUNK_ELEMENTS = 1 << 19  # (rows, L, A) chunks of 2 MiB in float32: the hidden layer stays in a core's L2 cache
DevicePath = Literal["cpu", "generic"]
_FORCED_PATH: DevicePath | None = None  # set by `device_path`


@contextmanager
def device_path(path: DevicePath) -> Iterator[None]:
    """Run the code written per kind of device as on a CPU ("cpu") or as on a GPU ("generic"), whatever device the
    tensors are on. CI has no GPU: with this the tests run the path a GPU user runs, on the CPU, and compare it with
    the CPU's (tests/models/test_fast_path.py)."""
    global _FORCED_PATH
    before, _FORCED_PATH = _FORCED_PATH, path
    try:
        yield
    finally:
        _FORCED_PATH = before


def cpu_path(x: torch.Tensor) -> bool:
    """Whether x's device takes the CPU-tuned code (cache-sized chunks, tanh as a sigmoid) or the generic one."""
    return x.device.type == "cpu" if _FORCED_PATH is None else _FORCED_PATH == "cpu"


def _chunk(keys: torch.Tensor, k: int) -> int:
    """Images per chunk of the (B, k, L, A) hidden layer: a cache-sized piece on a CPU, everything on a GPU."""
    B, L, A = keys.shape
    return max(1, _CHUNK_ELEMENTS // (k * L * A)) if cpu_path(keys) else B


def tanh_(x: torch.Tensor) -> torch.Tensor:
    """tanh in place as 2 sigmoid(2x) - 1: the same function within float rounding (absolute error < 2e-7), and on
    a CPU 4-5x faster than torch's own tanh, whose vectorised kernel is far slower than its sigmoid (both measured
    in experiments/README.md, "Decoder benchmark"). On a GPU, where tanh is as cheap as any element-wise op,
    torch's tanh is kept."""
    if not cpu_path(x):
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
    """e_ti = w^T tanh(keys_i + q_t) + b: (N, L) for keys (B, L, A) and queries q (N, A), k = N / B per image."""
    B, L, A = keys.shape
    q = q.view(B, -1, A)  # (N, A) -> (B, k, A)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (keys, q, w, b)):
        return _AdditiveScore.apply(keys, q, w, b).view(-1, L)  # (B, k, L) -> (N, L)
    return _scores(keys, q, w, b)[0].view(-1, L)  # (N, L)


class Attention(nn.Module):
    """Base class: subclasses implement `prepare` (per image) and `forward` (per step)."""

    def __init__(self, annotation_dim: int, hidden_dim: int):
        super().__init__()
        self.annotation_dim, self.hidden_dim = annotation_dim, hidden_dim

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """Per-image work that does not depend on the step (e.g. W_a a_i): one tensor whose first dim is the image.

        `grid` is the (h, w) layout of the L = h * w regions (row-major); images with smaller grids are
        padded to it and their padded regions masked out.
        """
        return a

    def begin_batch(self) -> None:
        """Called by the trainer before each training minibatch (hard attention tosses its coin here)."""

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        raise NotImplementedError


class SoftAttention(Attention):
    """The paper's deterministic attention: e_ti = w^T tanh(W_a a_i + W_h h_{t-1} + b), z_t = sum_i alpha_ti a_i."""

    @constrained
    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: Annotated[int, Range(ge=1)] = 512):
        super().__init__(annotation_dim, hidden_dim)
        self.W_a = nn.Linear(annotation_dim, attention_dim)  # carries the bias b
        self.W_h = nn.Linear(hidden_dim, attention_dim, bias=False)
        self.w = nn.Linear(attention_dim, 1)

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        return self.W_a(a)  # (B, L, A): computed once per image, not once per step

    def scores(self, keys: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Unnormalised e_t (N, L) from keys (B, L, A) and h (N, n)."""
        return additive_scores(keys, self.W_h(h), self.w.weight.view(-1), self.w.bias)  # (N, L)

    def forward(self, a, keys, h, mask=None, prev_alpha=None) -> AttentionOutput:
        return attend(a, self.scores(keys, h), mask)


class HardAttention(SoftAttention):
    """The paper's stochastic attention: s_t ~ Multinomial(alpha_t), z_t = a_{s_t}; trained with REINFORCE.

    In training, each minibatch (see `begin_batch`) uses the expected context (the soft step) with probability
    `expected_context_prob`, else samples one region per step and reports log p(s_t | a) and H(alpha_t) for
    the REINFORCE terms in `captioning.losses`. At test time `test_mode` picks the context: the expectation
    (deterministic, the default), the argmax region, or a sampled region.
    """

    TEST_MODES: tuple[str, ...] = typing.get_args(TestMode)

    @constrained
    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: Annotated[int, Range(ge=1)] = 512,
                 expected_context_prob: Annotated[float, Range(ge=0, le=1)] = 0.5, test_mode: TestMode = "expectation"):
        super().__init__(annotation_dim, hidden_dim, attention_dim)
        self.expected_context_prob, self.test_mode = expected_context_prob, test_mode
        self.sample_this_batch = True

    def begin_batch(self) -> None:
        """Toss the per-minibatch coin: sample regions, or use the expected context for this batch."""
        self.sample_this_batch = bool(torch.rand(()) >= self.expected_context_prob)

    def forward(self, a, keys, h, mask=None, prev_alpha=None) -> AttentionOutput:
        mode = ("sample" if self.sample_this_batch else "expectation") if self.training else self.test_mode
        if mode == "expectation":
            return attend(a, self.scores(keys, h), mask)  # (N, D)
        alpha = row_softmax(self.scores(keys, h), mask)  # (N, L)
        if mode == "argmax":
            index = alpha.argmax(dim=1)  # (N,)
        else:
            index = torch.multinomial(alpha.detach(), 1).squeeze(1)  # (N,): the same draws as one row per image
        rows = torch.arange(alpha.shape[0], device=a.device)  # (N,)
        context = a[rows // rows_per_image(a.shape[0], alpha.shape[0]), index]  # (N, D): one region's annotation
        log_prob = torch.log(alpha.gather(1, index.unsqueeze(1)).squeeze(1))  # (N,)
        entropy = -torch.special.xlogy(alpha, alpha).sum(dim=1)  # (N,), masked regions add 0
        return AttentionOutput(context, alpha, log_prob, entropy, index)
