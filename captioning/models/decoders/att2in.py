"""Att2in and Att2all (Rennie et al., CVPR 2017, the SCST paper's own models), `decoder=att2in | att2all`.

Attention from the previous state, I_t = sum_i alpha_ti I_i with alpha_t = attention(I, h_{t-1}) (any attention in
conf/attention/; the paper's is attention=soft, w^T tanh(W_aI I_i + W_ah h_{t-1})), then an LSTM whose cell input
is a 2-unit maxout (phi) and where the context enters

    Att2in, the cell input only:
        i_t, f_t, o_t = sigmoid(W_x x_t + W_h h_{t-1} + b)                    (the gates see x_t and h_{t-1} only)
        c_t = i_t * phi(W_zx x_t + W_zI I_t + W_zh h_{t-1} + b_z) + f_t * c_{t-1}
    Att2all, every gate and the cell input: each of i_t, f_t, o_t and the maxout's two units adds W_.I I_t;
    h_t = o_t * tanh(c_t),   p(y_t | I, y_<t) = softmax(W_o dropout(h_t))

with x_t = E y_{t-1}. The pre-activations are 5n wide: [i; f; o; z_1; z_2], phi = max(z_1, z_2). Att2in's context
map W_zI has 2n outputs, none of them a gate's (tests/models/test_zoo.py checks that by gradient). ruotianluo's
`att2all2` feeds the context through an extra layer and says itself that it is not the paper's model: this is
the paper's. States start at zeros (`init_from_annotations`: the SAT decoder's MLP init instead).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from captioning.base.constraints import DropoutRate, Size, constrained
from captioning.models.attention import Attention
from captioning.models.decoders.base import annotation_state, mlp
from captioning.models.decoders.recurrent import RecurrentDecoder
from captioning.models.decoders.unroll import Spread, Step, StepIO

Att2State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # h, c (N, n), the previous alpha (N, L)


def maxout_cell(pre: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h_t, c_t from the pre-activations [i; f; o; z_1; z_2] (N, 5n) and c_{t-1} (N, n)."""
    n = c.shape[1]
    i, f, o = torch.sigmoid(pre[:, : 3 * n]).chunk(3, dim=1)  # (N, n) each
    z = torch.maximum(pre[:, 3 * n: 4 * n], pre[:, 4 * n:])  # the 2-unit maxout phi
    c = f * c + i * z
    return o * torch.tanh(c), c


class Att2inDecoder(RecurrentDecoder):
    """Rennie et al.'s Att2in (`context_gates=False`) or Att2all (`context_gates=True`), see the module."""

    context_gates = False

    @constrained
    def __init__(self, vocab_size: int, annotation_dim: int, attention: Callable[..., Attention],
                 embed_dim: Size = 64, hidden_dim: Size = 256, dropout: DropoutRate = 0.1,
                 init_from_annotations: bool = False, init_layers: Size = 1):
        super().__init__()
        self.vocab_size, self.hidden_dim = vocab_size, hidden_dim
        self.attention = attention(annotation_dim=annotation_dim, hidden_dim=hidden_dim)  # queried by h_{t-1}
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.init_h = mlp(annotation_dim, hidden_dim, init_layers) if init_from_annotations else None
        self.init_c = mlp(annotation_dim, hidden_dim, init_layers) if init_from_annotations else None
        self.W_x = nn.Linear(embed_dim, 5 * hidden_dim)  # x_t's part of every pre-activation, with the biases
        self.W_h = nn.Linear(hidden_dim, 5 * hidden_dim, bias=False)
        # The context's part: the maxout's two units only (Att2in), or all five (Att2all)
        self.W_I = nn.Linear(annotation_dim, (5 if self.context_gates else 2) * hidden_dim, bias=False)
        self.W_o = nn.Linear(hidden_dim, vocab_size)
        self.dropout = nn.Dropout(dropout)

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> Att2State:
        """Zero states (or tanh(MLP(mean annotation))) and a uniform previous alpha over the real regions."""
        h, c, alpha0 = annotation_state(a, mask, self.init_h, self.init_c, self.hidden_dim)
        return h, c, self.attention.initial_carry(alpha0)

    def fixed_inputs(self, emb: torch.Tensor, a: torch.Tensor, mask: torch.Tensor | None,
                     spread: Spread) -> dict[nn.Module, torch.Tensor]:
        """W_x reads E y_{t-1} (every step's at once in teacher forcing)."""
        return {self.W_x: emb}

    def pre_activations(self, words: torch.Tensor, h: torch.Tensor, context: torch.Tensor,
                        io: StepIO) -> torch.Tensor:
        """[i; f; o; z_1; z_2] (N, 5n) from W_x x_t + b (N, 5n), h_{t-1} (N, n) and I_t (N, D)."""
        pre = words + io.linear(self.W_h, h)
        into = io.linear(self.W_I, context)  # (N, 2n) or (N, 5n)
        if self.context_gates:
            return pre + into
        return torch.cat([pre[:, : 3 * self.hidden_dim], pre[:, 3 * self.hidden_dim:] + into], dim=1)

    def recur(self, io: StepIO, state: Att2State, a: torch.Tensor, keys: torch.Tensor,
              mask: torch.Tensor | None) -> Step:
        """alpha_t and I_t from h_{t-1}, then the maxout LSTM step with I_t in its cell input (or every gate)."""
        h, c, prev_alpha = state
        att = self.attention(a, keys, h, mask, prev_alpha)  # from h_{t-1}
        run = io.attention(att)
        h_t, c_t = maxout_cell(self.pre_activations(io.project(self.W_x), io.run(h), run.context, io), io.run(c))
        return Step((io.put(h, h_t), io.put(c, c_t), att.recurrent), run, (h_t,))

    def readout(self, emb: torch.Tensor, *parts: torch.Tensor) -> torch.Tensor:
        """logits = W_o dropout(h_t): (..., n) -> (..., V)."""
        return self.W_o(self.dropout(parts[0]))


class Att2allDecoder(Att2inDecoder):
    """Rennie et al.'s Att2all: the attended context enters every gate as well as the cell input."""

    context_gates = True
