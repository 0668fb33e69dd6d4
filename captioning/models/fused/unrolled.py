"""Recurrences unrolled over teacher-forced steps, with each weight's gradient one GEMM over all steps.

`UnrolledLSTM` computes what an `nn.LSTMCell` computes step by step, and `UnrolledLinear` what a linear layer inside
a recurrence computes (Luong's W_c with input feeding). Step t may run fewer rows than step t - 1 (captions that
have ended drop out, `captioning.models.packing`): the tapes keep each step's rows, however many. The decoders'
packed teacher forcing (`captioning.models.decoders.unroll`) runs them; tests/models/test_decoders.py checks they
compute what the cells compute.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from captioning.models.fused.dtypes import matmul_dtype


class _Tape:
    """What the T steps of one unrolled map share: its weights (cast once to the compute dtype), and per step the
    inputs and the output gradient dy_t, so that weight gradients are one GEMM over all steps in step 0's backward.

    Step t's output feeds step t + 1 (a recurrence), so step 0's backward runs after every other step's.
    The tape holds detached tensors only: every step's autograd node holds the tape, so a tape that held a
    tensor of the graph would close a reference cycle (node -> tape -> tensor -> grad_fn -> node) that only
    Python's cycle collector frees, and every training step's activations would pile up until it runs.
    """

    def __init__(self, weights: tuple[torch.Tensor, ...], steps: int):
        self.params, self.steps = weights, steps
        self.cast: dict[torch.dtype, tuple[torch.Tensor, ...]] = {}
        self.xs: list[tuple[torch.Tensor, ...]] = [()] * steps
        self.dys: list[torch.Tensor | None] = [None] * steps

    def weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """The weights, detached, in `dtype` (a cast under autocast happens once per forward, not once per step)."""
        if dtype not in self.cast:
            self.cast[dtype] = tuple(w.detach().to(dtype) for w in self.params)
        return self.cast[dtype]

    def gathered(self, dtype: torch.dtype) -> tuple[list[int], torch.Tensor, list[torch.Tensor]]:
        """Steps whose gradient arrived, their dy stacked (S, out) and each input stacked (S, in_j), S rows in all."""
        done = [t for t, dy in enumerate(self.dys) if dy is not None]
        dy_all = torch.cat([dy for dy in self.dys if dy is not None])  # (S, out)
        xs = [torch.cat([self.xs[t][j].to(dtype) for t in done]) for j in range(len(self.xs[done[0]]))]
        self.dys = [None] * self.steps  # a second backward (retain_graph) starts afresh
        return done, dy_all, xs


class _LSTMTape(_Tape):
    """A tape for `_LSTMGates`, with the embedded words of every step, step-major (sum_t n_t, m), and their part
    of the gates, per step."""

    def __init__(self, cell: nn.LSTMCell, emb: torch.Tensor, counts: list[int]):
        super().__init__((cell.weight_ih, cell.weight_hh), len(counts))
        self.m, self.emb, self.counts = emb.shape[-1], emb.detach(), counts
        with torch.no_grad():  # gradients of this GEMM come from _LSTMGates' step 0
            bias = cell.bias_ih + cell.bias_hh  # (4n,)
            words = F.linear(emb, cell.weight_ih[:, : self.m], bias)  # (sum_t n_t, 4n)
        self.words = words.split(counts)  # T x (n_t, 4n)

    def rows(self, steps: list[int]) -> list[slice]:
        """Where each of these steps' rows lie in the step-major packing."""
        starts = [0]
        for n in self.counts:
            starts.append(starts[-1] + n)
        return [slice(starts[t], starts[t + 1]) for t in steps]


class _UnrolledLinear(torch.autograd.Function):
    """y_t = x_t W^T for step t of a recurrence; step 0's backward computes dW = sum_t dy_t^T x_t in one GEMM."""

    @staticmethod
    def forward(ctx, x, tape, t, weight):
        ctx.tape, ctx.t = tape, t
        x = x.to(matmul_dtype(x))
        tape.xs[t] = (x.detach(),)  # detached: the tape must not reach back into the graph (a leaking cycle)
        return torch.mm(x, tape.weights(x.dtype)[0].t())  # (N, in) @ (in, out)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        tape, t = ctx.tape, ctx.t
        tape.dys[t] = dy
        dx = torch.mm(dy, tape.weights(dy.dtype)[0]) if ctx.needs_input_grad[0] else None  # (N, in)
        dw = None
        if t == 0 and ctx.needs_input_grad[3]:
            _, dy_all, (x_all,) = tape.gathered(dy.dtype)
            dw = torch.mm(dy_all.t(), x_all)  # (out, S) @ (S, in)
        return dx, None, None, dw


class UnrolledLinear:
    """x_t -> x_t W^T over the T steps of a recurrence, its weight gradient one GEMM (see `_UnrolledLinear`)."""

    def __init__(self, weight: torch.Tensor, steps: int):
        self.weight, self.tape = weight, _Tape((weight,), steps)

    def __call__(self, t: int, x: torch.Tensor) -> torch.Tensor:
        """Step t: (N, in) -> (N, out)."""
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return _UnrolledLinear.apply(x, self.tape, t, self.weight)
        x = x.to(matmul_dtype(x))
        return torch.mm(x, self.tape.weights(x.dtype)[0].t())


