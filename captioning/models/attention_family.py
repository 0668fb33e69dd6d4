"""More attention scores behind the same interface as `SoftAttention` (swap them with `attention=<name>`).

    dot        Luong dot:      e_ti = h^T a_i / sqrt(n)           (a_i projected to h's size, W_a a_i, only if D != n)
    general    Luong general:  e_ti = h^T W_a a_i / sqrt(n)
    concat     Luong concat:   e_ti = v^T tanh(W_a [h; a_i])       the paper's soft score without its bias b
    multihead  Vaswani et al. (2017): per-head softmax(q k^T / sqrt(d_k)) v, heads concatenated, projected to D
    mean       the no-attention control: alpha uniform over the real regions at every step, z the masked mean

The types that read the grid's layout (local-p and local-m, location) are in `captioning.models.grid_attention`;
monotonic, channel-wise and multi-level attention have modules of their own.

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

import torch
from torch import nn

from captioning.base.constraints import Size, constrained
from captioning.models.attention import Attention, AttentionOutput, additive_scores, attend, masked_softmax


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
