"""Training losses: caption NLL, the doubly stochastic attention term, and REINFORCE terms.

The REINFORCE pieces (`reinforce_loss`, `MovingAverageBaseline`) take any per-sequence reward, so
hard attention (reward log p(y | s, a)) and reward-based training (e.g. CIDEr) share them.
"""

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
    policy: torch.Tensor | None = None  # REINFORCE surrogate (hard attention)
    entropy: torch.Tensor | None = None  # mean summed entropy H(alpha) per caption (hard attention)


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


class MovingAverageBaseline:
    """b_k = decay * b_{k-1} + (1 - decay) * mean reward of batch k (the first batch sets b)."""

    def __init__(self, decay: float = 0.9):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"baseline decay must be in [0, 1), got {decay}")
        self.decay, self.value = decay, None

    def update(self, rewards: torch.Tensor) -> None:
        """Fold a batch of rewards (N,) into the average."""
        mean = rewards.detach().float().mean().item()
        self.value = mean if self.value is None else self.decay * self.value + (1 - self.decay) * mean

    def state_dict(self) -> dict[str, float | None]:
        return {"decay": self.decay, "value": self.value}

    def load_state_dict(self, state: dict[str, float | None]) -> None:
        self.decay, self.value = float(state["decay"]), state["value"]


def reinforce_loss(log_probs: torch.Tensor, rewards: torch.Tensor, baseline: torch.Tensor | float,
                   step_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Surrogate whose gradient is -mean_n (r_n - b) grad sum_t log p(s_nt): the score-function estimator.

    log_probs (N, T) of the sampled actions; rewards (N,) and baseline are treated as constants.
    """
    if step_mask is not None:
        log_probs = log_probs * step_mask.to(log_probs.dtype)
    advantage = (rewards - baseline).detach()  # (N,)
    return -(advantage * log_probs.sum(dim=1)).mean()


def hard_attention_loss(logits: torch.Tensor, targets: torch.Tensor, alphas: torch.Tensor,
                        log_probs: torch.Tensor | None, entropies: torch.Tensor | None, pad_id: int,
                        baseline: MovingAverageBaseline, attention_weight: float = 1.0, reward_weight: float = 1.0,
                        entropy_weight: float = 0.0) -> LossTerms:
    """The paper's lower-bound estimator: its gradient is the sum of
    grad log p(y|s,a) + reward_weight (log p(y|s,a) - b) grad log p(s|a) + entropy_weight grad H(s).

    Without sampled regions (a minibatch that used the expected context) it is the soft loss.
    Updates the moving-average baseline with this batch's log p(y|s,a).
    """
    terms = caption_loss(logits, targets, alphas, pad_id, attention_weight)
    if log_probs is None:
        return terms
    step_mask = targets != pad_id  # (N, T)
    log_lik = -sequence_nll(logits, targets, pad_id).sum(dim=1).detach()  # (N,) log p(y | s, a)
    b = baseline.value if baseline.value is not None else log_lik.mean().item()
    policy = reinforce_loss(log_probs, log_lik, b, step_mask)
    entropy = (entropies * step_mask.to(entropies.dtype)).sum(dim=1).mean()
    baseline.update(log_lik)
    total = terms.total + reward_weight * policy - entropy_weight * entropy
    return LossTerms(total, terms.nll, terms.token_nll, terms.attention_reg, policy, entropy)
