"""The LSTM decoders' base: each states its recurrence once (`recur`), and decoding and teacher forcing both run it.

A recurrent decoder defines

    init_state(a, mask) -> state          the state tuple (rows first), e.g. (h, c, previous alpha)
    fixed_inputs(emb, a, mask, spread)    each LSTM cell's input part known before the loop: the embedded previous
                                          word E y_{t-1} (and, for Up-Down, the mean annotation); also the input
                                          of any other layer that reads only those (`io.project(layer)`)
    recur(io, state, a, keys, mask)       one step of its equations -> `unroll.Step`
    readout(emb, *parts) -> logits        the output layer, on the readout inputs `recur` returned

and gets `step` (decoding), `forward` (packed teacher forcing) and `forward_plain` (the oracle) from here
(`unroll.py` runs them). Adding a decoder: one model file with these four methods, one line in
`captioning/factory/registry.py`, one YAML in conf/decoder/ (ARCHITECTURE.md).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from captioning.models.attention import AttentionOutput
from captioning.models.decoders.base import Decoder, DecoderOutput
from captioning.models.decoders.unroll import PlainStep, Spread, Step, StepIO, teacher_force, teacher_force_plain
from captioning.models.rows import repeat_rows, rows_per_image


class RecurrentDecoder(Decoder):
    """An LSTM decoder over annotation vectors a (B, L, D) whose recurrence is written once (see the module)."""

    embed: nn.Embedding
    lstm: nn.LSTMCell  # the decoders with one cell (the default `fixed_inputs` feeds it E y_{t-1})

    def init_rows(self, a: torch.Tensor, mask: torch.Tensor | None, k: int) -> Any:
        """`init_state` for k rows per image of a (B, L, D): computed once per image and repeated (N = B k rows)."""
        return repeat_rows(self.init_state(a, mask), k)

    def fixed_inputs(self, emb: torch.Tensor, a: torch.Tensor, mask: torch.Tensor | None,
                     spread: Spread) -> dict[nn.Module, torch.Tensor]:
        """Each LSTM cell's input part that does not depend on the recurrence, for the rows of emb (P, m), the
        embedded previous words (`spread` maps a per-image tensor of a's images onto those rows); `recur` passes
        the rest of each cell's input to `io.lstm`. A key that is not an LSTM cell is a layer `recur` reads as
        `io.project(layer)`: the layer on its fixed input, computed for every step at once in teacher forcing.
        The default: one LSTM cell, `self.lstm`, whose input starts with E y_{t-1}."""
        return {self.lstm: emb}

    def recur(self, io: StepIO, state: Any, a: torch.Tensor, keys: torch.Tensor,
              mask: torch.Tensor | None) -> Step:
        raise NotImplementedError

    def readout(self, emb: torch.Tensor, *parts: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step(self, words: torch.Tensor, state: Any, a: torch.Tensor, keys: torch.Tensor,
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, Any, AttentionOutput]:
        """One decoding step from the previous words (N,): logits (N, V) of y_t, the new state, y_t's attention.

        a (B, L, D) and mask (B, L) hold one image per k = N / B consecutive state rows (beams, samples)."""
        emb = self.embed(words)  # (N, m)
        fixed = self.fixed_inputs(emb, a, mask, lambda x: repeat_rows(x, rows_per_image(a.shape[0], words.shape[0])))
        out = self.recur(PlainStep(fixed), state, a, keys, mask)
        return self.readout(emb, *out.readout), out.state, out.att

    def forward(self, a: torch.Tensor, captions: torch.Tensor, image_index: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None,
                lengths: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher forcing over captions (N, T+1) that start with <start>, packed (`unroll.teacher_force`)."""
        return teacher_force(self, a, captions, image_index, mask, grid, lengths)

    def forward_plain(self, a: torch.Tensor, captions: torch.Tensor, image_index: torch.Tensor | None = None,
                      mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None) -> DecoderOutput:
        """The same teacher forcing step by step for every caption (`unroll.teacher_force_plain`): the oracle."""
        return teacher_force_plain(self, a, captions, image_index, mask, grid)