class _LSTMGates(torch.autograd.Function):
    """LSTM gates of step t: W_ih [E y_{t-1}; x_t] + b_ih + W_hh h_{t-1} + b_hh, the word part precomputed.

    Every step takes the cell's parameters and the embedded words, so autograd links them, but only step 0's
    backward (the last to run) returns their gradients, each one GEMM over all steps.
    """

    @staticmethod
    def gates(tape: _LSTMTape, t: int, x: torch.Tensor | None, h: torch.Tensor) -> torch.Tensor:
        """The gates (N, 4n) of step t: precomputed word part + h W_hh^T (+ x W_ih[:, m:]^T)."""
        dtype = matmul_dtype(h)
        w_ih, w_hh = tape.weights(dtype)
        gates = tape.words[t].to(dtype).addmm(h.to(dtype), w_hh.t())  # (N, 4n)
        return gates if x is None else gates.addmm_(x.to(dtype), w_ih[:, tape.m:].t())

    @staticmethod
    def forward(ctx, x, h, tape, t, emb, w_ih, w_hh, b_ih, b_hh):
        ctx.tape, ctx.t, ctx.has_x = tape, t, x is not None
        tape.xs[t] = (h.detach(),) if x is None else (x.detach(), h.detach())  # no graph cycle (see _Tape)
        return _LSTMGates.gates(tape, t, x, h)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):  # dy (N, 4n)
        tape, t, need = ctx.tape, ctx.t, ctx.needs_input_grad
        tape.dys[t] = dy
        w_ih, w_hh = tape.weights(dy.dtype)
        dx = torch.mm(dy, w_ih[:, tape.m:]) if ctx.has_x and need[0] else None  # (N, K)
        dh = torch.mm(dy, w_hh) if need[1] else None  # (N, n)
        if t > 0:
            return dx, dh, None, None, None, None, None, None, None
        done, dy_all, xs = tape.gathered(dy.dtype)  # (S, 4n), [(S, K),] (S, n): S rows of the steps with a gradient
        m, every = tape.m, len(done) == tape.steps
        parts = None if every else tape.rows(done)
        emb = (tape.emb if parts is None else torch.cat([tape.emb[p] for p in parts])).to(dy.dtype)  # (S, m)
        d_emb = None
        if need[4]:
            d_emb = torch.mm(dy_all, w_ih[:, :m])  # (S, m)
            if parts is not None:  # steps whose gates got no gradient pass none to their words
                full = d_emb.new_zeros(tape.emb.shape)  # (sum_t n_t, m)
                for p, d in zip(parts, d_emb.split([p.stop - p.start for p in parts])):
                    full[p] = d
                d_emb = full
        inputs = torch.cat([emb, xs[0]], dim=1) if ctx.has_x else emb  # (S, m + K)
        d_ih = torch.mm(dy_all.t(), inputs) if need[5] else None  # (4n, S) @ (S, m + K)
        d_hh = torch.mm(dy_all.t(), xs[-1]) if need[6] else None  # (4n, S) @ (S, n)
        db = dy_all.sum(0) if need[7] or need[8] else None  # (4n,)
        return dx, dh, None, None, d_emb, d_ih, d_hh, db, None if db is None else db.clone()


class UnrolledLSTM:
    """An `nn.LSTMCell` unrolled over T teacher-forced steps; computes what the cell computes, with fewer GEMMs.

    The cell's input is [E y_{t-1}; x_t]: the word part W_ih[:, :m] E y_{t-1} (+ both biases) of every step is one
    GEMM up front; per step two GEMMs remain (x_t and h_{t-1}); the weight gradients are one GEMM each over all
    steps (`_LSTMGates`). Gates in nn.LSTMCell's order i, f, g, o.
    """

    def __init__(self, cell: nn.LSTMCell, emb: torch.Tensor, counts: list[int]):
        """emb (sum_t n_t, m): the embedded words of every step, step-major, counts[t] = n_t rows at step t."""
        if cell.bias_ih is None:
            raise ValueError("UnrolledLSTM needs an nn.LSTMCell with biases")
        if sum(counts) != emb.shape[0]:
            raise ValueError(f"the steps' rows ({sum(counts)}) must be the embedded words' ({emb.shape[0]})")
        self.cell, self.emb, self.tape = cell, emb, _LSTMTape(cell, emb, counts)

    def __call__(self, t: int, x: torch.Tensor | None, h: torch.Tensor,
                 c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step t from the rest of the input x_t (N, K) (None: words only) and the state (h, c) (N, n)."""
        cell = self.cell
        args = (self.tape, t, self.emb, cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
        if torch.is_grad_enabled() and any(v is not None and v.requires_grad for v in (x, h, *args[2:])):
            gates = _LSTMGates.apply(x, h, *args)
        else:
            gates = _LSTMGates.gates(self.tape, t, x, h)  # (N, 4n)
        i, f, g, o = gates.chunk(4, dim=1)  # 4 x (N, n)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c
