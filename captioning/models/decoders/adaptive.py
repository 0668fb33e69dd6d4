"""Adaptive attention with a visual sentinel (Lu et al., CVPR 2017, "Knowing when to look"), `decoder=adaptive`.

    V = ReLU(W_a A)  (L x n),   v_g = ReLU(W_b mean_i a_i)  (m)            per image
    x_t = [E y_{t-1}; v_g],     h_t, m_t = LSTM(x_t, (h_{t-1}, m_{t-1}))
    g_t = sigmoid(W_x x_t + W_h h_{t-1}),   s_t = g_t * tanh(m_t)           the visual sentinel
    z_t = w^T tanh(W_v V + W_g h_t 1^T),    z^s_t = w^T tanh(W_s s_t + W_g h_t)     (from the CURRENT h_t)
    alpha^_t = softmax([z_t; z^s_t]),       beta_t = alpha^_t[L + 1]        the sentinel's weight
    c^_t = beta_t s_t + (1 - beta_t) c_t,   c_t = sum_i alpha_ti v_i,   alpha_t = softmax(z_t)
    p(y_t | I, y_<t) = softmax(W_p dropout(c^_t + h_t))

The spatial attention (z_t, alpha_t, c_t over V) is conf/attention/soft.yaml's module built on V (its W_a, W_h and w
are the paper's W_v, W_g and w); the sentinel's score uses the same W_g and w with the decoder's own W_s. alpha^_t
restricted to the regions is (1 - beta_t) alpha_t, so beta_t = sigmoid(z^s_t - logsumexp_i z_ti) and alpha_t is the
soft attention over V: with beta_t forced to 0 the model is soft attention from h_t (tests/models/test_zoo.py).
The maps figures, attention correctness and the doubly stochastic term read are alpha_t (sums to 1); beta_t, how
much word t relied on the sentinel rather than the image, is the attention output's extra weight (`channels`,
one column), carried through greedy and beam search and export as channel-wise attention's weights are, and
reported per word as `sentinel` (captioning.inference). Other attention types do not give a score to put beside the
sentinel's: the decoder takes attention=soft only, and says so in one line.

`sentinel=false` is Lu et al.'s own ablation, their "spatial attention" model: the same LSTM, V and attention from
h_t, no sentinel (c^_t = c_t, no W_x, W_h, W_s), and no per-word sentinel weight.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from captioning.base.constraints import DropoutRate, Size, constrained
from captioning.models.attention import (
    Attention,
    AttentionOutput,
    SoftAttention,
    additive_scores,
    attention_name,
    weighted,
)
from captioning.models.decoders.base import mean_annotation
from captioning.models.decoders.recurrent import RecurrentDecoder
from captioning.models.decoders.transformed import Projection, TransformedAttention
from captioning.models.decoders.unroll import Spread, Step, StepIO

AdaptiveState = tuple[torch.Tensor, torch.Tensor]  # h, m (N, n) each


class SentinelAttention(TransformedAttention):
    """The spatial attention over V = ReLU(W_a a) (`prepare` gives [keys of V; V] per image), whose step also
    returns z_t's logsumexp (N, 1) as `channels` (the decoder turns it into beta_t)."""

    inner: SoftAttention

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        """alpha_t = softmax(z_t) over V from h_t, c_t = sum_i alpha_ti v_i, and logsumexp_i z_ti."""
        v, k = self.split(keys)
        z = self.inner.scores(k, h)  # (N, L)
        if mask is not None:
            B, L = mask.shape
            z = z.view(B, -1, L).masked_fill(~mask.unsqueeze(1), float("-inf")).view(-1, L)
        out = weighted(v, torch.softmax(z, dim=-1))
        out.channels = torch.logsumexp(z, dim=-1, keepdim=True)  # (N, 1)
        return out


