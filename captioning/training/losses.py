"""Training losses: caption NLL, the doubly stochastic attention term, and REINFORCE terms.

The REINFORCE pieces (`reinforce_loss`, `MovingAverageBaseline`; under torchrun `GlobalMeanBaseline`) take any
per-sequence reward, so hard attention (reward log p(y | s, a)) and reward-based training (e.g. CIDEr) share them.

Normalisation options (the defaults are this project's; the paper presets pick the effective ones of the
authors' arctic-captions code, see experiments/README.md, "Fidelity"):
- attention_reduction: `caption_mean` = lambda mean_n sum_i (1 - sum_t alpha_nti)^2 (the paper's formula per
  caption) | `batch_sum_region_mean` = lambda sum_n mean_i (...)^2 (arctic-captions).
- reward: `sum` = log p(y|s,a) | `token_mean` = log p(y|s,a) / (words + <end>) (arctic-captions).
- reduction: `mean` | `sum` over the captions of the REINFORCE and entropy terms (the NLL is always a mean).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F

from captioning.training.distributed import initialized

# The choices, once: the objectives' signatures (and so the config checker) use these types.
AttentionReduction = Literal["caption_mean", "batch_sum_region_mean"]
Reward = Literal["sum", "token_mean"]
Reduction = Literal["mean", "sum"]


@dataclass
class LossTerms:
    """The total loss and its parts (all scalars)."""

    total: torch.Tensor
    nll: torch.Tensor  # -sum_t log p(y_t), averaged over captions
    token_nll: torch.Tensor  # per-token mean, for perplexity
    attention_reg: torch.Tensor
    policy: torch.Tensor | None = None  # REINFORCE surrogate per caption (hard attention, sampled minibatches)
    entropy: torch.Tensor | None = None  # mean summed entropy H(alpha) per caption (hard attention)


def _choice(name: str, value: str, choices: Any) -> str:
    """`value` if it is one of the `choices` (a Literal type), else a ValueError naming the option."""
    if value not in (allowed := typing.get_args(choices)):
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def sequence_nll(logits: torch.Tensor, targets: torch.Tensor, pad_id: int) -> torch.Tensor:
    """-log p(y_t) per step (N, T), zero at padded steps.

    logits (N, T, V), or (R, V) for the R real tokens only (targets != pad_id, caption by caption: what the
    decoders return given the captions' lengths): then the softmax runs over real tokens only.
    """
    if logits.dim() == 2:
        real = targets != pad_id  # (N, T)
        if logits.shape[0] != (count := int(real.sum())):
            raise ValueError(f"logits of real tokens only must have one row per target that is not padding "
                             f"({count}), got {logits.shape[0]}")
        nll = F.cross_entropy(logits, targets[real], reduction="none")  # (R,)
        return nll.new_zeros(targets.shape).masked_scatter(real, nll)  # (N, T)
    nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none", ignore_index=pad_id)  # (N, T)
    return nll


def doubly_stochastic(alphas: torch.Tensor, step_mask: torch.Tensor, region_mask: torch.Tensor | None = None,
                      reduction: str = "caption_mean") -> torch.Tensor:
    """sum_i (1 - sum_t alpha_ti)^2, averaged over captions (or, `batch_sum_region_mean`, averaged over regions and
    summed over captions); padded steps and regions do not count.

    alphas (N, T, L); step_mask (N, T) true at real steps; region_mask (N, L) true at real regions.
    """
    _choice("attention_reduction", reduction, AttentionReduction)
    coverage = (alphas * step_mask.unsqueeze(-1).to(alphas.dtype)).sum(dim=1)  # (N, L)
    penalty = (1.0 - coverage) ** 2  # (N, L)
    regions = penalty.new_full(penalty.shape[:1], penalty.shape[1])  # (N,) L
    if region_mask is not None:
        penalty = penalty * region_mask.to(penalty.dtype)
        regions = region_mask.sum(dim=1).clamp(min=1).to(penalty.dtype)  # (N,)
    if reduction == "caption_mean":
        return penalty.sum(dim=1).mean()
    return (penalty.sum(dim=1) / regions).sum()


def caption_loss(logits: torch.Tensor, targets: torch.Tensor, alphas: torch.Tensor, pad_id: int,
                 attention_weight: float = 1.0, region_mask: torch.Tensor | None = None,
                 attention_reduction: str = "caption_mean") -> LossTerms:
    """The paper's loss: -sum_t log p(y_t) + lambda sum_i (1 - sum_t alpha_ti)^2, mean over captions."""
    step_mask = targets != pad_id  # (N, T)
    nll = sequence_nll(logits, targets, pad_id)  # (N, T)
    seq_nll = nll.sum(dim=1).mean()
    token_nll = nll.sum() / step_mask.sum().clamp(min=1)
    reg = (doubly_stochastic(alphas, step_mask, region_mask, attention_reduction) if attention_weight
           else logits.new_zeros(()))
    return LossTerms(seq_nll + attention_weight * reg, seq_nll, token_nll, reg)


class MovingAverageBaseline:
    """b_k = decay * b_{k-1} + (1 - decay) * mean reward of batch k (the first batch sets b)."""

    def __init__(self, decay: float = 0.9):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"baseline decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.value: float | None = None

    def update(self, rewards: torch.Tensor) -> None:
        """Fold a batch of rewards (N,) into the average."""
        mean = rewards.detach().float().mean().item()
        self.value = mean if self.value is None else self.decay * self.value + (1 - self.decay) * mean

    def state_dict(self) -> dict[str, float | None]:
        return {"decay": self.decay, "value": self.value}

    def load_state_dict(self, state: dict[str, float | None]) -> None:
        decay = state["decay"]
        self.decay, self.value = float(decay if decay is not None else self.decay), state["value"]


class GlobalMeanBaseline(MovingAverageBaseline):
    """The REINFORCE moving-average baseline kept identical on every rank.

    `update` (called inside the loss) only records this rank's rewards; `sync`, which every rank calls
    after every step, sums rewards and counts over the ranks and folds the mean reward of the global batch,
    so every rank holds the same b, the one a single process would hold for the global batch. Ranks whose
    hard attention used the expected context in a step contribute no rewards to it.
    """

    def __init__(self, decay: float = 0.9):
        super().__init__(decay)
        self._sum, self._count = 0.0, 0

    def update(self, rewards: torch.Tensor) -> None:
        """Record this rank's rewards (N,) until the next `sync`."""
        self._sum += float(rewards.detach().double().sum())
        self._count += rewards.numel()

    def sync(self) -> None:
        """Fold the mean reward over all ranks' recorded rewards (a collective: every rank must call it)."""
        totals = torch.tensor([self._sum, float(self._count)], dtype=torch.float64)
        if initialized():
            dist.all_reduce(totals)
        self._sum, self._count = 0.0, 0
        if totals[1] > 0:
            super().update((totals[0] / totals[1]).reshape(1))


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
                        entropy_weight: float = 0.0, *, attention_reduction: str = "caption_mean",
                        reward: str = "sum", reduction: str = "mean", samples_regions: bool | None = None,
                        doubly_stochastic_term: bool = True, every_batch: bool = False,
                        region_mask: torch.Tensor | None = None) -> LossTerms:
    """The paper's lower-bound estimator: its gradient is the sum of
    grad log p(y|s,a) + reward_weight (r - b) grad log p(s|a) + entropy_weight grad H(s), with r = log p(y|s,a)
    (`reward`) and the last two terms averaged or summed over captions (`reduction`).

    `samples_regions` says whether the model's attention samples regions (default: whether `log_probs` came).
    For such a model `doubly_stochastic_term=False` leaves the doubly stochastic term out, and `every_batch=True`
    applies the entropy term (H from `alphas`) and updates the baseline also in the minibatches that used the
    expected context, as arctic-captions does. Otherwise such a minibatch gets the soft loss only.
    Updates the moving-average baseline with this batch's rewards. `region_mask` (N, L): each caption's real
    regions (region sets), the only ones the doubly stochastic term counts.
    """
    _choice("reward", reward, Reward)
    _choice("reduction", reduction, Reduction)
    hard = log_probs is not None if samples_regions is None else samples_regions
    weight = attention_weight if doubly_stochastic_term or not hard else 0.0
    terms = caption_loss(logits, targets, alphas, pad_id, weight, region_mask, attention_reduction)
    if not hard or (log_probs is None and not every_batch):
        return terms
    step_mask = targets != pad_id  # (N, T)
    steps = step_mask.to(logits.dtype)  # (N, T)
    log_lik = -sequence_nll(logits, targets, pad_id).sum(dim=1).detach()  # (N,) log p(y | s, a)
    rewards = log_lik / steps.sum(dim=1).clamp(min=1) if reward == "token_mean" else log_lik  # (N,)
    b = baseline.value if baseline.value is not None else rewards.mean().item()
    if entropies is None:  # an expected-context minibatch: H(alpha_t) of the attention it computed
        entropies = -torch.special.xlogy(alphas, alphas).sum(dim=-1)  # (N, T)
    entropy = (entropies * steps).sum(dim=1).mean()
    policy = reinforce_loss(log_probs, rewards, b, step_mask) if log_probs is not None else None
    baseline.update(rewards)
    scale = float(targets.shape[0]) if reduction == "sum" else 1.0  # sum over captions = N x their mean
    total = terms.total - scale * entropy_weight * entropy
    if policy is not None:
        total = total + scale * reward_weight * policy
    return LossTerms(total, terms.nll, terms.token_nll, terms.attention_reg, policy, entropy)


def leave_one_out_baseline(rewards: torch.Tensor, samples_per_image: int) -> torch.Tensor:
    """b_ij = mean reward of the other samples of image i (Luo 2020), for rewards (B n,) in rows b n + j.

    It does not depend on sample j itself, so the estimator stays unbiased; the advantages of an image sum to 0.
    """
    n = samples_per_image
    if n < 2:
        raise ValueError(f"the mean-of-other-samples baseline needs >= 2 samples per image, got {n}")
    r = rewards.reshape(-1, n)  # (B, n)
    return ((r.sum(dim=1, keepdim=True) - r) / (n - 1)).reshape(-1)  # (B n,)
