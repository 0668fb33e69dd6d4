"""Channel-wise (multi-dimensional) attention: SCA-CNN (Chen et al., CVPR 2017), `attention=channel`.

SCA-CNN weighs the D channels of the annotations as well as the L regions. From a per-channel summary v (D,) of the
features and the decoder state h, the channel score of channel c is the paper's eq. 8 with one k-vector per channel:

    b_c = tanh(v_c w_c + b + W_hc h)  (k),      e_c = w'^T b_c,      beta = softmax_c(e)          (channel weights)

and the features are scaled by gamma = D beta, so that uniform channel weights (beta_c = 1/D, what all-zero score
weights w' give) leave every a_i unchanged: gamma is computed as exp(e - max e) / mean_c exp(e_c - max e), which is
exactly 1 for equal scores. The spatial attention is the paper's soft attention (`attention=soft`'s module:
w^T tanh(W_a x_i + W_h h + b)). `order`:

    cs   channel then spatial (SCA-CNN's C-S): v = the masked mean of each channel of a; x_i = gamma * a_i;
         alpha = soft attention over x (its keys W_a x_i computed at every step, as they change with gamma);
         z = sum_i alpha_i x_i
    sc   spatial then channel (S-C): alpha = soft attention over a; z_s = sum_i alpha_i a_i; v = the mean of each
         channel of the spatially weighted features alpha_i a_i over the real regions (z_s / L_real);
         z = gamma * z_s
    c    channel only: alpha uniform over the real regions (no spatial attention); v = the masked mean;
         z = gamma * v

With zero channel score weights (w' = 0) cs and sc compute what attention=soft computes with the same spatial
weights, bit for bit at one row per image; c computes attention=mean's. The spatial map alpha is what figures and
attention correctness read; beta (N, D), summing to 1, is the output's `channels`, which decoding, beam search, the
API's results and the export carry beside each word's map.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from captioning.base.constraints import Size, constrained
from captioning.models.attention import Attention, AttentionOutput, SoftAttention, additive_scores, row_softmax
from captioning.models.decoders.base import mean_annotation
from captioning.models.rows import rows_per_image

ChannelOrder = Literal["cs", "sc", "c"]


class ChannelAttention(Attention):
    """SCA-CNN's channel-wise attention with (cs, sc) or without (c) spatial attention (see the module)."""

    @constrained
    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: Size = 128, channel_dim: Size = 16,
                 order: ChannelOrder = "cs"):
        super().__init__(annotation_dim, hidden_dim)
        self.order = order
        # The spatial attention first, so that its weights draw as attention=soft's from the same seed.
        self.spatial = SoftAttention(annotation_dim, hidden_dim, attention_dim) if order != "c" else None
        self.w_c = nn.Parameter(torch.empty(channel_dim).uniform_(-1, 1))  # each channel's value times w_c ...
        self.b_c = nn.Parameter(torch.zeros(channel_dim))  # ... plus b (k)
        self.W_hc = nn.Linear(hidden_dim, channel_dim, bias=False)
        self.w_out = nn.Linear(channel_dim, 1, bias=False)  # w': a bias would cancel in the softmax over channels

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """cs and sc: the spatial attention's keys W_a a_i + b (B, L, A) (cs recomputes them per step but needs them
        for nothing else: it keeps a itself); c: a."""
        return self.spatial.prepare(a, grid, mask) if self.order == "sc" and self.spatial is not None else a

    def channel_weights(self, v: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """beta (N, D), the softmax of the channel scores, and gamma = D beta (N, D), exactly 1 for equal scores,
        from the per-channel summary v (N, D) and h (N, n)."""
        keys = v.unsqueeze(-1) * self.w_c + self.b_c  # (N, D, k): one k-vector per channel
        scores = additive_scores(keys, self.W_hc(h), self.w_out.weight.view(-1), plain=self.plain_kernels)  # (N, D)
        e = torch.exp(scores - scores.amax(dim=1, keepdim=True))  # (N, D)
        return e / e.sum(dim=1, keepdim=True), e / e.mean(dim=1, keepdim=True)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        B, L, D = a.shape
        N = h.shape[0]
        k = rows_per_image(B, N)
        rows = None if mask is None else mask.repeat_interleave(k, dim=0)  # (N, L)
        if self.order == "sc":
            assert self.spatial is not None
            alpha = row_softmax(self.spatial.scores(keys, h), mask)  # (N, L)
            z_s = torch.bmm(alpha.view(B, k, L), a).view(N, D)  # (N, D)
            real = L if rows is None else rows.sum(1, keepdim=True).clamp(min=1).to(a.dtype)  # (N, 1) or L
            beta, gamma = self.channel_weights(z_s / real, h)
            return AttentionOutput(gamma * z_s, alpha, channels=beta)
        mean, uniform = mean_annotation(a, mask)  # (B, D), (B, L): the masked mean of each channel
        beta, gamma = self.channel_weights(mean.repeat_interleave(k, dim=0), h)  # (N, D) each
        if self.order == "c":
            return AttentionOutput(gamma * mean.repeat_interleave(k, dim=0), uniform.repeat_interleave(k, dim=0),
                                   channels=beta)
        assert self.spatial is not None
        x = (a.unsqueeze(1) * gamma.view(B, k, 1, D)).view(N, L, D)  # (N, L, D): each row's channel-weighted a
        alpha = row_softmax(self.spatial.scores(self.spatial.prepare(x), h), rows)  # (N, L), one row per x
        context = torch.bmm(alpha.unsqueeze(1), x).squeeze(1)  # (N, D)
        return AttentionOutput(context, alpha, channels=beta)
