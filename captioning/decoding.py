"""Greedy decoding and batched beam search: the only copies, used by validation, evaluation and captioning."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from captioning.data.vocab import Vocabulary
from captioning.models.captioner import Captioner
from captioning.models.decoder import ShowAttendTellDecoder


@dataclass
class Decoded:
    """Decoded captions for B images (special tokens removed) with the attention map of each word."""

    tokens: list[list[int]]  # per image, word ids without <start>/<end>
    alphas: list[torch.Tensor]  # per image, (T_i, L): the map used to produce each word
    scores: torch.Tensor  # (B,) log-probability of the chosen sequence (incl. <end>)


def _trim(seqs: torch.Tensor, alphas: torch.Tensor, end_id: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Cut each sequence (B, T) before its first <end>; keep the matching attention maps (B, T, L)."""
    tokens, maps = [], []
    for seq, alpha in zip(seqs.tolist(), alphas):
        n = seq.index(end_id) if end_id in seq else len(seq)
        tokens.append(seq[:n])
        maps.append(alpha[:n].cpu())
    return tokens, maps


def _word_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log p(word) renormalised without <start> and <pad>, which are never targets in training."""
    logits = logits.clone()
    logits[:, [Vocabulary.start_id, Vocabulary.pad_id]] = float("-inf")
    return F.log_softmax(logits, dim=-1)  # (N, V)


@torch.no_grad()
def greedy_decode(decoder: ShowAttendTellDecoder, a: torch.Tensor, max_len: int,
                  mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None) -> Decoded:
    """Pick the most likely word at every step, for a batch of annotation grids a (B, L, D)."""
    B = a.shape[0]
    keys = decoder.attention.prepare(a, grid)  # (B, L, A)
    state = decoder.init_state(a, mask)
    words = a.new_full((B,), Vocabulary.start_id, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool, device=a.device)
    scores = a.new_zeros(B)
    seqs, alphas = [], []
    for _ in range(max_len):
        logits, state, att = decoder.step(words, state, a, keys, mask)
        logp = _word_log_probs(logits)  # (B, V)
        words = logp.argmax(dim=-1).masked_fill(finished, Vocabulary.pad_id)  # (B,)
        scores += logp.gather(1, words.unsqueeze(1)).squeeze(1).masked_fill(finished, 0.0)
        seqs.append(words), alphas.append(att.alpha)
        finished |= words == Vocabulary.end_id
        if finished.all():
            break
    tokens, maps = _trim(torch.stack(seqs, 1), torch.stack(alphas, 1), Vocabulary.end_id)
    return Decoded(tokens, maps, scores)


@torch.no_grad()
def beam_search(decoder: ShowAttendTellDecoder, a: torch.Tensor, beam_size: int, max_len: int,
                length_penalty: float = 0.0, mask: torch.Tensor | None = None,
                grid: tuple[int, int] | None = None) -> Decoded:
    """Batched beam search: B images x k beams in one tensor; the best beam by score / length**length_penalty.

    A finished beam stays in the beam and is extended only by <pad> at no cost, so finished and live
    hypotheses compete for the k places, and k = 1 is exactly greedy decoding.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    B, k = a.shape[0], beam_size
    keys = decoder.attention.prepare(a, grid)  # (B, L, A) once per image, then repeated per beam
    a, keys = a.repeat_interleave(k, 0), keys.repeat_interleave(k, 0)  # (B*k, L, D), (B*k, L, A)
    mask = None if mask is None else mask.repeat_interleave(k, 0)
    state = decoder.init_state(a, mask)
    words = a.new_full((B * k,), Vocabulary.start_id, dtype=torch.long)
    scores = a.new_full((B, k), float("-inf"))
    scores[:, 0] = 0.0  # all beams start identical: only the first may expand at step one
    finished = torch.zeros(B * k, dtype=torch.bool, device=a.device)
    lengths = torch.zeros(B * k, device=a.device)
    seqs = torch.empty(B * k, 0, dtype=torch.long, device=a.device)
    alpha_hist = a.new_empty(B * k, 0, a.shape[1])
    offsets = (torch.arange(B, device=a.device) * k).unsqueeze(1)  # (B, 1)
    for _ in range(max_len):
        logits, state, att = decoder.step(words, state, a, keys, mask)
        logp = _word_log_probs(logits)  # (B*k, V)
        V = logp.shape[1]
        logp[finished] = float("-inf")
        logp[finished, Vocabulary.pad_id] = 0.0
        cand = (scores.view(-1, 1) + logp).view(B, k * V)  # (B, k*V)
        scores, flat_idx = cand.topk(k, dim=1)  # (B, k)
        src = (offsets + flat_idx // V).view(-1)  # (B*k,) beam each new hypothesis extends
        words = (flat_idx % V).view(-1)  # (B*k,)
        state = tuple(s[src] for s in state)
        seqs = torch.cat([seqs[src], words.unsqueeze(1)], 1)  # (B*k, t+1)
        alpha_hist = torch.cat([alpha_hist[src], att.alpha[src].unsqueeze(1)], 1)  # (B*k, t+1, L)
        was_finished = finished[src]
        lengths = lengths[src] + (~was_finished).float()
        finished = was_finished | (words == Vocabulary.end_id)
        if finished.all():
            break
    norm = scores / lengths.view(B, k).clamp(min=1) ** length_penalty if length_penalty else scores
    best = norm.argmax(dim=1)  # (B,)
    pick = (offsets.squeeze(1) + best)  # (B,)
    tokens, maps = _trim(seqs[pick], alpha_hist[pick], Vocabulary.end_id)
    return Decoded(tokens, maps, scores.gather(1, best.unsqueeze(1)).squeeze(1))


@torch.no_grad()
def generate(model: Captioner, images: torch.Tensor, beam_size: int = 3, max_len: int = 20,
             length_penalty: float = 0.0) -> tuple[Decoded, tuple[int, int]]:
    """Caption a batch of images; returns the decoded captions and the attention grid size (h, w)."""
    a, grid = model.encode(images)  # (B, L, D)
    if beam_size == 1:
        return greedy_decode(model.decoder, a, max_len, grid=grid), grid
    return beam_search(model.decoder, a, beam_size, max_len, length_penalty, grid=grid), grid
