"""Greedy decoding and batched beam search: the only copies, used by validation, evaluation and captioning.

Both work with any decoder that has the step interface of `ShowAttendTellDecoder` (see `StepDecoder`), write
step t into buffers allocated once for max_len steps, and synchronise with the host once per step (the stop
test) and once at the end. Beam search keeps a, keys and mask once per image when the decoder's attention reads
k consecutive rows per image (`rows_share_images`), instead of copying them for each of the k beams.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from captioning.data.vocab import Vocabulary
from captioning.models.attention import AttentionOutput
from captioning.models.decoder import map_state, repeat_rows


class StepDecoder(Protocol):
    """What decoding needs from a decoder: per-image keys, an initial state and one step.

    The state may be any tuple (nested or not) of tensors whose first dim is the row (image or beam). A decoder
    whose `rows_share_images` is true also accepts a, keys and mask with one row per image while the state holds
    k consecutive rows per image (beam search then never copies them k times).
    """

    attention: Any  # has .prepare(a, grid) -> keys (B, L, A)
    rows_share_images: bool  # optional; False when absent

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> Any: ...

    def step(self, words: torch.Tensor, state: Any, a: torch.Tensor, keys: torch.Tensor,
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, Any, AttentionOutput]: ...


@dataclass
class Decoded:
    """Decoded captions for B images (special tokens removed) with the attention map of each word."""

    tokens: list[list[int]]  # per image, word ids without <start>/<end>
    alphas: list[torch.Tensor]  # per image, (T_i, L): the map used to produce each word
    scores: torch.Tensor  # (B,) raw log-probability of the chosen sequence (incl. <end> if it has one)


def _check(beam_size: int, max_len: int, length_penalty: float = 0.0) -> None:
    """Refuse settings that cannot decode anything."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if length_penalty < 0:
        raise ValueError(f"length_penalty must be >= 0 (0 ranks by raw log-probability), got {length_penalty}")


def word_log_probs(logits: torch.Tensor, special: torch.Tensor) -> torch.Tensor:
    """log p(word) renormalised without `special` (<start> and <pad>), which are never targets in training."""
    return F.log_softmax(logits.index_fill(1, special, float("-inf")), dim=-1)  # (N, V)


def special_ids(device: torch.device) -> torch.Tensor:
    """The ids decoding never emits: <start> and <pad>."""
    return torch.tensor([Vocabulary.start_id, Vocabulary.pad_id], device=device)


def _finish(seqs: torch.Tensor, maps: torch.Tensor, lengths: torch.Tensor, scores: torch.Tensor) -> Decoded:
    """Cut each caption (B, T) and its maps (B, T, L) to its length in words; one transfer to the host."""
    maps = maps.cpu()
    n = lengths.tolist()
    return Decoded([row[:m] for row, m in zip(seqs.tolist(), n)], [maps[i, :m] for i, m in enumerate(n)], scores)


@torch.no_grad()
def greedy_decode(decoder: StepDecoder, a: torch.Tensor, max_len: int,
                  mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None) -> Decoded:
    """Pick the most likely word at every step, for a batch of annotation grids a (B, L, D)."""
    _check(1, max_len)
    (B, L), pad, end = a.shape[:2], Vocabulary.pad_id, Vocabulary.end_id
    keys = decoder.attention.prepare(a, grid)  # (B, L, A)
    state = decoder.init_state(a, mask)
    words = a.new_full((B,), Vocabulary.start_id, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool, device=a.device)
    scores = a.new_zeros(B)
    seqs = a.new_full((B, max_len), pad, dtype=torch.long)  # word t of each caption, written in place
    maps = a.new_zeros(B, max_len, L)  # alpha_t of each word
    lengths = torch.full((B,), max_len, dtype=torch.long, device=a.device)  # words before <end>
    special = special_ids(a.device)
    for t in range(max_len):
        logits, state, att = decoder.step(words, state, a, keys, mask)
        logp = word_log_probs(logits, special)  # (B, V)
        words = logp.argmax(dim=-1).masked_fill(finished, pad)  # (B,); finished captions are fed <pad>
        scores += logp.gather(1, words.unsqueeze(1)).squeeze(1).masked_fill(finished, 0.0)
        seqs[:, t], maps[:, t] = words, att.alpha
        lengths = torch.where(words == end, t, lengths)
        finished |= words == end
        if finished.all():  # the one host sync per step
            break
    return _finish(seqs, maps, lengths, scores)


