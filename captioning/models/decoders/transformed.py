"""An attention over transformed annotations: what the zoo's decoders attend over is not a itself.

Lu et al.'s adaptive attention attends over V = ReLU(W_a a); AoA over the refined A' = Refiner(ReLU(W_a a)). Both
are per-image work, so it belongs in the attention's `prepare` (run once per image, before the k rows per image
are spread): `TransformedAttention.prepare(a)` computes V = transform(a, mask) and returns [keys of V; V]
(B, L, A + n), and its step is the inner attention (any of conf/attention/, built on V) over V. The decoder reads V
back with `split(keys)`. Everything else (the previous-alpha carry, hard attention's coin, masks) is the inner module's.
"""

from __future__ import annotations

import torch
from torch import nn

from captioning.models.attention import Attention, AttentionOutput


class Projection(nn.Module):
    """V = ReLU(W a + b) (B, L, width): the adaptive model's V, the first step of AoA's refiner."""

    def __init__(self, annotation_dim: int, width: int):
        super().__init__()
        self.W = nn.Linear(annotation_dim, width)

    def forward(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return torch.relu(self.W(a))


class TransformedAttention(Attention):
    """The inner attention over V = transform(a, mask) (B, L, width), see the module."""

    def __init__(self, annotation_dim: int, width: int, transform: nn.Module, inner: Attention):
        super().__init__(annotation_dim, inner.hidden_dim)
        self.width, self.transform, self.inner = width, transform, inner
        self.reads_previous, self.sums_to_one = inner.reads_previous, inner.sums_to_one

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """[keys of V; V] (B, ..., A + width): V laid out as the inner keys are, one region per leading position
        (the grid-shaped keys of location, monotonic and multilevel attention, (B, h, w, A), as (B, L, A) ones)."""
        v = self.transform(a, mask)  # (B, L, width)
        keys = self.inner.prepare(v, grid, mask)  # (B, L, A) or (B, h, w, A)
        if keys.shape[1:-1].numel() != v.shape[1]:
            raise ValueError(f"{type(self.inner).__name__}'s keys {tuple(keys.shape)} do not hold one row per region "
                             f"of the {v.shape[1]}")
        return torch.cat([keys, v.reshape(*keys.shape[:-1], self.width)], dim=-1)

    def split(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """V (B, L, width) and the inner attention's keys of what `prepare` gave."""
        return keys[..., -self.width:].reshape(keys.shape[0], -1, self.width), keys[..., : -self.width]

    def begin_batch(self) -> None:
        self.inner.begin_batch()

    @property
    def core(self) -> Attention:
        return self.inner.core

    def reads_previous_because(self) -> str:
        return self.inner.reads_previous_because()

    def initial_carry(self, uniform: torch.Tensor) -> torch.Tensor:
        return self.inner.initial_carry(uniform)

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        v, k = self.split(keys)
        return self.inner(v, k, h, mask, prev_alpha)
