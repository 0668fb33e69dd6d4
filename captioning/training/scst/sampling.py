"""Captions sampled from the captioner, with the log-probabilities REINFORCE needs (self-critical training).

`sample_captions` runs the decoder's step interface (`attention.prepare`, `init_state`, `step`, as decoding does)
with gradients on, drawing n captions per image at once: row b n + j is sample j of image b. Each word is drawn
from the policy q(y_t | y_<t, a) = softmax(logits / temperature), optionally kept to the top_k words, never
<start> or <pad>; hard attention also draws its region s_t inside the step, so the sample is a path (s, y) and
its log-probability is log q(y | s, a) + log p(s | a), both returned. `CaptionSampler` wraps the captioner for
this forward pass, so that under torchrun DistributedDataParallel wraps it and averages its gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from captioning.data.vocab import Vocabulary
from captioning.decoding import special_ids, word_log_probs
from captioning.models.decoder import repeat_rows


@dataclass
class Samples:
    """N = B n sampled captions of T steps; step t of a row counts (mask) up to and including its <end>."""

    tokens: torch.Tensor  # (N, T) word ids, <pad> after <end>
    log_probs: torch.Tensor  # (N, T) log q(y_t | y_<t, a) of the drawn words (0 at masked steps)
    mask: torch.Tensor  # (N, T) true at the steps that produced a word or the <end>
    alphas: torch.Tensor  # (N, T, L)
    region_log_probs: torch.Tensor | None = None  # (N, T) log p(s_t | a) of sampled regions (hard attention)
    entropies: torch.Tensor | None = None  # (N, T) H(alpha_t) (hard attention)

    @property
    def ended(self) -> torch.Tensor:
        """(N,) whether each caption produced its <end> within max_len steps."""
        return (self.tokens == Vocabulary.end_id).any(dim=1)

    @property
    def lengths(self) -> torch.Tensor:
        """(N,) words of each caption, its <end> not counted."""
        return self.mask.sum(dim=1) - self.ended.long()


def policy_log_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None) -> torch.Tensor:
    """log q(word) (N, V) of the sampling policy: softmax(logits / temperature) over the top_k words (all: None),
    without <start> and <pad>, which are never targets (the same renormalisation as decoding's)."""
    logits, special = logits.float(), special_ids(logits.device)  # (N, V), (2,)
    if top_k is not None and top_k < logits.shape[1]:
        kth = logits.index_fill(1, special, float("-inf")).topk(top_k, dim=1).values[:, -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))  # (N, V)
    return word_log_probs(logits / temperature, special)  # (N, V)


def sample_captions(decoder: Any, a: torch.Tensor, grid: tuple[int, int] | None, samples_per_image: int,
                    max_len: int, temperature: float = 1.0, top_k: int | None = None) -> Samples:
    """Draw `samples_per_image` captions for each annotation grid of a (B, L, D), with gradients."""
    n, pad, end = samples_per_image, Vocabulary.pad_id, Vocabulary.end_id
    keys = decoder.attention.prepare(a, grid)  # (B, L, A) once per image
    state = repeat_rows(decoder.init_state(a), n)  # rows b n + j
    if not getattr(decoder, "rows_share_images", False):  # else the step reads n rows per image of a and keys
        a, keys = repeat_rows((a, keys), n)  # (B n, L, D), (B n, L, A)
    N = state[0].shape[0] if isinstance(state, (tuple, list)) else state.shape[0]
    words = torch.full((N,), Vocabulary.start_id, dtype=torch.long, device=a.device)
    finished = torch.zeros(N, dtype=torch.bool, device=a.device)
    tokens, log_probs, masks, alphas, region_log_probs, entropies = [], [], [], [], [], []
    for _ in range(max_len):
        logits, state, att = decoder.step(words, state, a, keys)
        logp = policy_log_probs(logits, temperature, top_k)  # (N, V)
        with torch.no_grad():
            drawn = torch.multinomial(logp.exp(), 1).squeeze(1)  # (N,)
        active = ~finished
        words = drawn.masked_fill(finished, pad)  # finished captions are fed <pad>, as in greedy decoding
        chosen = logp.gather(1, drawn.unsqueeze(1)).squeeze(1)  # (N,): a real word's, also where finished
        tokens.append(words)
        masks.append(active)
        alphas.append(att.alpha)
        log_probs.append(torch.where(active, chosen, torch.zeros_like(chosen)))
        if att.log_prob is not None:
            region_log_probs.append(att.log_prob)
            entropies.append(att.entropy)
        finished = finished | (words == end)
        if finished.all():  # the one host sync per step
            break
    return Samples(tokens=torch.stack(tokens, 1), log_probs=torch.stack(log_probs, 1), mask=torch.stack(masks, 1),
                   alphas=torch.stack(alphas, 1).float(),
                   region_log_probs=torch.stack(region_log_probs, 1).float() if region_log_probs else None,
                   entropies=torch.stack(entropies, 1).float() if entropies else None)


class CaptionSampler(nn.Module):
    """The captioner as a sampling policy: forward(images) -> Samples (what DDP wraps under objective=scst)."""

    def __init__(self, captioner: Any, samples_per_image: int, max_len: int, temperature: float = 1.0,
                 top_k: int | None = None):
        super().__init__()
        self.captioner = captioner
        self.samples_per_image, self.max_len = samples_per_image, max_len
        self.temperature, self.top_k = temperature, top_k

    def forward(self, images: torch.Tensor) -> Samples:
        """Encode the images (or pass cached annotations through) and sample n captions per image."""
        a, grid = self.captioner.encode(images)  # (B, L, D)
        return sample_captions(self.captioner.decoder, a, grid, self.samples_per_image, self.max_len,
                               self.temperature, self.top_k)
