"""More attention scores behind the same interface as `SoftAttention` (swap them with `attention=<name>`).

    dot        Luong dot:      e_ti = h^T a_i / sqrt(n)           (a_i projected to h's size, W_a a_i, only if D != n)
    general    Luong general:  e_ti = h^T W_a a_i / sqrt(n)
    concat     Luong concat:   e_ti = v^T tanh(W_a [h; a_i])       the paper's soft score without its bias b
    local      Luong local-p:  a dot/general score inside a window around a predicted 2-D centre p_t, times a Gaussian
    location   Chorowski et al. (2015): e_ti = w^T tanh(W_a a_i + W_h h + U f_i + b), f = conv(alpha_{t-1})
    multihead  Vaswani et al. (2017): per-head softmax(q k^T / sqrt(d_k)) v, heads concatenated, projected to D
    mean       the no-attention control: alpha uniform over the real regions at every step, z the masked mean
    local-m    `local` with centre=monotonic: Luong's local-m, the window's centre steps along the reading order

h (N, n) is the state the decoder attends from (k = N / B rows per image, see `captioning.models.attention`):
h_{t-1} under decoder=sat (Xu et al.: the context enters the LSTM), h_t under decoder=luong (Luong et al.: attention
after the LSTM step, the context feeds the output). The Luong scores are Luong's formulas with nothing added; what
makes a model Luong's is that architecture, not the score.

No score starts saturated: dot and general divide by sqrt(n), the length of their dot product, so with PyTorch's
default init of W_a (entries of variance 1/(3D)) the scores' initial variance over regions is about
E[h^2] Var(a_i) / 3, O(1) whatever n and D (0.04 for ReLU annotations and tanh states). Unscaled it grows like n:
at the paper's n = 1800 a standard deviation of about 9, entropy 0.7 against ln 196 = 5.3, near one-hot attention
that starves its gradients. tests/models/test_attention_family.py checks, at the paper's sizes (L = 196,
D = 512, n = 1800) with ReLU annotations and tanh states, that every type's initial attention entropy is within
10% of uniform's ln L (local-p: of its window's). Every module gives padded regions (mask False) exactly zero
weight through `masked_softmax`, and none keeps per-batch state: whatever depends on the image (projections, grid
positions) travels in the tensor `prepare` returns. Terms constant over regions (they cancel in the softmax) are
left out, so every parameter gets a gradient.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import torch
from torch import nn

from captioning.base.constraints import Range, Size, constrained
from captioning.models.attention import (
    Attention,
    AttentionOutput,
    additive_scores,
    attend,
    masked_softmax,
    row_softmax,
    weighted,
)
from captioning.models.rows import rows_per_image


def resolve_grid(num_regions: int, grid: tuple[int, int] | None) -> tuple[int, int]:
    """The (h, w) layout of L regions: `grid` if given (checked), else a square sqrt(L) x sqrt(L) grid."""
    if grid is None:
        side = math.isqrt(num_regions)
        if side * side != num_regions:
            raise ValueError(f"cannot infer a square grid from L={num_regions} regions (not a perfect square); "
                             "pass grid=(h, w) to prepare()")
        return side, side
    h, w = int(grid[0]), int(grid[1])
    if h * w != num_regions:
        raise ValueError(f"grid {(h, w)} has {h * w} regions but the annotations have L={num_regions}")
    return h, w


def grid_positions(h: int, w: int, device: torch.device | None = None,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(row, column) of each of the L = h * w regions in row-major order: (L, 2)."""
    rows = torch.arange(h, device=device, dtype=dtype).repeat_interleave(w)  # (L,)
    cols = torch.arange(w, device=device, dtype=dtype).repeat(h)  # (L,)
    return torch.stack([rows, cols], dim=1)  # (L, 2)


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


class MeanAttention(Attention):
    """The no-attention control (`attention=mean`): alpha_t uniform over the real regions, z_t their mean, every step.

    No parameters and nothing read from h: every word gets the one fixed context, the masked mean annotation (the
    plain encoder-decoder of Show and Tell, under the same decoder as the attention it is compared with). Its maps
    are uniform, so its attention correctness is the uniform baseline's (experiments/uniform_baseline.py).
    """

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        return attend(a, a.new_zeros(h.shape[0], a.shape[1]), mask)  # softmax of equal scores: uniform