def _backtrack(tokens: torch.Tensor, parents: torch.Tensor, alphas: torch.Tensor, lengths: torch.Tensor,
               beams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Follow back-pointers (T, B, k) from beam `beams` (B,) at step lengths - 1: words (B, T), maps (B, T, L)."""
    T, B = tokens.shape[:2]
    img = torch.arange(B, device=tokens.device)
    seqs = tokens.new_full((B, T), Vocabulary.pad_id)
    maps = alphas.new_zeros(B, T, alphas.shape[-1])
    cur = beams
    for s in range(T - 1, -1, -1):
        cur = torch.where(lengths - 1 == s, beams, cur)  # each caption's last word is at step lengths - 1
        inside = (s < lengths).unsqueeze(1)  # (B, 1)
        parent = parents[s, img, cur]  # (B,) the beam that ran step s: its alpha_s produced the word
        seqs[:, s] = torch.where(inside[:, 0], tokens[s, img, cur], Vocabulary.pad_id)
        maps[:, s] = torch.where(inside, alphas[s, img, parent], 0.0)  # (B, L)
        cur = parent
    return seqs, maps


@torch.no_grad()
def beam_search(decoder: StepDecoder, a: torch.Tensor, beam_size: int, max_len: int,
                length_penalty: float = 0.0, mask: torch.Tensor | None = None,
                grid: tuple[int, int] | None = None) -> Decoded:
    """Batched beam search (B images x k beams in one tensor) with a pool of finished captions per image.

    Length n of a hypothesis: its words plus its <end> if it has one (the number of log-probs in its score);
    its normalised score is log p / n**length_penalty.
    - Live beam: at each step every image keeps its k best continuations that do not end in <end>, ranked
      by raw log p. All live hypotheses have the same length, so normalising would not change this order.
    - Pool: a continuation ending in <end> leaves the beam for the image's pool (it takes no live place)
      when it ranks among the k best continuations of that step (the usual rule; it makes k = 1 exactly
      greedy when length_penalty = 0). The pool keeps its best member by normalised score.
    - Stop: an image is done when no live hypothesis can beat its best finished one. Word log-probs are
      <= 0, so a live hypothesis of score s can only end with a raw score s' <= s at a length n' <= max_len;
      with length_penalty >= 0 its normalised score is s' / n'**lp <= s / max_len**lp, the bound used (with
      lp = 0: best finished >= best live). The search ends when every image is done (one host sync per
      step) or after max_len steps, where the unfinished live hypotheses are candidates too, with length
      max_len (as in arctic-captions' gen_sample, which returns them beside finished ones), so an image
      whose captions never end still gets its best prefix.
    - Choice: the best candidate by normalised score (a finished one wins ties); `scores` holds its raw
      log-probability.
    """
    _check(beam_size, max_len, length_penalty)
    (B, L), k, dev = a.shape[:2], beam_size, a.device
    lp, end = float(length_penalty), Vocabulary.end_id
    keys = decoder.attention.prepare(a, grid)  # (B, L, A) once per image
    state = decoder.init_state(a, mask)
    # Step 0 runs once per image (all k beams would start identical), then every row is repeated k times.
    logits, state, att = decoder.step(a.new_full((B,), Vocabulary.start_id, dtype=torch.long), state, a, keys, mask)
    state, logits, alpha = repeat_rows((state, logits, att.alpha), k)  # row b k + j
    if not getattr(decoder, "rows_share_images", False):  # else the decoder reads k rows per image of a, keys, mask
        a, keys, mask = repeat_rows((a, keys, mask), k)  # (B k, L, D), ...
    scores = a.new_full((B, k), float("-inf"))
    scores[:, 0] = 0.0  # only the first copy may expand at step 0
    tokens = torch.zeros(max_len, B, k, dtype=torch.long, device=dev)  # word of live beam j after step t
    parents = torch.zeros_like(tokens)  # the beam (at step t - 1) it extends
    alphas = a.new_zeros(max_len, B, k, L)  # alpha_t of each row that ran step t, before reordering
    best_raw, best_norm = a.new_full((B,), float("-inf")), a.new_full((B,), float("-inf"))
    best_len = torch.zeros(B, dtype=torch.long, device=dev)  # words of the best candidate (its <end> excluded)
    best_beam = torch.zeros(B, dtype=torch.long, device=dev)  # the beam holding its last word
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    first_row = (torch.arange(B, device=dev) * k).unsqueeze(1)  # (B, 1)
    special, steps = special_ids(dev), max_len
    words = tokens[0, :, 0]  # placeholder: step 0 ran above; every step sets the next words (B k,)
    for t in range(max_len):
        if t > 0:
            logits, state, att = decoder.step(words, state, a, keys, mask)
            alpha = att.alpha
        alphas[t] = alpha.view(B, k, L)
        cand = word_log_probs(logits, special).add_(scores.view(-1, 1)).view(B, k, -1)  # (B, k, V) raw log p
        V = cand.shape[2]
        end_score, end_beam = cand[:, :, end].max(dim=1)  # (B,) the best continuation by <end>
        cand[:, :, end] = float("-inf")
        scores, flat = cand.view(B, k * V).topk(k, dim=1)  # (B, k) the k best live ones, best first
        parent, word = flat // V, flat % V  # (B, k)
        tokens[t], parents[t] = word, parent
        end_norm = end_score / (t + 1) ** lp
        better = (end_score >= scores[:, -1]) & (end_norm > best_norm) & ~done  # among the k best, and better
        best_raw, best_norm = torch.where(better, end_score, best_raw), torch.where(better, end_norm, best_norm)
        best_len, best_beam = torch.where(better, t, best_len), torch.where(better, end_beam, best_beam)
        rows = (first_row + parent).view(-1)  # (B*k,) the row each new beam continues
        state, words = map_state(functools.partial(torch.index_select, dim=0, index=rows), state), word.view(-1)
        if t + 1 < max_len:
            done |= best_norm >= scores[:, 0] / max_len ** lp
            if done.all():  # the one host sync per step
                steps = t + 1
                break
    else:  # max_len reached: the best live hypothesis (length max_len, no <end>) is a candidate too
        better = (scores[:, 0] / max_len ** lp > best_norm) & ~done
        best_raw = torch.where(better, scores[:, 0], best_raw)
        best_len, best_beam = torch.where(better, max_len, best_len), torch.where(better, 0, best_beam)
    seqs, maps = _backtrack(tokens[:steps], parents[:steps], alphas[:steps], best_len, best_beam)
    return _finish(seqs, maps, best_len, best_raw)
