"""The paper's LSTM decoder: MLP state init, attention with a scalar gate, LSTM, deep output layer.

`step` is one decoding step, written plainly (decoding calls it); `forward` (teacher forcing) computes the same
thing for all T steps, faster: what does not depend on the step is computed once (W_a a_i, the word part of the
LSTM input projection, the deep output), the k captions of an image share its a and keys (no copies), and the
recurrent projection's weight gradient is one GEMM over all steps (`UnrolledLSTM`). tests/models/test_fast_path.py
checks logits, losses and gradients against the step-by-step loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from captioning.config.constraints import Range, constrained
from captioning.models.attention import Attention, AttentionOutput

Size = Annotated[int, Range(ge=1)]  # a layer width or count, in both decoders' signatures
DropoutRate = Annotated[float, Range(ge=0, lt=1)]

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # h (N, n), c (N, n), previous alpha (N, L)


@dataclass
class DecoderOutput:
    """Teacher-forced outputs for N captions of T steps."""

    logits: torch.Tensor  # (N, T, V)
    alphas: torch.Tensor  # (N, T, L)
    betas: torch.Tensor  # (N, T)
    log_probs: torch.Tensor | None = None  # (N, T) log p(s_t | a) of sampled regions (hard attention)
    entropies: torch.Tensor | None = None  # (N, T) H(alpha_t) (hard attention)


def _mlp(in_dim: int, out_dim: int, layers: int) -> nn.Module:
    """A tanh MLP with `layers` linear layers (the authors' COCO model uses 2 for the state init)."""
    mods: list[nn.Module] = []
    for _ in range(layers - 1):
        mods += [nn.Linear(in_dim, in_dim), nn.Tanh()]
    return nn.Sequential(*mods, nn.Linear(in_dim, out_dim))


def annotation_state(a: torch.Tensor, mask: torch.Tensor | None, init_h: nn.Module | None,
                     init_c: nn.Module | None, hidden_dim: int) -> State:
    """h_0, c_0 = tanh(f_init(mean_i a_i)) (zeros without f_init); the previous alpha is uniform over valid regions."""
    if mask is None:
        mean = a.mean(dim=1)  # (N, D)
        alpha0 = a.new_full(a.shape[:2], 1.0 / a.shape[1])  # (N, L)
    else:
        m = mask.unsqueeze(-1).to(a.dtype)  # (N, L, 1)
        mean = (a * m).sum(1) / m.sum(1).clamp(min=1)  # (N, D)
        alpha0 = mask.to(a.dtype) / mask.sum(1, keepdim=True).clamp(min=1)  # (N, L)
    if init_h is None or init_c is None:
        zeros = a.new_zeros(a.shape[0], hidden_dim)  # (N, n)
        return zeros, zeros.clone(), alpha0
    return torch.tanh(init_h(mean)), torch.tanh(init_c(mean)), alpha0


def _matmul_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a matmul on x runs in: autocast's where it is on (custom autograd code is not cast for us)."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


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
        """Steps whose gradient arrived, their dy stacked (S N, out) and each input stacked (S N, in_j)."""
        done = [t for t, dy in enumerate(self.dys) if dy is not None]
        dy_all = torch.cat([dy for dy in self.dys if dy is not None])  # (S N, out)
        xs = [torch.cat([self.xs[t][j].to(dtype) for t in done]) for j in range(len(self.xs[done[0]]))]
        self.dys = [None] * self.steps  # a second backward (retain_graph) starts afresh
        return done, dy_all, xs


class _LSTMTape(_Tape):
    """A tape for `_LSTMGates`, with the embedded words (N, T, m) and their part of the gates, per step."""

    def __init__(self, cell: nn.LSTMCell, emb: torch.Tensor):
        super().__init__((cell.weight_ih, cell.weight_hh), emb.shape[1])
        self.m, self.emb = emb.shape[-1], emb.detach()
        with torch.no_grad():  # gradients of this GEMM come from _LSTMGates' step 0
            bias = cell.bias_ih + cell.bias_hh  # (4n,)
            words = F.linear(emb.transpose(0, 1), cell.weight_ih[:, : self.m], bias)  # (T, N, 4n)
        self.words = words.unbind(0)  # T x (N, 4n)


class _UnrolledLinear(torch.autograd.Function):
    """y_t = x_t W^T for step t of a recurrence; step 0's backward computes dW = sum_t dy_t^T x_t in one GEMM."""

    @staticmethod
    def forward(ctx, x, tape, t, weight):
        ctx.tape, ctx.t = tape, t
        x = x.to(_matmul_dtype(x))
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
            dw = torch.mm(dy_all.t(), x_all)  # (out, S N) @ (S N, in)
        return dx, None, None, dw


class UnrolledLinear:
    """x_t -> x_t W^T over the T steps of a recurrence, its weight gradient one GEMM (see `_UnrolledLinear`)."""

    def __init__(self, weight: torch.Tensor, steps: int):
        self.weight, self.tape = weight, _Tape((weight,), steps)

    def __call__(self, t: int, x: torch.Tensor) -> torch.Tensor:
        """Step t: (N, in) -> (N, out)."""
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return _UnrolledLinear.apply(x, self.tape, t, self.weight)
        x = x.to(_matmul_dtype(x))
        return torch.mm(x, self.tape.weights(x.dtype)[0].t())


class _LSTMGates(torch.autograd.Function):
    """LSTM gates of step t: W_ih [E y_{t-1}; x_t] + b_ih + W_hh h_{t-1} + b_hh, the word part precomputed.

    Every step takes the cell's parameters and the embedded words, so autograd links them, but only step 0's
    backward (the last to run) returns their gradients, each one GEMM over all steps.
    """

    @staticmethod
    def gates(tape: _LSTMTape, t: int, x: torch.Tensor | None, h: torch.Tensor) -> torch.Tensor:
        """The gates (N, 4n) of step t: precomputed word part + h W_hh^T (+ x W_ih[:, m:]^T)."""
        dtype = _matmul_dtype(h)
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
        done, dy_all, xs = tape.gathered(dy.dtype)  # (S N, 4n), [(S N, K),] (S N, n)
        N, m, S = dy.shape[0], tape.m, len(done)
        emb = tape.emb.detach().transpose(0, 1)  # (T, N, m)
        emb = (emb if S == tape.steps else emb[done]).reshape(-1, m).to(dy.dtype)  # (S N, m)
        d_emb = None
        if need[4]:
            d_emb = torch.mm(dy_all, w_ih[:, :m]).view(S, N, m)  # (S, N, m)
            if S < tape.steps:  # steps whose gates got no gradient pass none to their words
                d_emb = d_emb.new_zeros(tape.steps, N, m).index_copy_(0, torch.tensor(done, device=dy.device), d_emb)
            d_emb = d_emb.transpose(0, 1)  # (T, N, m) -> (N, T, m)
        inputs = torch.cat([emb, xs[0]], dim=1) if ctx.has_x else emb  # (S N, m + K)
        d_ih = torch.mm(dy_all.t(), inputs) if need[5] else None  # (4n, S N) @ (S N, m + K)
        d_hh = torch.mm(dy_all.t(), xs[-1]) if need[6] else None  # (4n, S N) @ (S N, n)
        db = dy_all.sum(0) if need[7] or need[8] else None  # (4n,)
        return dx, dh, None, None, d_emb, d_ih, d_hh, db, None if db is None else db.clone()


class UnrolledLSTM:
    """An `nn.LSTMCell` unrolled over T teacher-forced steps; computes what the cell computes, with fewer GEMMs.

    The cell's input is [E y_{t-1}; x_t]: the word part W_ih[:, :m] E y_{t-1} (+ both biases) of every step is one
    GEMM up front; per step two GEMMs remain (x_t and h_{t-1}); the weight gradients are one GEMM each over all
    steps (`_LSTMGates`). Gates in nn.LSTMCell's order i, f, g, o.
    """

    def __init__(self, cell: nn.LSTMCell, emb: torch.Tensor):
        if cell.bias_ih is None:
            raise ValueError("UnrolledLSTM needs an nn.LSTMCell with biases")
        self.cell, self.emb, self.tape = cell, emb, _LSTMTape(cell, emb)

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


def images_and_rows(a: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None,
                    image_index: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """Per-image tensors for N captions: kept per image with k = N / B captions each when image_index is
    0..0, 1..1, ... (k each; attention shares a and keys), else gathered per caption (k = 1)."""
    if image_index is None:
        return a, keys, mask, 1
    B, N = a.shape[0], image_index.shape[0]
    k = N // B if B else 0
    if k and N == B * k and torch.equal(image_index, torch.arange(B, device=image_index.device).repeat_interleave(k)):
        return a, keys, mask, k
    return a[image_index], keys[image_index], None if mask is None else mask[image_index], 1  # (N, L, D), ...


def map_state(fn: Callable[[torch.Tensor], torch.Tensor], state: Any) -> Any:
    """Apply fn to every tensor of a decoder state: a tensor, or tuples of them (nested), row first; None stays."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return fn(state)
    if isinstance(state, (tuple, list)):
        items = [map_state(fn, s) for s in state]
        return type(state)(*items) if hasattr(state, "_fields") else type(state)(items)
    raise TypeError(f"decoder state must be tensors (row first) in tuples, got {type(state).__name__}")


def repeat_rows(state: Any, k: int) -> Any:
    """Every row of a decoder state (or any tensors in tuples, row first) repeated k times, consecutively: row
    b k + j is copy j of row b (the k captions, beams or samples of image b)."""
    return state if k == 1 else map_state(lambda x: x.repeat_interleave(k, dim=0), state)


class ShowAttendTellDecoder(nn.Module):
    """LSTM decoder of Xu et al. (2015) with pluggable attention."""

    rows_share_images = True  # step() takes a, keys, mask per image with k state rows each (see decoding.py)

    @constrained
    def __init__(self, vocab_size: int, annotation_dim: int, attention: Callable[..., Attention],
                 embed_dim: Size = 512, hidden_dim: Size = 512, init_layers: Size = 1,
                 selector: bool = True, dropout: DropoutRate = 0.5, init_from_annotations: bool = True):
        super().__init__()
        self.vocab_size, self.hidden_dim = vocab_size, hidden_dim
        self.attention = attention(annotation_dim=annotation_dim, hidden_dim=hidden_dim)
        self.embed = nn.Embedding(vocab_size, embed_dim)
        # The paper initialises h_0, c_0 from the mean annotation; zeros is an ablation that makes every bit of
        # image information reach the decoder through attention.
        self.init_h = _mlp(annotation_dim, hidden_dim, init_layers) if init_from_annotations else None
        self.init_c = _mlp(annotation_dim, hidden_dim, init_layers) if init_from_annotations else None
        self.selector = nn.Linear(hidden_dim, 1) if selector else None  # beta_t, a scalar gate
        self.lstm = nn.LSTMCell(embed_dim + annotation_dim, hidden_dim)
        self.L_h = nn.Linear(hidden_dim, embed_dim)
        self.L_z = nn.Linear(annotation_dim, embed_dim)
        self.L_o = nn.Linear(embed_dim, vocab_size)
        self.dropout = nn.Dropout(dropout)

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> State:
        """h_0, c_0 = tanh(f_init(mean_i a_i)) (or zeros); the previous alpha starts uniform over valid regions."""
        return annotation_state(a, mask, self.init_h, self.init_c, self.hidden_dim)

    def output(self, emb: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Deep output: logits = L_o(dropout(tanh(E y_{t-1} + L_h h_t + L_z z_t)))."""
        return self.L_o(self.dropout(torch.tanh(emb + self.L_h(h) + self.L_z(z))))

    def attend(self, a: torch.Tensor, keys: torch.Tensor, state: State,
               mask: torch.Tensor | None) -> tuple[AttentionOutput, torch.Tensor, torch.Tensor]:
        """Attention from h_{t-1}: returns the output, the gated context beta_t z_t (N, D) and beta_t (N,)."""
        h, _, prev_alpha = state
        att = self.attention(a, keys, h, mask, prev_alpha)
        if self.selector is None:
            return att, att.context, h.new_ones(h.shape[0])
        beta = torch.sigmoid(self.selector(h))  # (N, 1)
        return att, beta * att.context, beta.squeeze(1)

    def step(self, words: torch.Tensor, state: State, a: torch.Tensor, keys: torch.Tensor,
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, State, AttentionOutput]:
        """One decoding step from the previous words (N,): returns logits (N, V), the new state, attention."""
        emb = self.embed(words)  # (N, m)
        att, z, _ = self.attend(a, keys, state, mask)
        h, c = self.lstm(torch.cat([emb, z], dim=1), state[:2])  # (N, n)
        return self.output(emb, h, z), (h, c, att.alpha), att

    def forward(self, a: torch.Tensor, captions: torch.Tensor, image_index: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None) -> DecoderOutput:
        """Teacher forcing over captions (N, T+1) that start with <start>; a (B, L, D) holds one grid per image."""
        keys = self.attention.prepare(a, grid)  # (B, L, A): once per image, before expanding to captions
        a, keys, mask, k = images_and_rows(a, keys, mask, image_index)
        h, c, prev_alpha = repeat_rows(self.init_state(a, mask), k)  # (N, n), (N, n), (N, L)
        emb = self.embed(captions[:, :-1])  # (N, T, m)
        lstm = UnrolledLSTM(self.lstm, emb)
        hs, zs, alphas, betas = [], [], [], []
        log_probs: list[torch.Tensor] = []
        entropies: list[torch.Tensor] = []
        for t in range(captions.shape[1] - 1):
            att, z, beta = self.attend(a, keys, (h, c, prev_alpha), mask)
            h, c = lstm(t, z, h, c)  # (N, n)
            prev_alpha = att.alpha
            hs.append(h)
            zs.append(z)
            alphas.append(att.alpha)
            betas.append(beta)
            if att.log_prob is not None and att.entropy is not None:
                log_probs.append(att.log_prob)
                entropies.append(att.entropy)
        logits = self.output(emb, torch.stack(hs, 1), torch.stack(zs, 1))  # (N, T, V) in one matmul
        return DecoderOutput(
            logits=logits,
            alphas=torch.stack(alphas, 1),  # (N, T, L)
            betas=torch.stack(betas, 1),  # (N, T)
            log_probs=torch.stack(log_probs, 1) if log_probs else None,
            entropies=torch.stack(entropies, 1) if entropies else None,
        )
