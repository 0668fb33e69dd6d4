"""More attention scores behind the same interface as `SoftAttention` (swap them with `attention=<name>`).

    dot        Luong dot:      e_ti = h^T (W_a a_i) / sqrt(n)          a projected to h's size, scaled dot product
    general    Luong general:  e_ti = h^T W a_i + u^T a_i              full bilinear form of [h; 1] and [a_i; 1]
    concat     Luong concat:   e_ti = v^T tanh(W_a a_i + W_h h + b)    i.e. v^T tanh(W [h; a_i] + b), W split in two
    local      Luong local-p:  general/dot score + log N(pos_i; p_t, sigma^2 I) on the 2-D grid
    location   Chorowski et al. (2015): e_ti = w^T tanh(W_a a_i + W_h h + U f_i + b), f = conv(alpha_{t-1})
    multihead  Vaswani et al. (2017): per-head softmax(q k^T / sqrt(d_k)) v, heads concatenated, projected to D

Here h is the decoder state h_{t-1} (B, n) and a_i the annotation vectors (B, L, D). Every module gives padded
regions (mask False) exactly zero weight through `masked_softmax`, and no module keeps per-batch state: whatever
depends on the image (projections, grid positions, grid layout) travels in the tensor `prepare` returns.
Parameters whose effect is constant over regions (biases that cancel in the softmax) are left out, so every
parameter gets a gradient.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from captioning.models.attention import Attention, AttentionOutput, masked_softmax


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


def _attend(a: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor | None) -> AttentionOutput:
    """alpha = masked softmax of the scores (B, L); context z = sum_i alpha_i a_i (B, D)."""
    alpha = masked_softmax(scores, mask)  # (B, L)
    context = torch.bmm(alpha.unsqueeze(1), a).squeeze(1)  # (B, 1, L) @ (B, L, D) -> (B, D)
    return AttentionOutput(context, alpha)


class DotAttention(Attention):
    """Luong dot score e_ti = h^T (W_a a_i) / sqrt(n): a projected to h's size, then a plain (scaled) dot product.

    With `project=False` it is Luong's literal h^T a_i (needs annotation_dim == hidden_dim) and has no parameters.
    Unlike `GeneralAttention` there is no region term u^T a_i: the score is purely the query-key match, and
    the 1/sqrt(n) scale (on by default) keeps the scores O(1) at initialisation.
    """

    def __init__(self, annotation_dim: int, hidden_dim: int, project: bool = True, scale: bool = True):
        super().__init__(annotation_dim, hidden_dim)
        if not project and annotation_dim != hidden_dim:
            raise ValueError(f"project=False needs annotation_dim == hidden_dim, got {annotation_dim} != {hidden_dim}")
        self.W_a = nn.Linear(annotation_dim, hidden_dim, bias=False) if project else nn.Identity()
        self.scale = 1.0 / math.sqrt(hidden_dim) if scale else 1.0

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """W_a a_i once per image: (B, L, n)."""
        return self.W_a(a)  # (B, L, D) -> (B, L, n)

    def scores(self, keys: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Unnormalised e_t (B, L) from keys (B, L, n) and h (B, n)."""
        return torch.bmm(keys, h.unsqueeze(2)).squeeze(2) * self.scale  # (B, L, n) @ (B, n, 1) -> (B, L)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        return _attend(a, self.scores(keys, h), mask)


