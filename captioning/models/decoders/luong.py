"""Luong et al. (2015)'s attentional LSTM decoder (`decoder=luong`), with any attention in conf/attention/.

Xu et al. attend from h_{t-1} and feed the context into the LSTM; Luong et al. attend after the LSTM step:

    h_t, c_t = LSTM([E y_{t-1}; h~_{t-1}], (h_{t-1}, c_{t-1}))     input feeding (h~_0 = 0); without it: E y_{t-1}
    alpha_t, z_t = attention(a, h_t)                                 every score (dot, general, concat, local-p, ...)
    h~_t = tanh(W_c [z_t; h_t])                                      the attentional state
    p(y_t | y_<t, a) = softmax(W_s dropout(h~_t))

So the alpha that `step` returns with the logits of word y_t is the map computed from h_t and used to produce
y_t, as for the paper's decoder (whose alpha for y_t comes from h_{t-1}): attention figures, the doubly
stochastic term and attention correctness read it the same way. `recur` states the recurrence once; decoding
and teacher forcing run it (`recurrent.RecurrentDecoder`), so decoding, training, hard attention's REINFORCE
terms, feature caches and visualisation work unchanged. Without input feeding h~_t feeds nothing recurrent: the
readout applies W_c (once over all steps in teacher forcing) and the state's h~ stays 0. h_0, c_0 come from the
mean annotation as in the paper (Luong starts from the encoder's last state, which an image does not have).
There is no scalar gate: betas are 1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from captioning.base.constraints import DropoutRate, Size, constrained
from captioning.models.attention import Attention
from captioning.models.decoders.base import annotation_state, mlp
from captioning.models.decoders.recurrent import RecurrentDecoder
from captioning.models.decoders.unroll import Step, StepIO

# h (N, n), c (N, n), attentional state h~ (N, n), previous alpha (N, L): batch first, so beams reorder each
LuongState = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class LuongDecoder(RecurrentDecoder):
    """Luong et al. (2015) global/local attention decoder with input feeding, over annotation vectors a (B, L, D)."""

    @constrained
    def __init__(self, vocab_size: int, annotation_dim: int, attention: Callable[..., Attention],
                 embed_dim: Size = 64, hidden_dim: Size = 256, init_layers: Size = 1, dropout: DropoutRate = 0.1,
                 init_from_annotations: bool = True, input_feeding: bool = True):
        super().__init__()
        self.vocab_size, self.hidden_dim, self.input_feeding = vocab_size, hidden_dim, input_feeding
        self.attention = attention(annotation_dim=annotation_dim, hidden_dim=hidden_dim)
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.init_h = mlp(annotation_dim, hidden_dim, init_layers) if init_from_annotations else None
        self.init_c = mlp(annotation_dim, hidden_dim, init_layers) if init_from_annotations else None
        self.lstm = nn.LSTMCell(embed_dim + (hidden_dim if input_feeding else 0), hidden_dim)
        self.W_c = nn.Linear(annotation_dim + hidden_dim, hidden_dim, bias=False)  # Luong's W_c has no bias
        self.W_s = nn.Linear(hidden_dim, vocab_size)  # its bias is a word-frequency prior (Luong omits biases)
        self.dropout = nn.Dropout(dropout)

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> LuongState:
        """h_0, c_0 from the mean annotation (or zeros), h~_0 = 0, and a uniform previous alpha over valid regions."""
        h, c, alpha0 = annotation_state(a, mask, self.init_h, self.init_c, self.hidden_dim)
        return h, c, torch.zeros_like(h), self.attention.initial_carry(alpha0)

    def recur(self, io: StepIO, state: LuongState, a: torch.Tensor, keys: torch.Tensor,
              mask: torch.Tensor | None) -> Step:
        """The LSTM on [E y_{t-1}; h~_{t-1}], attention from h_t, then h~_t = tanh(W_c [z_t; h_t])."""
        h, c, h_tilde, prev_alpha = state
        fed = io.run(h_tilde) if self.input_feeding else None
        h_t, c_t = io.lstm(self.lstm, fed, io.run(h), io.run(c))  # (n_t, n)
        h, c = io.put(h, h_t), io.put(c, c_t)
        att = self.attention(a, keys, h, mask, prev_alpha)  # from h_t, after the step
        run = io.attention(att)
        joint = torch.cat([run.context, h_t], dim=1)  # (n_t, D + n)
        if not self.input_feeding:  # h~_t feeds nothing recurrent: the readout computes it
            return Step((h, c, h_tilde, att.recurrent), run, (joint,))
        out = torch.tanh(io.linear(self.W_c, joint))  # (n_t, n), fed to the next step
        return Step((h, c, io.put(h_tilde, out), att.recurrent), run, (out,))

    def readout(self, emb: torch.Tensor, *parts: torch.Tensor) -> torch.Tensor:
        """logits = W_s dropout(h~_t) from h~_t (or, without input feeding, from [z_t; h_t])."""
        h_tilde = parts[0] if self.input_feeding else torch.tanh(self.W_c(parts[0]))
        return self.W_s(self.dropout(h_tilde))