class DotAttention(Attention):
    """Luong dot score e_ti = h^T a_i / sqrt(n), with a_i first projected to h's size (W_a a_i) only when D != n.

    Luong's dot has no parameters because his h and h_s have the same size; annotations (D = 512) and the paper's
    LSTM state (n = 1800) do not, so a learned W_a (no bias) maps a_i into h's space, once per image. With that
    projection dot computes exactly `GeneralAttention`'s h^T W_a a_i: the two differ only when D == n, where dot
    is the parameter-free h^T a_i. `scale=False` drops the 1/sqrt(n) (Luong's literal, unscaled score).
    """

    always_project = False  # GeneralAttention: W_a whatever the sizes

    def __init__(self, annotation_dim: int, hidden_dim: int, scale: bool = True):
        super().__init__(annotation_dim, hidden_dim)
        project = self.always_project or annotation_dim != hidden_dim
        self.W_a = nn.Linear(annotation_dim, hidden_dim, bias=False) if project else nn.Identity()
        self.scale = 1.0 / math.sqrt(hidden_dim) if scale else 1.0

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """W_a a_i (or a_i) once per image: (B, L, n)."""
        return self.W_a(a)  # (B, L, D) -> (B, L, n)

    def scores(self, keys: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Unnormalised e_t (N, L) from keys (B, L, n) and h (N, n), k = N / B rows per image."""
        B, L, n = keys.shape
        e = torch.bmm(h.view(B, -1, n), keys.transpose(1, 2))  # (B, k, n) @ (B, n, L) -> (B, k, L)
        return e.view(-1, L) * self.scale  # (N, L)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        return attend(a, self.scores(keys, h), mask)


class GeneralAttention(DotAttention):
    """Luong general score e_ti = h^T W_a a_i / sqrt(n): a learned bilinear form, W_a (n x D) with no bias.

    Nothing else is added (no region prior u^T a_i). At D != n this is the same computation as `DotAttention`
    (see there); `scale=False` drops the 1/sqrt(n) (Luong's literal score, saturated at init for large n).
    """

    always_project = True


class ConcatAttention(Attention):
    """Luong concat score e_ti = v^T tanh(W_a [h; a_i]), with W_a = [W_h, W_x] split so W_x a_i is cached per image.

    This is the paper's `SoftAttention` score w^T tanh(W_a a_i + W_h h + b) without the bias b inside the tanh
    (Luong's formula has none, and v's bias would cancel in the softmax): Bahdanau's additive score and Luong's
    concat are the same function class up to that b. `attention=concat` therefore differs from `attention=soft`
    by the architecture it is placed in (decoder=luong: scored from h_t after the LSTM step), not by the score.
    """

    @constrained
    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: Size = 128):
        super().__init__(annotation_dim, hidden_dim)
        self.W_x = nn.Linear(annotation_dim, attention_dim, bias=False)  # the a-part of W_a
        self.W_h = nn.Linear(hidden_dim, attention_dim, bias=False)  # the h-part of W_a
        self.v = nn.Linear(attention_dim, 1, bias=False)

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """W_x a_i once per image: (B, L, A)."""
        return self.W_x(a)  # (B, L, D) -> (B, L, A)

    def scores(self, keys: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Unnormalised e_t (N, L) from keys (B, L, A) and h (N, n)."""
        return additive_scores(keys, self.W_h(h), self.v.weight.view(-1), plain=self.plain_kernels)  # (N, L)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        return attend(a, self.scores(keys, h), mask)


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


class MultiHeadAttention(Attention):
    """Scaled dot-product multi-head attention with the query from h and keys/values from a, projected back to D.

    Head j: w_j = softmax(q_j k_j^T / sqrt(d_k)) over regions, c_j = w_j V_j; context = W_o [c_1; ...; c_H] (N, D).
    The returned alpha is the mean of the heads' weights (N, L): it still sums to 1, is 0 on padded regions and
    can be drawn like any other map, but the context is not sum_i alpha_i a_i (values are projected per head).
    """

    @constrained
    def __init__(self, annotation_dim: int, hidden_dim: int, num_heads: Size = 4,
                 head_dim: Size = 32):
        super().__init__(annotation_dim, hidden_dim)
        self.num_heads, self.head_dim = num_heads, head_dim
        inner = num_heads * head_dim
        self.W_q = nn.Linear(hidden_dim, inner)
        self.W_k = nn.Linear(annotation_dim, inner, bias=False)  # a key bias would cancel in the softmax
        self.W_v = nn.Linear(annotation_dim, inner)
        self.W_o = nn.Linear(inner, annotation_dim)

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Keys and values of all heads once per image: (B, L, 2 * H * d_k)."""
        return torch.cat([self.W_k(a), self.W_v(a)], dim=-1)  # (B, L, 2 * H * d_k)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        B, L, _ = keys.shape
        H, dk, N = self.num_heads, self.head_dim, h.shape[0]
        k, v = keys.view(B, L, 2, H, dk).permute(2, 0, 3, 1, 4)  # (2, B, H, L, d_k)
        q = self.W_q(h).view(B, -1, H, dk).transpose(1, 2)  # (N, H * d_k) -> (B, H, r, d_k), r rows per image
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(dk)  # (B, H, r, d_k) @ (B, H, d_k, L) -> (B, H, r, L)
        weights = masked_softmax(scores, None if mask is None else mask[:, None, None])  # (B, H, r, L)
        heads = torch.matmul(weights, v)  # (B, H, r, L) @ (B, H, L, d_k) -> (B, H, r, d_k)
        context = self.W_o(heads.transpose(1, 2).reshape(N, H * dk))  # (B, r, H * d_k) -> (N, D)
        alpha = weights.mean(dim=1).reshape(N, L)  # (N, L): the mean over heads
        return AttentionOutput(context, alpha, heads=weights.transpose(1, 2).reshape(N, H, L))  # heads (N, H, L)
