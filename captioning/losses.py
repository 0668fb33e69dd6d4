"""Training losses: caption negative log-likelihood and the doubly stochastic attention term."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class LossTerms:
    """The total loss and its parts (all scalars)."""

    total: torch.Tensor
    nll: torch.Tensor  # -sum_t log p(y_t), averaged over captions
    token_nll: torch.Tensor  # per-token mean, for perplexity
    attention_reg: torch.Tensor


def sequence_nll(logits: torch.Tensor, targets: torch.Tensor, pad_id: int) -> torch.Tensor:
    """-log p(y_t) per step (N, T), zero at padded steps."""
    nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none", ignore_index=pad_id)  # (N, T)
    return nll


def doubly_stochastic(alphas: torch.Tensor, step_mask: torch.Tensor, region_mask: torch.Tensor | None = None) -> torch.Tensor:
    """sum_i (1 - sum_t alpha_ti)^2, averaged over captions; padded steps and regions do not count.

    alphas (N, T, L); step_mask (N, T) true at real steps; region_mask (N, L) true at real regions.
    """
    coverage = (alphas * step_mask.unsqueeze(-1).to(alphas.dtype)).sum(dim=1)  # (N, L)
    penalty = (1.0 - coverage) ** 2  # (N, L)
    if region_mask is not None:
        penalty = penalty * region_mask.to(penalty.dtype)
    return penalty.sum(dim=1).mean()


def caption_loss(logits: torch.Tensor, targets: torch.Tensor, alphas: torch.Tensor, pad_id: int,
                 attention_weight: float = 1.0, region_mask: torch.Tensor | None = None) -> LossTerms:
    """The paper's loss: -sum_t log p(y_t) + lambda sum_i (1 - sum_t alpha_ti)^2, mean over captions."""
    step_mask = targets != pad_id  # (N, T)
    nll = sequence_nll(logits, targets, pad_id)  # (N, T)
    seq_nll = nll.sum(dim=1).mean()
    token_nll = nll.sum() / step_mask.sum().clamp(min=1)
    reg = doubly_stochastic(alphas, step_mask, region_mask) if attention_weight else logits.new_zeros(())
    return LossTerms(seq_nll + attention_weight * reg, seq_nll, token_nll, reg)
