"""Multi-level attention (`attention=multilevel`): attention over two grids of different resolution.

The fine grid is the encoder's (h, w); the coarse one is the same map average-pooled in `pool` x `pool` blocks
(ceil(h / pool) x ceil(w / pool) cells; a coarse cell is the masked mean of its real children, and real when one of
them is). Each level has the paper's soft attention score (its own W_a, W_h, w: e_i on the fine cells, E_c on the
coarse ones). `combine`:

    hierarchical  alpha_i = A_c(i) * softmax_{j in c(i)} e_j: the coarse cell's weight A = softmax_c(E) times a
                  softmax over its children (c(i): the coarse cell holding fine cell i); z = sum_i alpha_i a_i.
                  With one coarse cell (pool >= the grid's sides) it is soft attention over the fine grid.
    concat        z = W_z [z_fine; z_coarse] (2D -> D), each level's context of its own softmax
    gate          z = g z_fine + (1 - g) z_coarse, g = sigmoid(w_g^T h + b_g) per row

alpha (what figures, attention correctness and the doubly stochastic term read) is the fine map: hierarchical's
product, or the fine level's softmax for concat and gate (the coarse level's map is not drawn). The grid comes with
`prepare`, which lays everything a step reads on the grid (the layout travels in the keys' shape): the fine cells'
keys and, in the first C cells, the coarse cells' keys, pooled annotations and whether they hold a real region, so
that no per-batch state sits on the module and each step scores the C coarse cells, not one stand-in per fine cell.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import torch
from torch import nn

from captioning.base.constraints import Size, constrained
from captioning.models.attention import Attention, AttentionOutput, SoftAttention, row_softmax, weighted
from captioning.models.attention_family import grid_positions, resolve_grid
from captioning.models.rows import rows_per_image

Combine = Literal["hierarchical", "concat", "gate"]


def coarse_cells(h: int, w: int, pool: int, device: torch.device | None = None) -> tuple[torch.Tensor, int]:
    """The coarse cell (row-major on the ceil(h / pool) x ceil(w / pool) grid) of each fine cell (L,), and their
    number."""
    parent, cells = _coarse_cells(h, w, pool)
    return parent.to(device), cells


@functools.lru_cache(maxsize=64)
def _coarse_cells(h: int, w: int, pool: int) -> tuple[torch.Tensor, int]:
    """coarse_cells on the CPU, once per grid (every step reads it; callers never write to it)."""
    pos = grid_positions(h, w, None, torch.long)  # (L, 2)
    cols = math.ceil(w / pool)
    return (pos[:, 0] // pool) * cols + pos[:, 1] // pool, math.ceil(h / pool) * cols


class MultiLevelAttention(Attention):
    """Soft attention over the fine grid and its pooled coarse grid, combined (see the module)."""

    @constrained
    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: Size = 128, pool: Size = 2,
                 combine: Combine = "hierarchical"):
        super().__init__(annotation_dim, hidden_dim)
        self.pool, self.combine = pool, combine
        self.fine = SoftAttention(annotation_dim, hidden_dim, attention_dim)  # drawn first: attention=soft's weights
        self.coarse = SoftAttention(annotation_dim, hidden_dim, attention_dim)
        self.W_z = nn.Linear(2 * annotation_dim, annotation_dim) if combine == "concat" else None
        self.gate = nn.Linear(hidden_dim, 1) if combine == "gate" else None

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Everything a step reads, laid out on the grid (B, h, w, 2A + D + 1): each fine cell's keys (A), then in the
        first C cells (row-major; zeros in the others) the C coarse cells' keys (A), pooled annotations (the mean of
        their real children, D) and whether they have a real child (1)."""
        B, L, D = a.shape
        h, w = resolve_grid(L, grid)
        parent, cells = coarse_cells(h, w, self.pool, a.device)
        real = a.new_ones(B, L, 1) if mask is None else mask.unsqueeze(-1).to(a.dtype)  # (B, L, 1)
        sums = a.new_zeros(B, cells, D).index_add_(1, parent, a * real)  # (B, C, D)
        counts = a.new_zeros(B, cells, 1).index_add_(1, parent, real)  # (B, C, 1)
        pooled = sums / counts.clamp(min=1)  # (B, C, D)
        coarse = torch.cat([self.coarse.prepare(pooled), pooled, (counts > 0).to(a.dtype)], dim=-1)  # (B, C, A+D+1)
        coarse = nn.functional.pad(coarse, (0, 0, 0, L - cells))  # (B, L, A + D + 1): C <= L
        return torch.cat([self.fine.prepare(a), coarse], dim=-1).view(B, h, w, -1)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        if keys.dim() != 4:
            raise ValueError(f"MultiLevelAttention expects keys (B, h, w, K) from its prepare(), got "
                             f"{tuple(keys.shape)}")
        B, L, D = a.shape
        N = h.shape[0]
        A = (keys.shape[-1] - D - 1) // 2
        parent, cells = coarse_cells(keys.shape[1], keys.shape[2], self.pool, a.device)  # (L,)
        flat = keys.reshape(B, L, -1)
        coarse_keys, pooled, has_child = flat[:, :cells, A:].split([A, D, 1], dim=-1)  # (B, C, .)
        k = rows_per_image(B, N)
        A_c = row_softmax(self.coarse.scores(coarse_keys, h), has_child.squeeze(-1) > 0)  # (N, C)
        fine_scores = self.fine.scores(flat[..., :A], h)  # (N, L)
        if self.combine == "hierarchical":
            scores = fine_scores if mask is None else \
                fine_scores.masked_fill(~mask.repeat_interleave(k, dim=0), float("-inf"))  # (N, L)
            index = parent.expand(N, L)
            # each cell's largest child score, a shift the softmax over its children does not depend on
            top = scores.new_full((N, cells), float("-inf")).scatter_reduce(1, index, scores.detach(), "amax")
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # a cell with no real child
            e = torch.exp(scores - top.gather(1, index))  # (N, L), 0 on padding
            sums = e.new_zeros(N, cells).index_add(1, parent, e).clamp(min=torch.finfo(e.dtype).tiny)  # (N, C)
            return weighted(a, e / sums.gather(1, index) * A_c.gather(1, index))
        fine = weighted(a, row_softmax(fine_scores, mask))
        z_c = torch.bmm(A_c.view(B, k, cells), pooled).view(-1, D)  # (N, D): the coarse level's context
        if self.W_z is not None:
            return AttentionOutput(self.W_z(torch.cat([fine.context, z_c], dim=1)), fine.alpha)
        assert self.gate is not None
        g = torch.sigmoid(self.gate(h))  # (N, 1)
        return AttentionOutput(g * fine.context + (1 - g) * z_c, fine.alpha)
