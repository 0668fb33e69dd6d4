"""The attention types that read the grid's layout (`attention=local`, `attention=location`), and reading orders.

    local      Luong local-p:  a dot/general score inside a window around a predicted 2-D centre p_t, times a Gaussian;
               centre=monotonic: Luong's local-m, the window's centre steps along the row-major reading order
    location   Chorowski et al. (2015): e_ti = w^T tanh(W_a a_i + W_h h + U f_i + b), f = conv(alpha_{t-1}), with
               their normalisations (softmax or smoothing, sharpening)

Both follow `captioning.models.attention_family`'s conventions (initial scale, masks, no per-batch state): the grid
travels in the tensor `prepare` returns.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from torch import nn

from captioning.base.constraints import Range, Size, constrained
from captioning.models.attention import Attention, AttentionOutput, attend, row_softmax, weighted
from captioning.models.attention_family import DotAttention, GeneralAttention, grid_positions, resolve_grid
from captioning.models.rows import rows_per_image

ReadingOrder = Literal["row", "column", "snake"]  # row-major; column-major; rows alternately left-right, right-left
Positive = Annotated[float, Range(gt=0)]


def reading_order(h: int, w: int, order: ReadingOrder = "row") -> torch.Tensor:
    """The row-major indices of the L = h * w regions in reading order (L,): every order starts at the top-left."""
    index = torch.arange(h * w).view(h, w)
    if order == "column":
        return index.t().reshape(-1)
    if order == "snake":
        index[1::2] = index[1::2].flip(1)
    return index.reshape(-1)


class LocalAttention(Attention):
    """Luong local attention on the 2-D grid: a window of half-width D_win around a centre p_t.

    centre=predictive, Luong's local-p (1-D): p_t = S sigmoid(v_p^T tanh(W_p h_t)); alpha_t(s) = align(h_t, a_s)
    exp(-(s - p_t)^2 / (2 sigma^2)) for |s - p_t| <= D_win (zero outside), align = softmax of the score over the
    window, sigma = D_win / 2. Adapted to the grid:
      - one centre per axis, p_t = (h_b - 1, w_b - 1) * sigmoid(v_p^T tanh(W_p h)) (v_p: P -> 2), a (row, column)
        point on image b's own 0-indexed grid (h_b, w_b), read from the mask, so padding never holds the centre;
      - the window is the square |row - p_row| <= D_win and |col - p_col| <= D_win (Luong's interval per axis),
        regions outside it (and padded ones) get exactly zero weight; it always holds a real region (D_win >= 1);
      - the Gaussian is isotropic in the Euclidean distance ||pos_i - p_t|| with sigma = D_win / 2;
      - Luong's product does not sum to 1; it is renormalised over the window, so alphas sum to 1 (the doubly
        stochastic term and attention maps assume it, and the context stays a convex combination). That is the
        masked softmax of score + log Gaussian over the window, which is how it is computed.
    The Gaussian carries the gradient to p_t (the window cut-off has none).

    centre=monotonic, Luong's local-m: p_t = t, the source position of step t. On the grid the centre is the t-th
    real region in reading order (row-major, top-left first; the last real region once t passes it), the window the
    same square, and alpha_t the softmax of the score over it (no Gaussian, no predictor: Luong's eq. 7 in the
    window). The centre travels in the decoder's state as the step's `carry`, a one-hot (N, L) on the centre region
    (all zeros before the first step), so decoding, beam search and export need no step counter.

    `score` is "general" or "dot". `prepare` appends each region's (row, column) as the last 2 channels of the keys:
    no grid state on the module.
    """

    @constrained
    def __init__(self, annotation_dim: int, hidden_dim: int, score: Literal["general", "dot"] = "general",
                 predictor_dim: Size = 128, half_width: Size = 3,
                 centre: Literal["predictive", "monotonic"] = "predictive"):
        super().__init__(annotation_dim, hidden_dim)
        scorers = {"general": GeneralAttention, "dot": DotAttention}
        self.scorer = scorers[score](annotation_dim, hidden_dim)
        self.monotonic = centre == "monotonic"
        self.reads_previous = self.monotonic  # local-m's centre follows the previous step's
        if not self.monotonic:
            self.W_p = nn.Linear(hidden_dim, predictor_dim, bias=False)
            self.v_p = nn.Linear(predictor_dim, 2, bias=False)  # (row, column) logits of the centre
        self.half_width, self.sigma = half_width, half_width / 2

    def reads_previous_because(self) -> str:
        return " with centre=monotonic (local-m)"

    def initial_carry(self, uniform: torch.Tensor) -> torch.Tensor:
        """local-m: no centre yet (zeros), so the first step's is the first real region; local-p carries alpha."""
        return torch.zeros_like(uniform) if self.monotonic else uniform

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """The scorer's keys with each region's (row, column) appended: (B, L, K + 2)."""
        B, L, _ = a.shape
        h, w = resolve_grid(L, grid)
        keys = self.scorer.prepare(a, grid, mask)  # (B, L, K)
        pos = grid_positions(h, w, a.device, keys.dtype).expand(B, L, 2)  # (L, 2) -> (B, L, 2)
        return torch.cat([keys, pos], dim=-1)  # (B, L, K + 2)

    def centre(self, h: torch.Tensor, extent: torch.Tensor) -> torch.Tensor:
        """p_t = (extent - 1) * sigmoid(v_p^T tanh(W_p h)): (N, 2) (row, column) for grids of extent (N, 2)."""
        return (extent - 1) * torch.sigmoid(self.v_p(torch.tanh(self.W_p(h))))  # (N, 2)

    def next_centre(self, pos: torch.Tensor, real: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
        """local-m: the one-hot (N, L) on the real region after the previous centre's (a one-hot (N, L), or zeros
        before the first step) in row-major order, the last real region once past it; real (B, L), k = N / B."""
        k = 1 if previous is None else rows_per_image(real.shape[0], previous.shape[0])
        real = real.repeat_interleave(k, dim=0)  # (N, L)
        rank = (real.cumsum(1) - 1).to(pos.dtype)  # (N, L): each real region's place among the real ones
        if previous is None:
            target = rank.new_zeros(real.shape[0])
        else:
            started = previous.sum(1) > 0  # (N,)
            target = torch.where(started, (previous * rank).sum(1) + 1, 0)  # (N,)
        target = torch.minimum(target, real.sum(1).to(pos.dtype) - 1)  # (N,)
        return (real & (rank == target.unsqueeze(1))).to(pos.dtype)  # (N, L)

    def window(self, pos: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Regions inside the window (N, L) and the log Gaussian -||pos_i - p_t||^2 / (2 sigma^2) (N, L),
        for region positions pos (B, L, 2) and centres p (N, 2), k = N / B per image."""
        B, L, _ = pos.shape
        offset = (pos.unsqueeze(1) - p.view(B, -1, 1, 2)).view(-1, L, 2)  # (B, k, L, 2) -> (N, L, 2)
        inside = (offset.abs() <= self.half_width).all(dim=-1)  # (N, L)
        return inside, -offset.pow(2).sum(-1) / (2 * self.sigma**2)  # (N, L)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        pos = keys[..., -2:]  # (B, L, 2)
        k = rows_per_image(a.shape[0], h.shape[0])
        scores = self.scorer.scores(keys[..., :-2], h)  # (N, L)
        if self.monotonic:
            real = torch.ones(pos.shape[:2], dtype=torch.bool, device=pos.device) if mask is None else mask
            carry = self.next_centre(pos, real, prev_alpha)  # (N, L) one-hot
            p = torch.bmm(carry.view(pos.shape[0], k, -1), pos).view(-1, 2)  # (N, 2): the centre's (row, column)
            inside = self.window(pos, p)[0]  # (N, L)
            out = attend(a, scores, inside & real.repeat_interleave(k, dim=0))
            out.carry = carry
            return out
        real = pos if mask is None else pos.masked_fill(~mask.unsqueeze(-1), -1)  # (B, L, 2)
        extent = (real.amax(dim=1) + 1).repeat_interleave(k, dim=0)  # (N, 2): each image's own (h_b, w_b)
        inside, log_gauss = self.window(pos, self.centre(h, extent))  # (N, L), (N, L)
        keep = inside if mask is None else inside & mask.repeat_interleave(k, dim=0)  # (N, L)
        return attend(a, scores + log_gauss, keep)


class LocationAttention(Attention):
    """Location-sensitive (hybrid) attention: e_ti = w^T tanh(W_a a_i + W_h h + U f_i + b), f = conv(alpha_{t-1}).

    f is a Conv2d with `num_filters` filters of `kernel_size` ("same" zero padding) over the previous alpha
    laid out on the (h, w) grid, flattened back to (B, L, k). The conv needs the grid layout at every step,
    so `prepare` returns the keys W_a a_i + b shaped (B, h, w, A): the layout travels in the tensor's shape
    (first dim is still the image), with no state on the module and no host sync per step.

    Normalisation (Chorowski et al. 2015, section 2.3), of the sharpened scores beta e_ti (`sharpening` beta, 1 by
    default; > 1 sharpens, < 1 flattens): `softmax` (the default) alpha_ti = exp(beta e_ti) / sum_j exp(beta e_tj);
    `smoothing` replaces the unbounded exponential by the logistic sigmoid, alpha_ti = sigmoid(beta e_ti) /
    sum_j sigmoid(beta e_tj), which keeps the weights from concentrating on one region. Both are over the real
    regions only (padded ones get exactly zero) and sum to 1.
    """

    reads_previous = True

    @constrained
    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: Size = 128,
                 num_filters: Size = 16, kernel_size: Size = 5,
                 normalization: Literal["softmax", "smoothing"] = "softmax", sharpening: Positive = 1.0):
        super().__init__(annotation_dim, hidden_dim)
        self.normalization, self.sharpening = normalization, sharpening
        self.W_a = nn.Linear(annotation_dim, attention_dim)  # carries the bias b
        self.W_h = nn.Linear(hidden_dim, attention_dim, bias=False)
        self.conv = nn.Conv2d(1, num_filters, kernel_size, padding="same", bias=False)  # a bias would cancel
        self.U = nn.Linear(num_filters, attention_dim, bias=False)
        self.w = nn.Linear(attention_dim, 1, bias=False)

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """W_a a_i + b once per image, laid out on the grid: (B, h, w, A)."""
        B, L, _ = a.shape
        h, w = resolve_grid(L, grid)
        return self.W_a(a).view(B, h, w, -1)  # (B, L, A) -> (B, h, w, A)

    def location_features(self, prev_alpha: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """f = conv(prev_alpha on the grid): (N, L) -> (N, L, k)."""
        f = self.conv(prev_alpha.reshape(-1, 1, *grid))  # (B, 1, h, w) -> (B, k, h, w)
        return f.flatten(2).transpose(1, 2)  # (B, k, L) -> (B, L, k)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        if keys.dim() != 4:
            raise ValueError(f"LocationAttention expects keys (B, h, w, A) from its prepare(), got {tuple(keys.shape)}")
        B, gh, gw, A = keys.shape
        k = rows_per_image(B, h.shape[0])
        if prev_alpha is None:  # uniform over the real regions, as the decoder's step 0
            real = a.new_ones(B, gh * gw) if mask is None else mask.to(a.dtype)  # (B, L)
            prev_alpha = (real / real.sum(1, keepdim=True)).repeat_interleave(k, dim=0)  # (N, L)
        f = self.location_features(prev_alpha, (gh, gw))  # (N, L, k_f)
        hidden = (keys.view(B, 1, gh * gw, A) + self.W_h(h).view(B, k, 1, A)  # (B, k, L, A)
                  + self.U(f).view(B, k, gh * gw, A))
        scores = self.w(torch.tanh(hidden)).view(-1, gh * gw)  # (B, k, L, A) -> (N, L)
        return weighted(a, self.normalize(scores, mask))

    def normalize(self, scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """alpha (N, L) from the scores (N, L): softmax or smoothing of beta e over the real regions (see the class)."""
        if self.sharpening != 1.0:
            scores = scores * self.sharpening
        if self.normalization == "softmax":
            return row_softmax(scores, mask)
        weights = torch.sigmoid(scores)  # (N, L)
        if mask is not None:
            L = scores.shape[1]
            weights = (weights.view(mask.shape[0], -1, L) * mask.unsqueeze(1).to(weights.dtype)).view(-1, L)
        return weights / weights.sum(1, keepdim=True)
