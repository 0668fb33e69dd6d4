"""Captions sampled from the captioner, with the log-probabilities REINFORCE needs (self-critical training).

`sample_captions` runs the decoder's step interface (`attention.prepare`, `init_state`, `step`, as decoding does)
with gradients on, drawing n captions per image at once: row b n + j is sample j of image b. Each word is drawn
from the policy q(y_t | y_<t, a) = softmax(logits / temperature), optionally kept to the top_k words, never
<start> or <pad>; hard attention also draws its region s_t inside the step, so the sample is a path (s, y) and
its log-probability is log q(y | s, a) + log p(s | a), both returned. `CaptionSampler` wraps the captioner for
this forward pass, so that under torchrun DistributedDataParallel wraps it and averages its gradients.

An image whose n samples have all ended drops out of the batch (once a quarter of the running images have, as
in decoding.py): later steps, and their backward, run for the other images only. The distribution each caption
is drawn from is unchanged; which random numbers it gets is not (a step's dropout and draws consume them per
running row). Hard attention, which draws its regions inside the step, keeps every row.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from captioning.base.decoding import SUPPRESS_UNK
from captioning.data.vocab import Vocabulary
from captioning.models.attention import HardAttention, core_of
from captioning.models.decoding import compact_due, special_ids, word_log_probs
from captioning.models.fused.dtypes import autocast_input
from captioning.models.rows import live_rows, map_state, repeat_rows, select_rows


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
    without <start> and <pad>, which are never targets, nor <unk>, which test-time decoding never emits (the same
    renormalisation as decoding's: the policy is the one the greedy baseline and the test decode)."""
    logits, special = logits.float(), special_ids(logits.device, SUPPRESS_UNK)  # (N, V), (3,)
    if top_k is not None and top_k < logits.shape[1]:
        kth = logits.index_fill(1, special, float("-inf")).topk(top_k, dim=1).values[:, -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))  # (N, V)
    return word_log_probs(logits / temperature, special)  # (N, V)


def sample_captions(decoder: Any, a: torch.Tensor, grid: tuple[int, int] | None, samples_per_image: int,
                    max_len: int, temperature: float = 1.0, top_k: int | None = None,
                    mask: torch.Tensor | None = None) -> Samples:
    """Draw `samples_per_image` captions for each annotation grid of a (B, L, D) (mask (B, L): region sets' real
    regions), with gradients."""
    n, pad, end = samples_per_image, Vocabulary.pad_id, Vocabulary.end_id
    N = a.shape[0] * n  # rows b n + j
    keys = decoder.attention.prepare(a, grid, mask)  # (B, L, A) once per image
    state = repeat_rows(decoder.init_state(a, mask), n)
    a = autocast_input(a)  # under bf16/fp16 autocast: cast once, not at every step
    shares = getattr(decoder, "rows_share_images", False)
    if not shares:  # else the step reads n rows per image of a and keys
        a, keys, mask = repeat_rows((a, keys, mask), n)  # (B n, L, D), (B n, L, A), (B n, L)
    compacts = not isinstance(core_of(decoder.attention), HardAttention)  # its region draws happen inside the step
    words = torch.full((N,), Vocabulary.start_id, dtype=torch.long, device=a.device)
    finished = torch.zeros(N, dtype=torch.bool, device=a.device)
    live: torch.Tensor | None = None  # the row (of N) of each running row; None: all, in order
    steps: list[tuple[torch.Tensor | None, dict[str, torch.Tensor]]] = []  # (live, this step's values) per step
    for _ in range(max_len):
        logits, state, att = decoder.step(words, state, a, keys, mask)
        logp = policy_log_probs(logits, temperature, top_k)  # (b, V)
        with torch.no_grad():
            drawn = torch.multinomial(logp.exp(), 1).squeeze(1)  # (b,)
        active = ~finished
        words = drawn.masked_fill(finished, pad)  # finished captions are fed <pad>, as in greedy decoding
        chosen = logp.gather(1, drawn.unsqueeze(1)).squeeze(1)  # (b,): a real word's, also where finished
        values = {"tokens": words, "masks": active, "alphas": att.alpha,
                  "log_probs": torch.where(active, chosen, torch.zeros_like(chosen))}
        if att.log_prob is not None:
            values.update(region_log_probs=att.log_prob, entropies=att.entropy)
        steps.append((live, values))
        finished = finished | (words == end)
        image_done = finished.view(-1, n).all(dim=1)  # (b / n,)
        every, compact = compact_due(image_done)  # the one host sync per step
        if every:
            break
        if compact and compacts:  # drop the images whose samples have all ended
            keep = (~image_done).nonzero().squeeze(1)  # (b' / n,) running images
            rows = live_rows(keep, n)  # (b',) their rows
            live = rows if live is None else live[rows]
            a, keys, mask = select_rows(keep if shares else rows, a, keys, mask)
            words, finished = select_rows(rows, words, finished)
            state = map_state(functools.partial(torch.index_select, dim=0, index=rows), state)
    out = {key: _stack(N, [(idx, v[key]) for idx, v in steps]) for key in steps[0][1]}
    return Samples(tokens=out["tokens"], log_probs=out["log_probs"], mask=out["masks"],
                   alphas=out["alphas"].float(),
                   region_log_probs=out["region_log_probs"].float() if "region_log_probs" in out else None,
                   entropies=out["entropies"].float() if "entropies" in out else None)


def _stack(N: int, steps: list[tuple[torch.Tensor | None, torch.Tensor]]) -> torch.Tensor:
    """Each step's values (b_t, ...) of the running rows (None: all N) as one (N, T, ...) tensor, zeros (False,
    <pad>) in the rows that no longer ran; differentiable in the values."""
    full = [v if rows is None else v.new_zeros((N, *v.shape[1:])).index_copy(0, rows, v) for rows, v in steps]
    return torch.stack(full, 1)


class CaptionSampler(nn.Module):
    """The captioner as a sampling policy: forward(images) -> Samples (what DDP wraps under objective=scst)."""

    def __init__(self, captioner: Any, samples_per_image: int, max_len: int, temperature: float = 1.0,
                 top_k: int | None = None):
        super().__init__()
        self.captioner = captioner
        self.samples_per_image, self.max_len = samples_per_image, max_len
        self.temperature, self.top_k = temperature, top_k

    def forward(self, images: torch.Tensor, mask: torch.Tensor | None = None) -> Samples:
        """Encode the images (or pass cached annotations or masked region sets through) and sample n captions per
        image."""
        a, grid = self.captioner.encode(images, mask)  # (B, L, D)
        return sample_captions(self.captioner.decoder, a, grid, self.samples_per_image, self.max_len,
                               self.temperature, self.top_k, mask)
