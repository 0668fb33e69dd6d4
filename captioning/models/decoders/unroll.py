"""The one unrolling engine: runs a decoder's single recurrence over teacher-forced steps, plainly or packed.

A recurrent decoder (`recurrent.RecurrentDecoder`) writes one step of its equations, `recur(io, state, a, keys,
mask)`, against the `StepIO` it is given; this module owns everything around it: rows per image, image order, the
shrinking set of running captions, packing and padding.

- `PlainStep` runs a step on every row: the LSTM cell and linear layers as they are. `step` (decoding) and
  `teacher_force_plain` (every caption, every step: the readable oracle the tests compare against) use it.
- `PackedStep` runs step t of `teacher_force`: the k captions of an image share its a and keys, the images whose
  captions have all ended drop out (a prefix of them runs), the LSTMs and the linear maps inside the recurrence
  run only the rows of captions still running, unrolled (`fused.unrolled`: the word part of every step is one GEMM
  up front, each weight gradient one GEMM over all steps), and the readout sees the real tokens only.

Both compute the same logits, maps and gradients to float rounding and draw the same random numbers
(tests/models/test_decoders.py checks every registered decoder).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from captioning.models.attention import AttentionOutput
from captioning.models.decoders.base import DecoderOutput
from captioning.models.fused.dtypes import autocast_input
from captioning.models.fused.unrolled import UnrolledLinear, UnrolledLSTM
from captioning.models.packing import StepPlan
from captioning.models.rows import images_and_rows, map_state, plain_rows

Spread = Callable[[torch.Tensor], torch.Tensor]  # a per-image tensor (B, ...) onto the rows being computed


@dataclass
class Step:
    """What one step of a recurrence gives: the new state (every row), the running rows' attention, the running
    rows' readout inputs (the readout maps them to logits), and their gate beta_t (None: no gate, 1)."""

    state: Any
    att: AttentionOutput
    readout: tuple[torch.Tensor, ...]
    beta: torch.Tensor | None = None


class Recurrence(Protocol):
    """What the engine needs of a decoder (`recurrent.RecurrentDecoder` has it): its attention and word embedding,
    its initial state, each LSTM cell's fixed input, one step of its recurrence and its readout."""

    attention: Any
    embed: nn.Embedding

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> Any: ...

    def init_rows(self, a: torch.Tensor, mask: torch.Tensor | None, k: int) -> Any: ...

    def fixed_inputs(self, emb: torch.Tensor, a: torch.Tensor, mask: torch.Tensor | None,
                     spread: Spread) -> dict[nn.Module, torch.Tensor]: ...

    def recur(self, io: StepIO, state: Any, a: torch.Tensor, keys: torch.Tensor,
              mask: torch.Tensor | None) -> Step: ...

    def readout(self, emb: torch.Tensor, *parts: torch.Tensor) -> torch.Tensor: ...


