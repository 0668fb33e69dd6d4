"""Anderson et al. (2018)'s top-down attention decoder (`decoder=updown`), with any attention in conf/attention/.

Two stacked LSTMs (eqs. 2-7 of "Bottom-Up and Top-Down Attention for Image Captioning and VQA"): an attention LSTM
that sees the language LSTM's last state, the mean annotation and the previous word, attention from its state, and
a language LSTM that reads the context:

    x1_t = [h2_{t-1}; v_mean; W_e y_{t-1}],     h1_t, c1_t = AttLSTM(x1_t, (h1_{t-1}, c1_{t-1}))
    alpha_t, z_t = attention(a, h1_t)             Anderson's is attention=soft: w^T tanh(W_v v_i + W_h h1_t)
    h2_t, c2_t = LangLSTM([z_t; h1_t], (h2_{t-1}, c2_{t-1}))
    p(y_t | y_<t, a) = softmax(W_p dropout(h2_t))

v_mean = (1/L) sum_i a_i over the valid (unmasked) regions. The annotations a (B, L, D) here are the encoder's grid
features, L = h * w CNN regions; Anderson's bottom-up features (Faster R-CNN boxes, one vector per detected object)
are region sets the pipeline batches with a mask (`data.dataset.pad_regions`), which the decoder takes unchanged;
their reader is not in this toolkit yet. The attention LSTM's input is ordered [W_e y_{t-1}; v_mean; h2_{t-1}] (the
paper's x1 reordered) so that its step-invariant part comes first and teacher forcing projects it for all steps
at once.

The alpha that `step` returns with the logits of word y_t is the map computed from h1_t and used to produce y_t,
as in the Luong decoder. `recur` states the recurrence once; decoding and teacher forcing run it
(`recurrent.RecurrentDecoder`), so decoding, training, hard attention's REINFORCE terms, self-critical sampling,
export and visualisation work unchanged. States start at zeros as in the paper (`init_from_annotations`: the MLP
init of the SAT decoder instead, for both LSTMs). There is no scalar gate: betas are 1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from captioning.base.constraints import DropoutRate, Size, constrained
from captioning.models.attention import Attention
from captioning.models.decoders.base import annotation_state, mean_annotation, mlp
from captioning.models.decoders.recurrent import RecurrentDecoder
from captioning.models.decoders.unroll import Spread, Step, StepIO

# h1, c1 (attention LSTM), h2, c2 (language LSTM) (N, n) each, previous alpha (N, L): batch first, so that beams and
# samples reorder each row. v_mean is not state: it is a fixed input, read from a (an exported step graph cannot
# return an input unchanged, and it costs less than the step's context z_t = sum_i alpha_i a_i).
UpDownState = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class UpDownDecoder(RecurrentDecoder):
    """Anderson et al. (2018) top-down decoder (attention LSTM + language LSTM) over annotation vectors a (B, L, D)."""

    @constrained
    def __init__(self, vocab_size: int, annotation_dim: int, attention: Callable[..., Attention],
                 embed_dim: Size = 64, hidden_dim: Size = 256, dropout: DropoutRate = 0.1,
                 init_from_annotations: bool = False, init_layers: Size = 1):
        super().__init__()
        self.vocab_size, self.hidden_dim = vocab_size, hidden_dim
        self.attention = attention(annotation_dim=annotation_dim, hidden_dim=hidden_dim)  # queried by h1_t
        self.embed = nn.Embedding(vocab_size, embed_dim)  # W_e
        # [h1_0; h2_0] and [c1_0; c2_0] from the mean annotation; the paper starts from zeros
        self.init_h = mlp(annotation_dim, 2 * hidden_dim, init_layers) if init_from_annotations else None
        self.init_c = mlp(annotation_dim, 2 * hidden_dim, init_layers) if init_from_annotations else None
        self.att_lstm = nn.LSTMCell(embed_dim + annotation_dim + hidden_dim, hidden_dim)  # [W_e y; v_mean; h2]
        self.lang_lstm = nn.LSTMCell(annotation_dim + hidden_dim, hidden_dim)  # [z_t; h1_t]
        self.W_p = nn.Linear(hidden_dim, vocab_size)
        self.dropout = nn.Dropout(dropout)

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> UpDownState:
        """Zero states (or tanh(MLP(v_mean))) of both LSTMs and a uniform previous alpha over valid regions."""
        h, c, alpha0 = annotation_state(a, mask, self.init_h, self.init_c, 2 * self.hidden_dim)  # (N, 2n) x 2
        h1, h2 = h.chunk(2, dim=1)  # (N, n) each
        c1, c2 = c.chunk(2, dim=1)
        return h1, c1, h2, c2, self.attention.initial_carry(alpha0)

    def fixed_inputs(self, emb: torch.Tensor, a: torch.Tensor, mask: torch.Tensor | None,
                     spread: Spread) -> dict[nn.Module, torch.Tensor]:
        """The attention LSTM's input starts with [W_e y_{t-1}; v_mean]; nothing of the language LSTM's is fixed."""
        v_mean = spread(mean_annotation(a, mask)[0])  # (B, D) -> the rows' (P, D)
        return {self.att_lstm: torch.cat([emb, v_mean.to(emb.dtype)], dim=1),
                self.lang_lstm: emb.new_empty(emb.shape[0], 0)}

    def recur(self, io: StepIO, state: UpDownState, a: torch.Tensor, keys: torch.Tensor,
              mask: torch.Tensor | None) -> Step:
        """The attention LSTM on [W_e y_{t-1}; v_mean; h2_{t-1}], attention from h1_t, then the language LSTM on
        [z_t; h1_t]."""
        h1, c1, h2, c2, prev_alpha = state
        h1_t, c1_t = io.lstm(self.att_lstm, io.run(h2), io.run(h1), io.run(c1))  # (n_t, n)
        h1, c1 = io.put(h1, h1_t), io.put(c1, c1_t)
        att = self.attention(a, keys, h1, mask, prev_alpha)  # from h1_t
        run = io.attention(att)
        joint = torch.cat([run.context, h1_t], dim=1)  # (n_t, D + n)
        h2_t, c2_t = io.lstm(self.lang_lstm, joint, io.run(h2), io.run(c2))  # (n_t, n)
        return Step((h1, c1, io.put(h2, h2_t), io.put(c2, c2_t), att.recurrent), run, (h2_t,))

    def readout(self, emb: torch.Tensor, *parts: torch.Tensor) -> torch.Tensor:
        """logits = W_p dropout(h2_t): (..., n) -> (..., V)."""
        return self.W_p(self.dropout(parts[0]))