class AdaptiveDecoder(RecurrentDecoder):
    """Lu et al. (2017): LSTM, visual sentinel and spatial attention from h_t (see the module)."""

    extra_weights = "sentinel"  # the attention output's `channels` column is beta_t

    @constrained
    def __init__(self, vocab_size: int, annotation_dim: int, attention: Callable[..., Attention],
                 embed_dim: Size = 64, hidden_dim: Size = 256, dropout: DropoutRate = 0.1, sentinel: bool = True):
        super().__init__()
        self.vocab_size, self.hidden_dim, self.sentinel = vocab_size, hidden_dim, sentinel
        if not sentinel:  # Lu et al.'s spatial attention model: nothing per word beside the map
            self.extra_weights = "channels"
        spatial = attention(annotation_dim=hidden_dim, hidden_dim=hidden_dim)
        if type(spatial) is not SoftAttention:
            raise ValueError(f"decoder=adaptive scores its visual sentinel beside the regions with the additive score "
                             f"of Lu et al. (2017): it takes attention=soft, not attention={attention_name(spatial)}")
        attend = SentinelAttention if sentinel else TransformedAttention  # without it: soft attention over V
        self.attention = attend(annotation_dim, hidden_dim, Projection(annotation_dim, hidden_dim), spatial)
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.W_b = nn.Linear(annotation_dim, embed_dim)  # v_g = ReLU(W_b mean a)
        self.lstm = nn.LSTMCell(2 * embed_dim, hidden_dim)  # [E y_{t-1}; v_g]
        if sentinel:
            self.W_x = nn.Linear(2 * embed_dim, hidden_dim)  # the sentinel's gate, with its bias
            self.W_hs = nn.Linear(hidden_dim, hidden_dim, bias=False)
            self.W_s = nn.Linear(hidden_dim, spatial.W_h.out_features, bias=False)
        self.W_p = nn.Linear(hidden_dim, vocab_size)
        self.dropout = nn.Dropout(dropout)

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> AdaptiveState:
        """Zero states, as Lu et al."""
        zeros = a.new_zeros(a.shape[0], self.hidden_dim)  # (N, n)
        return zeros, zeros.clone()

    def fixed_inputs(self, emb: torch.Tensor, a: torch.Tensor, mask: torch.Tensor | None,
                     spread: Spread) -> dict[nn.Module, torch.Tensor]:
        """x_t = [E y_{t-1}; v_g]: the LSTM's input and the sentinel gate's."""
        v_g = spread(torch.relu(self.W_b(mean_annotation(a, mask)[0])))  # (B, m) -> the rows' (P, m)
        x = torch.cat([emb, v_g.to(emb.dtype)], dim=1)
        return {self.lstm: x, self.W_x: x} if self.sentinel else {self.lstm: x}

    def sentinel_weight(self, s: torch.Tensor, h: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        """beta_t (N, 1) = sigmoid(z^s_t - logsumexp_i z_ti), z^s_t = w^T tanh(W_s s_t + W_g h_t)."""
        spatial = self.attention.inner
        z_s = additive_scores(self.W_s(s).unsqueeze(1), spatial.W_h(h), spatial.w.weight.view(-1), spatial.w.bias,
                              plain=spatial.plain_kernels)  # (N, 1): one key per row
        return torch.sigmoid(z_s - lse)

    def recur(self, io: StepIO, state: AdaptiveState, a: torch.Tensor, keys: torch.Tensor,
              mask: torch.Tensor | None) -> Step:
        """The LSTM and the sentinel from x_t, h_{t-1}; attention over V from h_t; c^_t mixes s_t and c_t."""
        h, m = state
        h_prev = io.run(h)
        h_t, m_t = io.lstm(self.lstm, None, h_prev, io.run(m))  # (n_t, n)
        if self.sentinel:
            s_t = torch.sigmoid(io.project(self.W_x) + io.linear(self.W_hs, h_prev)) * torch.tanh(m_t)
        h = io.put(h, h_t)
        att = self.attention(a, keys, h, mask)  # from h_t, every row of the running images
        run = io.attention(att)
        if not self.sentinel:  # c^_t = c_t
            return Step((h, io.put(m, m_t)), run, (run.context + h_t,))
        assert run.channels is not None
        beta = self.sentinel_weight(s_t, h_t, run.channels)  # (n_t, 1)
        c_hat = beta * s_t + (1 - beta) * run.context
        run = AttentionOutput(run.context, run.alpha, channels=beta)
        return Step((h, io.put(m, m_t)), run, (c_hat + h_t,))

    def readout(self, emb: torch.Tensor, *parts: torch.Tensor) -> torch.Tensor:
        """logits = W_p dropout(c^_t + h_t): (..., n) -> (..., V)."""
        return self.W_p(self.dropout(parts[0]))

