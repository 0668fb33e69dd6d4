"""The paper's LSTM decoder (`decoder=sat`): MLP state init, attention with a scalar gate, LSTM, deep output layer.

Xu et al. (2015), eqs. 1-7 and 4.2.1: from h_{t-1} the attention gives alpha_t and z_t, gated by beta_t:

    alpha_t, z_t = attention(a, h_{t-1})          beta_t = sigmoid(f_beta(h_{t-1}))     (the selector)
    h_t, c_t = LSTM([E y_{t-1}; beta_t z_t], (h_{t-1}, c_{t-1}))
    p(y_t | a, y_<t) = softmax(L_o dropout(tanh(E y_{t-1} + L_h h_t + L_z beta_t z_t)))       the deep output

`recur` is that recurrence, once; decoding and both teacher-forcing paths run it (`recurrent.RecurrentDecoder`).

The paper presets switch on what arctic-captions adds to the paper (experiments/README.md, "Fidelity"): dropout on
h_t before the deep output (`hidden_dropout`) and on the init MLP's hidden layer (`init_dropout`), and that hidden
layer's ReLU (`init_activation`). At their defaults they add no module and draw no random number.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from captioning.base.constraints import DropoutRate, Size, constrained
from captioning.models.attention import Attention, AttentionOutput
from captioning.models.decoders.base import InitActivation, annotation_state, mean_annotation, mlp
from captioning.models.decoders.recurrent import RecurrentDecoder
from captioning.models.decoders.unroll import Step, StepIO
from captioning.models.rows import repeat_rows

# h (N, n), c (N, n), previous alpha (N, L): what the attention carries to the next step (`AttentionOutput.recurrent`)
State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class ShowAttendTellDecoder(RecurrentDecoder):
    """LSTM decoder of Xu et al. (2015) with pluggable attention.

    `dropout` acts after the deep output's tanh, `hidden_dropout` on h_t where it enters the deep output (the
    recurrence keeps h_t), `init_dropout` after each hidden layer of the init MLPs, whose activation is
    `init_activation` (arctic-captions, `capgen.py`: L674-675, L685-686, L630-631 and the ReLU of L627-629).
    """

    @constrained
    def __init__(self, vocab_size: int, annotation_dim: int, attention: Callable[..., Attention],
                 embed_dim: Size = 64, hidden_dim: Size = 256, init_layers: Size = 1,
                 selector: bool = True, dropout: DropoutRate = 0.1, init_from_annotations: bool = True,
                 hidden_dropout: DropoutRate = 0.0, init_dropout: DropoutRate = 0.0,
                 init_activation: InitActivation = "tanh"):
        super().__init__()
        self.vocab_size, self.hidden_dim = vocab_size, hidden_dim
        self.attention = attention(annotation_dim=annotation_dim, hidden_dim=hidden_dim)
        self.embed = nn.Embedding(vocab_size, embed_dim)
        # The paper initialises h_0, c_0 from the mean annotation; zeros is an ablation that makes every bit of
        # image information reach the decoder through attention.
        init = functools.partial(mlp, annotation_dim, hidden_dim, init_layers, activation=init_activation,
                                 dropout=init_dropout)
        self.init_h = init() if init_from_annotations else None
        self.init_c = init() if init_from_annotations else None
        # With dropout in the init MLPs each caption draws its own mask (arctic-captions: each its own image copy).
        self.init_draws = init_from_annotations and init_layers > 1 and init_dropout > 0
        self.selector = nn.Linear(hidden_dim, 1) if selector else None  # beta_t, a scalar gate
        self.lstm = nn.LSTMCell(embed_dim + annotation_dim, hidden_dim)
        self.L_h = nn.Linear(hidden_dim, embed_dim)
        self.L_z = nn.Linear(annotation_dim, embed_dim)
        self.L_o = nn.Linear(embed_dim, vocab_size)
        self.dropout = nn.Dropout(dropout)
        self.hidden_dropout = nn.Dropout(hidden_dropout) if hidden_dropout > 0 else None  # none at p = 0: no draws

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> State:
        """h_0, c_0 = tanh(f_init(mean_i a_i)) (or zeros); the previous alpha starts uniform over valid regions."""
        h, c, alpha0 = annotation_state(a, mask, self.init_h, self.init_c, self.hidden_dim)
        return h, c, self.attention.initial_carry(alpha0)

    def init_rows(self, a: torch.Tensor, mask: torch.Tensor | None, k: int) -> State:
        """`init_state` for k rows per image of a (B, L, D): computed once per image and repeated (N = B k rows),
        unless the init MLPs drop units in training: then every row draws its own mask, as `forward_plain` does."""
        if k == 1 or not (self.training and self.init_draws):
            return repeat_rows(self.init_state(a, mask), k)
        assert self.init_h is not None and self.init_c is not None
        mean, alpha0 = repeat_rows(mean_annotation(a, mask), k)  # (N, D), (N, L)
        h, c = torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean))  # (N, n) each
        return h, c, self.attention.initial_carry(alpha0)  # (N, L)

    def output(self, emb: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Deep output: logits = L_o(dropout(tanh(E y_{t-1} + L_h h_t + L_z z_t))), h_t through `hidden_dropout`."""
        if self.hidden_dropout is not None:
            h = self.hidden_dropout(h)  # (..., n): on the output's copy of h_t only, as capgen.py:L674-675
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

    def recur(self, io: StepIO, state: State, a: torch.Tensor, keys: torch.Tensor,
              mask: torch.Tensor | None) -> Step:
        """alpha_t and beta_t z_t from h_{t-1}, then the LSTM on [E y_{t-1}; beta_t z_t]; the readout gets h_t, z_t."""
        h, c, _ = state
        att, z, beta = self.attend(a, keys, state, mask)
        z, beta = io.run(z), io.run(beta)  # the captions still running
        h_t, c_t = io.lstm(self.lstm, z, io.run(h), io.run(c))  # (n_t, n)
        return Step((io.put(h, h_t), io.put(c, c_t), att.recurrent), io.attention(att), (h_t, z), beta)

    def readout(self, emb: torch.Tensor, *parts: torch.Tensor) -> torch.Tensor:
        h, z = parts
        return self.output(emb, h, z)
