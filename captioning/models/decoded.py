"""What decoding returns (`Decoded`) and how it is assembled: each word's map (and channel weights) cut out of the
per-step buffers, and beam search's back-pointers followed (`captioning.models.decoding` runs the searches)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from captioning.base.tokens import PAD_ID


@dataclass
class Decoded:
    """Decoded captions for B images (special tokens removed) with the attention map of each word."""

    tokens: list[list[int]]  # per image, word ids without <start>/<end>
    alphas: list[torch.Tensor]  # per image, (T_i, L): the map used to produce each word
    scores: torch.Tensor  # (B,) raw log-probability of the chosen sequence (incl. <end> if it has one)
    # beam_search(n_best > 1) only: per image, up to n_best (words, maps, raw log p), best first (the chosen one)
    alternatives: list[list[tuple[list[int], torch.Tensor, float]]] | None = None
    # channel-wise attention: per image, (T_i, C) each word's channel weights (multirep: its K representation weights)
    channels: list[torch.Tensor] | None = None


def split_maps(maps: torch.Tensor, num_regions: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The attention maps (..., L) and the channel weights (..., C) (None without) of what decoding kept per word,
    `AttentionOutput.maps` (..., L [+ C])."""
    if maps.shape[-1] == num_regions:
        return maps, None
    return maps[..., :num_regions], maps[..., num_regions:]


def finish(seqs: torch.Tensor, maps: torch.Tensor, lengths: torch.Tensor, scores: torch.Tensor,
            num_regions: int) -> Decoded:
    """Cut each caption (B, T) and its maps (B, T, L [+ C]) to its length in words; one transfer to the host."""
    alphas, channels = split_maps(maps.cpu(), num_regions)
    n = lengths.tolist()
    return Decoded([row[:m] for row, m in zip(seqs.tolist(), n)], [alphas[i, :m] for i, m in enumerate(n)], scores,
                   channels=None if channels is None else [channels[i, :m] for i, m in enumerate(n)])


def backtrack(tokens: torch.Tensor, parents: torch.Tensor, alphas: torch.Tensor, lengths: torch.Tensor,
               beams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Follow back-pointers (T, B, k) from beam `beams` (B,) at step lengths - 1: words (B, T), maps (B, T, L)."""
    T, B = tokens.shape[:2]
    img = torch.arange(B, device=tokens.device)
    seqs = tokens.new_full((B, T), PAD_ID)
    maps = alphas.new_zeros(B, T, alphas.shape[-1])
    cur = beams
    for s in range(T - 1, -1, -1):
        cur = torch.where(lengths - 1 == s, beams, cur)  # each caption's last word is at step lengths - 1
        inside = (s < lengths).unsqueeze(1)  # (B, 1)
        parent = parents[s, img, cur]  # (B,) the beam that ran step s: its alpha_s produced the word
        seqs[:, s] = torch.where(inside[:, 0], tokens[s, img, cur], PAD_ID)
        maps[:, s] = torch.where(inside, alphas[s, img, parent], 0.0)  # (B, L)
        cur = parent
    return seqs, maps
