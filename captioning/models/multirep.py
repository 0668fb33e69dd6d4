"""Multi-representational attention (`attention=multirep`): one attention per representation of the image and a
learned softmax over the representations (the survey's "multi-representational" class: Kiela et al. 2018's dynamic
meta-embeddings, weighed per word with the decoder state as their context).

The annotations a (B, L, D) hold K representations of the same L regions side by side, D = D_1 + ... + D_K
(`encoder=multi`: one per encoder, on one grid). `representations` lists the widths; the model builder takes them
from the encoder when the config leaves it null (a single encoder: one representation). Representation k has the
paper's soft attention over its own slice a^k, with its own parameters:

    alpha^k = softmax_i(w_k^T tanh(W_a^k a^k_i + W_h^k h + b_k)),        z_k = sum_i alpha^k_i a^k_i          (D_k)
    s_k = u^T tanh(P_k z_k + W_r h + c),        beta = softmax_k(s)          (K representation weights per word)
    z = [beta_1 z_1; ...; beta_K z_K]                                        (D: the decoder's context)

The decoder's weights on z make this the weighted sum of the representations, each projected to the decoder's
sizes (W z = sum_k beta_k W^k z_k, W^k the block of W that reads z_k: dynamic meta-embeddings' sum of projected
embeddings, the projections the decoder's own). alpha = sum_k beta_k alpha^k sums to 1 over the real regions: it is
what figures, attention correctness and the doubly stochastic term read. beta (N, K) is the output's `channels`,
carried beside each word's map through decoding, beam search, the API's results and the export.

With one representation there is nothing to weigh: beta is 1, the module has no scorer (P, W_r, u), and it is
`attention=soft` with the same parameters drawn in the same order: the same model, bit for bit.

Each representation's attention has `attention_dim` hidden units; by default (null) `total_attention_dim` (128, soft
attention's) shared equally among the K representations: one representation gets soft attention's 128, two get 64
each, so the K hidden layers a step computes together are the size of soft attention's one.
"""

from __future__ import annotations

from typing import Annotated, cast

import torch
from torch import nn

from captioning.base.constraints import Range, Size, constrained
from captioning.models.attention import Attention, AttentionOutput, SoftAttention, attend


class MultiRepAttention(Attention):
    """Soft attention over each representation's channels, weighed by a softmax over representations (see the
    module)."""

    @constrained
    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: Size | None = None, score_dim: Size = 64,
                 representations: Annotated[tuple[int, ...], Range(ge=1)] | None = None,
                 total_attention_dim: Size = 128):
        super().__init__(annotation_dim, hidden_dim)
        widths = tuple(int(w) for w in representations) if representations else (annotation_dim,)
        # each representation's attention's hidden size; by default soft attention's 128 shared among them
        attention_dim = attention_dim or max(1, total_attention_dim // len(widths))
        if sum(widths) != annotation_dim:
            raise ValueError(f"attention=multirep: the representations' widths {list(widths)} add up to "
                             f"{sum(widths)}, not to the annotations' {annotation_dim} channels (decoder=transformer, "
                             f"aoa and adaptive attend over their own projection of the regions, not the encoder's "
                             f"representations: use sat, luong, updown, att2in or att2all with encoder=multi)")
        self.widths, self.attention_dim = widths, attention_dim
        self.reps = nn.ModuleList(SoftAttention(w, hidden_dim, attention_dim) for w in widths)
        self.P = nn.ModuleList(nn.Linear(w, score_dim, bias=False) for w in widths) if len(widths) > 1 else None
        self.W_r = nn.Linear(hidden_dim, score_dim) if len(widths) > 1 else None  # carries c
        self.u = nn.Linear(score_dim, 1, bias=False) if len(widths) > 1 else None  # a bias would cancel

    def _reps(self) -> list[SoftAttention]:
        return [cast(SoftAttention, rep) for rep in self.reps]

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Each representation's keys W_a^k a^k_i + b_k side by side: (B, L, K A)."""
        parts = a.split(self.widths, dim=-1)
        return torch.cat([rep.prepare(x) for rep, x in zip(self._reps(), parts)], dim=-1)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        parts = a.split(self.widths, dim=-1)
        key_parts = keys.split(self.attention_dim, dim=-1)
        outs = [attend(x, rep.scores(k, h), mask) for rep, x, k in zip(self._reps(), parts, key_parts)]
        if self.P is None or self.W_r is None or self.u is None:
            return outs[0]  # one representation: soft attention
        q = self.W_r(h)  # (N, S)
        s = torch.cat([self.u(torch.tanh(P(o.context) + q)) for P, o in zip(self.P, outs)], dim=1)  # (N, K)
        beta = torch.softmax(s, dim=1)  # (N, K)
        context = torch.cat([beta[:, k:k + 1] * o.context for k, o in enumerate(outs)], dim=1)  # (N, D)
        alpha = torch.bmm(beta.unsqueeze(1), torch.stack([o.alpha for o in outs], dim=1)).squeeze(1)  # (N, L)
        return AttentionOutput(context, alpha, channels=beta)
