"""Show and Tell (Vinyals et al., CVPR 2015), `decoder=fc`: the image is the LSTM's first input, and nothing after.

    x_{-1} = W_I CNN(I)                     fed once, before <start>: (h_0, c_0) = LSTM(x_{-1}, (0, 0))
    x_t = E y_{t-1},  h_t, c_t = LSTM(x_t, (h_{t-1}, c_{t-1}))
    p(y_t | I, y_<t) = softmax(W_o dropout(h_t))

CNN(I) is the masked mean of the annotation vectors (the pooled image vector; ruotianluo's FCModel reads the fc
features, the same pooling). The step that reads the image shares the LSTM's weights with the word steps, as in the
paper. The model has no attention: it takes `attention=mean` only (conf/decoder/fc.yaml selects it), whose map,
uniform over the real regions, is what its figures and attention correctness show (the uniform baseline's), and
whose context it never reads. Xu et al. compare Show, Attend and Tell with this model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from captioning.base.constraints import DropoutRate, Size, constrained
from captioning.models.attention import Attention, attention_name
from captioning.models.attention_family import MeanAttention
from captioning.models.decoders.base import mean_annotation
from captioning.models.decoders.recurrent import RecurrentDecoder
from captioning.models.decoders.unroll import Step, StepIO

FCState = tuple[torch.Tensor, torch.Tensor]  # h, c (N, n) each


class ShowTellDecoder(RecurrentDecoder):
    """Vinyals et al. (2015): an LSTM whose first input is the image, then the words (see the module)."""

    @constrained
    def __init__(self, vocab_size: int, annotation_dim: int, attention: Callable[..., Attention],
                 embed_dim: Size = 64, hidden_dim: Size = 256, dropout: DropoutRate = 0.1):
        super().__init__()
        self.vocab_size, self.hidden_dim = vocab_size, hidden_dim
        self.attention = attention(annotation_dim=annotation_dim, hidden_dim=hidden_dim)
        if not isinstance(self.attention, MeanAttention):
            raise ValueError(f"decoder=fc (Show and Tell) has no attention: it reads the image once, as the LSTM's "
                             f"first input; use attention=mean (a uniform map), not "
                             f"attention={attention_name(self.attention)}")
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.W_I = nn.Linear(annotation_dim, embed_dim)  # the image into the word embedding's space
        self.lstm = nn.LSTMCell(embed_dim, hidden_dim)
        self.W_o = nn.Linear(hidden_dim, vocab_size)
        self.dropout = nn.Dropout(dropout)

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> FCState:
        """(h_0, c_0) = LSTM(W_I mean_i a_i, (0, 0)): the step that reads the image."""
        mean, _ = mean_annotation(a, mask)  # (N, D)
        zeros = a.new_zeros(a.shape[0], self.hidden_dim)  # (N, n)
        h, c = self.lstm(self.W_I(mean), (zeros, zeros))
        return h, c

    def recur(self, io: StepIO, state: FCState, a: torch.Tensor, keys: torch.Tensor,
              mask: torch.Tensor | None) -> Step:
        """The LSTM on E y_{t-1}; the map is attention=mean's uniform one (its context unread)."""
        h, c = state
        h_t, c_t = io.lstm(self.lstm, None, io.run(h), io.run(c))  # (n_t, n)
        h, c = io.put(h, h_t), io.put(c, c_t)
        att = self.attention(a, keys, h, mask)
        return Step((h, c), io.attention(att), (h_t,))

    def readout(self, emb: torch.Tensor, *parts: torch.Tensor) -> torch.Tensor:
        """logits = W_o dropout(h_t): (..., n) -> (..., V)."""
        return self.W_o(self.dropout(parts[0]))