class GeneralAttention(Attention):
    """Luong general score as a full bilinear form: e_ti = [h; 1]^T W~ [a_i; 1] = h^T W a_i + u^T a_i (+ const).

    The terms of the form that depend on h only (h^T w, c) are the same for every region and cancel in the
    softmax, so they are dropped; what remains beyond `DotAttention` is the query-independent region prior
    u^T a_i (how salient region i is whatever the decoder state) and no scaling. Without that term the two
    score the same function class (h^T M a_i); `region_bias=False` gives exactly that, unscaled.
    """

    def __init__(self, annotation_dim: int, hidden_dim: int, region_bias: bool = True):
        super().__init__(annotation_dim, hidden_dim)
        self.W = nn.Linear(annotation_dim, hidden_dim, bias=False)  # the bilinear matrix, applied to a
        self.u = nn.Linear(annotation_dim, 1, bias=False) if region_bias else None

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """[W a_i; u^T a_i] once per image: (B, L, n + 1) (the last channel is zero without a region bias)."""
        prior = self.u(a) if self.u is not None else a.new_zeros(*a.shape[:2], 1)  # (B, L, 1)
        return torch.cat([self.W(a), prior], dim=-1)  # (B, L, n + 1)

    def scores(self, keys: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Unnormalised e_t (B, L) from keys (B, L, n + 1) and h (B, n)."""
        return torch.bmm(keys[..., :-1], h.unsqueeze(2)).squeeze(2) + keys[..., -1]  # (B, L)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        return _attend(a, self.scores(keys, h), mask)


class ConcatAttention(Attention):
    """Luong concat score e_ti = v^T tanh(W [h; a_i] + b), with W = [W_h, W_a] split so W_a a_i + b is cached.

    This is the same MLP form as the paper's `SoftAttention` (Bahdanau-style additive attention); it is kept
    so the Luong family is complete, and has no output bias (it would cancel in the softmax).
    """

    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: int = 512):
        super().__init__(annotation_dim, hidden_dim)
        self.W_a = nn.Linear(annotation_dim, attention_dim)  # the a-part of W, carries b
        self.W_h = nn.Linear(hidden_dim, attention_dim, bias=False)  # the h-part of W
        self.v = nn.Linear(attention_dim, 1, bias=False)

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """W_a a_i + b once per image: (B, L, A)."""
        return self.W_a(a)  # (B, L, D) -> (B, L, A)

    def scores(self, keys: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Unnormalised e_t (B, L) from keys (B, L, A) and h (B, n)."""
        return self.v(torch.tanh(keys + self.W_h(h).unsqueeze(1))).squeeze(-1)  # (B, L, A) -> (B, L)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        return _attend(a, self.scores(keys, h), mask)


class LocalAttention(Attention):
    """Luong local-p on the 2-D grid: e_ti = score(h, a_i) - ||pos_i - p_t||^2 / (2 sigma^2), then a softmax.

    The centre p_t = (h_b - 1, w_b - 1) * sigmoid(W_p tanh(V_p h)) is a (row, column) point inside image b's
    own grid (h_b, w_b), read from the mask, so padded images are not pushed into their padding. Adding the
    log-Gaussian before the masked softmax equals multiplying the softmax by the Gaussian and renormalising
    over the unmasked regions (Luong's window is not renormalised and is cut at |pos - p_t| <= D; here it
    is soft). sigma is `sigma` regions if given, else `sigma_scale * max(h_b, w_b)` (a quarter of the grid).
    `score` is the alignment score: "general" or "dot". `prepare` appends the 2 position coordinates of
    each region as the last 2 channels of the keys, so nothing about the grid is stored on the module.
    """

    def __init__(self, annotation_dim: int, hidden_dim: int, score: str = "general", predictor_dim: int = 512,
                 sigma: float | None = None, sigma_scale: float = 0.25):
        super().__init__(annotation_dim, hidden_dim)
        scorers = {"general": GeneralAttention, "dot": DotAttention}
        if score not in scorers:
            raise ValueError(f"score must be one of {sorted(scorers)}, got {score!r}")
        if (sigma is not None and sigma <= 0) or sigma_scale <= 0:
            raise ValueError(f"sigma and sigma_scale must be positive, got {sigma} and {sigma_scale}")
        self.scorer = scorers[score](annotation_dim, hidden_dim)
        self.V_p = nn.Linear(hidden_dim, predictor_dim, bias=False)
        self.W_p = nn.Linear(predictor_dim, 2)  # (row, column) logits of the centre
        self.sigma, self.sigma_scale = sigma, sigma_scale

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """The scorer's keys with each region's (row, column) appended: (B, L, K + 2)."""
        B, L, _ = a.shape
        h, w = resolve_grid(L, grid)
        keys = self.scorer.prepare(a, grid)  # (B, L, K)
        pos = grid_positions(h, w, a.device, keys.dtype).expand(B, L, 2)  # (L, 2) -> (B, L, 2)
        return torch.cat([keys, pos], dim=-1)  # (B, L, K + 2)

    def centre(self, h: torch.Tensor, extent: torch.Tensor) -> torch.Tensor:
        """p_t = (extent - 1) * sigmoid(W_p tanh(V_p h)): (B, 2) (row, column) for grids of extent (B, 2)."""
        return (extent - 1) * torch.sigmoid(self.W_p(torch.tanh(self.V_p(h))))  # (B, 2)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        pos = keys[..., -2:]  # (B, L, 2)
        real = pos if mask is None else pos.masked_fill(~mask.unsqueeze(-1), -1)  # (B, L, 2)
        extent = real.amax(dim=1) + 1  # (B, 2): each image's own (h_b, w_b)
        p = self.centre(h, extent)  # (B, 2)
        sigma = extent.amax(dim=1) * self.sigma_scale if self.sigma is None else extent.new_full(
            extent.shape[:1], self.sigma)  # (B,)
        dist2 = (pos - p.unsqueeze(1)).pow(2).sum(-1)  # (B, L, 2) -> (B, L)
        log_window = -dist2 / (2 * sigma.unsqueeze(1) ** 2)  # (B, L)
        return _attend(a, self.scorer.scores(keys[..., :-2], h) + log_window, mask)


class LocationAttention(Attention):
    """Location-sensitive (hybrid) attention: e_ti = w^T tanh(W_a a_i + W_h h + U f_i + b), f = conv(alpha_{t-1}).

    f is a Conv2d with `num_filters` filters of `kernel_size` ("same" zero padding) over the previous alpha
    laid out on the (h, w) grid, flattened back to (B, L, k). The conv needs the grid layout at every step,
    so `prepare` returns the keys W_a a_i + b shaped (B, h, w, A): the layout travels in the tensor's shape
    (first dim is still the image), with no state on the module and no host sync per step.
    """

    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: int = 512, num_filters: int = 16,
                 kernel_size: int = 5):
        super().__init__(annotation_dim, hidden_dim)
        if kernel_size < 1 or num_filters < 1:
            raise ValueError(f"kernel_size and num_filters must be >= 1, got {kernel_size} and {num_filters}")
        self.W_a = nn.Linear(annotation_dim, attention_dim)  # carries the bias b
        self.W_h = nn.Linear(hidden_dim, attention_dim, bias=False)
        self.conv = nn.Conv2d(1, num_filters, kernel_size, padding="same", bias=False)  # a bias would cancel
        self.U = nn.Linear(num_filters, attention_dim, bias=False)
        self.w = nn.Linear(attention_dim, 1, bias=False)

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """W_a a_i + b once per image, laid out on the grid: (B, h, w, A)."""
        B, L, _ = a.shape
        h, w = resolve_grid(L, grid)
        return self.W_a(a).view(B, h, w, -1)  # (B, L, A) -> (B, h, w, A)

    def location_features(self, prev_alpha: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """f = conv(prev_alpha on the grid): (B, L) -> (B, L, k)."""
        f = self.conv(prev_alpha.reshape(-1, 1, *grid))  # (B, 1, h, w) -> (B, k, h, w)
        return f.flatten(2).transpose(1, 2)  # (B, k, L) -> (B, L, k)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        if keys.dim() != 4:
            raise ValueError(f"LocationAttention expects keys (B, h, w, A) from its prepare(), got {tuple(keys.shape)}")
        B, gh, gw, A = keys.shape
        if prev_alpha is None:  # uniform over the real regions, as the decoder's step 0
            real = a.new_ones(B, gh * gw) if mask is None else mask.to(a.dtype)  # (B, L)
            prev_alpha = real / real.sum(1, keepdim=True)
        f = self.location_features(prev_alpha, (gh, gw))  # (B, L, k)
        hidden = keys.reshape(B, gh * gw, A) + self.W_h(h).unsqueeze(1) + self.U(f)  # (B, L, A)
        return _attend(a, self.w(torch.tanh(hidden)).squeeze(-1), mask)  # (B, L, A) -> (B, L)


class MultiHeadAttention(Attention):
    """Scaled dot-product multi-head attention with the query from h and keys/values from a, projected back to D.

    Head j: w_j = softmax(q_j k_j^T / sqrt(d_k)) over regions, c_j = w_j V_j; context = W_o [c_1; ...; c_H] (B, D).
    The returned alpha is the mean of the heads' weights (B, L): it still sums to 1, is 0 on padded regions and
    can be drawn like any other map, but the context is not sum_i alpha_i a_i (values are projected per head).
    """

    def __init__(self, annotation_dim: int, hidden_dim: int, num_heads: int = 8, head_dim: int = 64):
        super().__init__(annotation_dim, hidden_dim)
        if num_heads < 1 or head_dim < 1:
            raise ValueError(f"num_heads and head_dim must be >= 1, got {num_heads} and {head_dim}")
        self.num_heads, self.head_dim = num_heads, head_dim
        inner = num_heads * head_dim
        self.W_q = nn.Linear(hidden_dim, inner)
        self.W_k = nn.Linear(annotation_dim, inner, bias=False)  # a key bias would cancel in the softmax
        self.W_v = nn.Linear(annotation_dim, inner)
        self.W_o = nn.Linear(inner, annotation_dim)

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """Keys and values of all heads once per image: (B, L, 2 * H * d_k)."""
        return torch.cat([self.W_k(a), self.W_v(a)], dim=-1)  # (B, L, 2 * H * d_k)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        B, L, _ = keys.shape
        H, dk = self.num_heads, self.head_dim
        k, v = keys.view(B, L, 2, H, dk).permute(2, 0, 3, 1, 4)  # (2, B, H, L, d_k)
        q = self.W_q(h).view(B, H, dk, 1)  # (B, H, d_k, 1)
        scores = torch.matmul(k, q).squeeze(-1) / math.sqrt(dk)  # (B, H, L, d_k) @ (B, H, d_k, 1) -> (B, H, L)
        weights = masked_softmax(scores, None if mask is None else mask.unsqueeze(1))  # (B, H, L)
        heads = torch.matmul(weights.unsqueeze(2), v).squeeze(2)  # (B, H, 1, L) @ (B, H, L, d_k) -> (B, H, d_k)
        context = self.W_o(heads.reshape(B, H * dk))  # (B, H * d_k) -> (B, D)
        return AttentionOutput(context, weights.mean(dim=1))  # alpha (B, L): mean over heads
