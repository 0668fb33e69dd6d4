"""Attention over annotation vectors: the decoder state h_{t-1} picks a context z_t from a_1..a_L.

Every attention module has the same interface so that Hydra can swap them:
    keys = attn.prepare(a, grid)                # once per image; grid = (h, w) with L = h * w
    out = attn(a, keys, h, mask, prev_alpha)    # once per step -> out.context (B, D), out.alpha (B, L)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class AttentionOutput:
    """One attention step: the context z_t and the weights alpha_t (plus sampling terms for hard attention)."""

    context: torch.Tensor  # (B, D)
    alpha: torch.Tensor  # (B, L), sums to 1 over unmasked regions
    log_prob: torch.Tensor | None = None  # (B,) log p(s_t | a) of a sampled region
    entropy: torch.Tensor | None = None  # (B,) H(alpha_t)
    index: torch.Tensor | None = None  # (B,) the sampled / chosen region


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over regions (last dim) that gives padded regions (mask False) exactly zero weight."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


class Attention(nn.Module):
    """Base class: subclasses implement `prepare` (per image) and `forward` (per step)."""

    def __init__(self, annotation_dim: int, hidden_dim: int):
        super().__init__()
        self.annotation_dim, self.hidden_dim = annotation_dim, hidden_dim

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """Per-image work that does not depend on the step (e.g. W_a a_i): one tensor whose first dim is the image.

        `grid` is the (h, w) layout of the L = h * w regions (row-major); images with smaller grids are
        padded to it and their padded regions masked out.
        """
        return a

    def begin_batch(self) -> None:
        """Called by the trainer before each training minibatch (hard attention tosses its coin here)."""

    def forward(self, a: torch.Tensor, keys: torch.Tensor, h: torch.Tensor, mask: torch.Tensor | None = None,
                prev_alpha: torch.Tensor | None = None) -> AttentionOutput:
        raise NotImplementedError


class SoftAttention(Attention):
    """The paper's deterministic attention: e_ti = w^T tanh(W_a a_i + W_h h_{t-1} + b), z_t = sum_i alpha_ti a_i."""

    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: int = 512):
        super().__init__(annotation_dim, hidden_dim)
        self.W_a = nn.Linear(annotation_dim, attention_dim)  # carries the bias b
        self.W_h = nn.Linear(hidden_dim, attention_dim, bias=False)
        self.w = nn.Linear(attention_dim, 1)

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        return self.W_a(a)  # (B, L, A): computed once per image, not once per step

    def scores(self, keys: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Unnormalised e_t (B, L)."""
        return self.w(torch.tanh(keys + self.W_h(h).unsqueeze(1))).squeeze(-1)  # (B, L, A) -> (B, L)

    def forward(self, a, keys, h, mask=None, prev_alpha=None) -> AttentionOutput:
        alpha = masked_softmax(self.scores(keys, h), mask)  # (B, L)
        context = torch.bmm(alpha.unsqueeze(1), a).squeeze(1)  # (B, 1, L) @ (B, L, D) -> (B, D)
        return AttentionOutput(context, alpha)


class HardAttention(SoftAttention):
    """The paper's stochastic attention: s_t ~ Multinomial(alpha_t), z_t = a_{s_t}; trained with REINFORCE.

    In training, each minibatch (see `begin_batch`) uses the expected context (the soft step) with probability
    `expected_context_prob`, else samples one region per step and reports log p(s_t | a) and H(alpha_t) for
    the REINFORCE terms in `captioning.losses`. At test time `test_mode` picks the context: the expectation
    (deterministic, the default), the argmax region, or a sampled region.
    """

    TEST_MODES = ("expectation", "argmax", "sample")

    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: int = 512,
                 expected_context_prob: float = 0.5, test_mode: str = "expectation"):
        super().__init__(annotation_dim, hidden_dim, attention_dim)
        if test_mode not in self.TEST_MODES:
            raise ValueError(f"attention.test_mode must be one of {self.TEST_MODES}, got {test_mode!r}")
        if not 0.0 <= expected_context_prob <= 1.0:
            raise ValueError(f"attention.expected_context_prob must be in [0, 1], got {expected_context_prob}")
        self.expected_context_prob, self.test_mode = expected_context_prob, test_mode
        self.sample_this_batch = True

    def begin_batch(self) -> None:
        """Toss the per-minibatch coin: sample regions, or use the expected context for this batch."""
        self.sample_this_batch = bool(torch.rand(()) >= self.expected_context_prob)

    def forward(self, a, keys, h, mask=None, prev_alpha=None) -> AttentionOutput:
        alpha = masked_softmax(self.scores(keys, h), mask)  # (B, L)
        mode = ("sample" if self.sample_this_batch else "expectation") if self.training else self.test_mode
        if mode == "expectation":
            return AttentionOutput(torch.bmm(alpha.unsqueeze(1), a).squeeze(1), alpha)  # (B, D)
        if mode == "argmax":
            index = alpha.argmax(dim=1)  # (B,)
        else:
            index = torch.multinomial(alpha.detach(), 1).squeeze(1)  # (B,)
        context = a[torch.arange(a.shape[0], device=a.device), index]  # (B, D): one region's annotation
        log_prob = torch.log(alpha.gather(1, index.unsqueeze(1)).squeeze(1))  # (B,)
        entropy = -torch.special.xlogy(alpha, alpha).sum(dim=1)  # (B,), masked regions add 0
        return AttentionOutput(context, alpha, log_prob, entropy, index)