class StepIO:
    """The rows one step of a recurrence runs on, and its LSTM cells and linear layers.

    The state holds every row of the images still running; attention runs on all of them (an image's k rows share
    its keys). `rows` are the rows of captions still running (None: every row): `run(x)` is those rows of x,
    `put(x, part)` writes their new values back; `lstm(cell, x, h, c)` is the cell on those rows, its input [the
    cell's fixed input of this step; x]; `project(layer)` is a layer (not a cell) applied to its fixed input of this
    step, on those rows (a recurrence's word part that is not an LSTM cell's: Att2in's gates, the sentinel's)."""

    rows: torch.Tensor | None = None

    def run(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.rows is None else x[self.rows]

    def put(self, full: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        return part if self.rows is None else full.index_copy(0, self.rows, part)

    def attention(self, att: AttentionOutput) -> AttentionOutput:
        return att if self.rows is None else att.select(self.rows)

    def lstm(self, cell: nn.LSTMCell, x: torch.Tensor | None, h: torch.Tensor,
             c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def linear(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def project(self, layer: nn.Module) -> torch.Tensor:
        raise NotImplementedError


class PlainStep(StepIO):
    """Every row, the cells and layers as they are; `fixed` holds each cell's fixed input of this step (N, m)."""

    def __init__(self, fixed: dict[nn.Module, torch.Tensor]):
        self.fixed = fixed

    def lstm(self, cell: nn.LSTMCell, x: torch.Tensor | None, h: torch.Tensor,
             c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fixed = self.fixed[cell]
        if x is not None:
            fixed = x if fixed.shape[1] == 0 else torch.cat([fixed, x], dim=1)
        return cell(fixed, (h, c))

    def linear(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return layer(x)

    def project(self, layer: nn.Module) -> torch.Tensor:
        return layer(self.fixed[layer])


class PackedStep(StepIO):
    """Step t of packed teacher forcing: the running captions' rows (`plan.rows[t]`, None: every row), the cells
    unrolled over all steps (their fixed inputs projected up front), bias-free linear maps unrolled too, and the
    other layers of fixed inputs applied to every step's rows in one call up front."""

    def __init__(self, plan: StepPlan, fixed: dict[nn.Module, torch.Tensor]):
        self.plan, self.t, self.rows = plan, 0, plan.rows[0] if plan.steps else None
        self.cells = {cell: UnrolledLSTM(cell, x, plan.counts) for cell, x in fixed.items()
                      if isinstance(cell, nn.LSTMCell)}
        self.projected = {layer: layer(x).split(plan.counts) for layer, x in fixed.items()
                          if not isinstance(layer, nn.LSTMCell)}  # T x (n_t, out): step-major as the words
        self.linears: dict[nn.Module, UnrolledLinear] = {}

    def at(self, t: int) -> None:
        self.t, self.rows = t, self.plan.rows[t]

    def lstm(self, cell: nn.LSTMCell, x: torch.Tensor | None, h: torch.Tensor,
             c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cells[cell](self.t, x, h, c)

    def linear(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if layer.bias is not None:
            raise ValueError("an unrolled linear map inside a recurrence has no bias")
        if layer not in self.linears:
            self.linears[layer] = UnrolledLinear(layer.weight, self.plan.steps)
        return self.linears[layer](self.t, x)

    def project(self, layer: nn.Module) -> torch.Tensor:
        return self.projected[layer][self.t]


class Collected:
    """The per-step outputs of the running rows: readout inputs, maps, gates, hard attention's sampling terms."""

    def __init__(self) -> None:
        self.readouts: list[tuple[torch.Tensor, ...]] = []
        self.alphas: list[torch.Tensor] = []
        self.betas: list[torch.Tensor] = []
        self.log_probs: list[torch.Tensor] = []
        self.entropies: list[torch.Tensor] = []

    def add(self, step: Step) -> None:
        run = step.att
        self.readouts.append(step.readout)
        self.alphas.append(run.alpha)
        self.betas.append(run.alpha.new_ones(run.alpha.shape[0]) if step.beta is None else step.beta)
        if run.log_prob is not None and run.entropy is not None:
            self.log_probs.append(run.log_prob)
            self.entropies.append(run.entropy)

    def output(self, logits: torch.Tensor, per_step: Callable[[list[torch.Tensor]], torch.Tensor]) -> DecoderOutput:
        return DecoderOutput(logits, per_step(self.alphas), per_step(self.betas),
                             per_step(self.log_probs) if self.log_probs else None,
                             per_step(self.entropies) if self.entropies else None)


def _spread_over(plan: StepPlan, k: int, device: torch.device) -> Spread:
    """Per-image tensors (B, ...) onto the computed rows of every step, step-major (sum_t n_t, ...)."""

    def spread(x: torch.Tensor) -> torch.Tensor:
        image = torch.cat([torch.arange(plan.images[t] * k, device=device) if r is None else r
                           for t, r in enumerate(plan.rows)]) // k  # (sum_t n_t,) the image of each computed row
        return x.index_select(0, image)

    return spread


def _first(n: int, x: torch.Tensor) -> torch.Tensor:
    return x[:n]


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


def teacher_force(decoder: Recurrence, a: torch.Tensor, captions: torch.Tensor,
                  image_index: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                  grid: tuple[int, int] | None = None, lengths: torch.Tensor | None = None) -> DecoderOutput:
    """Teacher forcing over captions (N, T+1) that start with <start>; a (B, L, D) holds one grid per image.

    lengths (N,): real target tokens per caption (`packing.prefix_lengths`); a caption runs only its own steps
    and the logits are (R, V) for its real tokens only. Without lengths every caption runs all T steps."""
    keys = decoder.attention.prepare(a, grid, mask)  # (B, L, A): once per image, before expanding to captions
    a, keys, mask, k = images_and_rows(a, keys, mask, image_index)
    plan = StepPlan.of(lengths, a.shape[0], k, captions.shape[1] - 1)
    a, keys, mask = plan.order_images(a, keys, mask)  # images by longest caption, longest first
    state = decoder.init_rows(a, mask, k)
    emb, emb_out = plan.embed(decoder.embed, captions[:, :-1])  # (sum_t n_t, m) step-major; per token
    io = PackedStep(plan, decoder.fixed_inputs(emb, a, mask, _spread_over(plan, k, a.device)))
    a = autocast_input(a)  # bf16/fp16: cast once, not at every step
    out = Collected()
    for t in range(plan.steps):
        b = plan.images[t]
        io.at(t)
        state = map_state(functools.partial(_first, b * k), state)  # the rows of the images still running
        step = decoder.recur(io, state, a[:b], keys[:b], None if mask is None else mask[:b])
        state = step.state
        out.add(step)
    readout = [plan.tokens(list(x)) for x in zip(*out.readouts)]  # (N, T, ...) or (R, ...)
    logits = decoder.readout(emb_out, *readout)  # in one matmul
    return out.output(logits if lengths is None else logits.reshape(-1, logits.shape[-1]), plan.padded)


def teacher_force_plain(decoder: Recurrence, a: torch.Tensor, captions: torch.Tensor,
                        image_index: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                        grid: tuple[int, int] | None = None) -> DecoderOutput:
    """Teacher forcing written out: every caption its own copy of its image, every step, the cells as they are."""
    a, keys, mask = plain_rows(a, decoder.attention.prepare(a, grid, mask), mask, image_index)  # (N, L, D), (N, L, A)
    state = decoder.init_state(a, mask)
    emb = decoder.embed(captions[:, :-1])  # (N, T, m)
    out = Collected()
    for t in range(emb.shape[1]):
        fixed = decoder.fixed_inputs(emb[:, t], a, mask, _same)  # every row its own image already
        step = decoder.recur(PlainStep(fixed), state, a, keys, mask)
        state = step.state
        out.add(step)
    logits = decoder.readout(emb, *[torch.stack(x, 1) for x in zip(*out.readouts)])  # (N, T, V)
    return out.output(logits, lambda xs: torch.stack(xs, 1))
