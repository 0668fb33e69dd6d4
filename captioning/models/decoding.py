"""Greedy decoding and batched beam search: the only copies, used by validation, evaluation and captioning.

Both work with any decoder that has the step interface of `ShowAttendTellDecoder` (see `StepDecoder`), write
step t into buffers allocated once for max_len steps, and synchronise with the host once per step (the stop
test) and once at the end. Beam search keeps a, keys and mask once per image when the decoder's attention reads
k consecutive rows per image (`rows_share_images`), instead of copying them for each of the k beams.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from captioning.base.constraints import check_decoding
from captioning.base.decoding import SUPPRESS_UNK
from captioning.base.tokens import END_ID, PAD_ID, START_ID, UNK_ID
from captioning.models.attention import AttentionOutput
from captioning.models.decoded import Decoded, backtrack, finish
from captioning.models.fused.dtypes import autocast_input
from captioning.models.rows import live_rows, map_state, repeat_rows, select_rows


class StepDecoder(Protocol):
    """What decoding needs from a decoder: per-image keys, an initial state and one step.

    The state, and the keys `attention.prepare` gives, may be any tuple (nested or not) of tensors whose first dim is
    the row (image or beam): an ensemble's hold each model's (captioning/models/ensemble.py). A decoder
    whose `rows_share_images` is true also accepts a, keys and mask with one row per image while the state holds
    k consecutive rows per image (beam search then never copies them k times).
    """

    attention: Any  # has .prepare(a, grid, mask) -> keys (B, L, A)
    rows_share_images: bool  # optional; False when absent

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> Any: ...

    def step(self, words: torch.Tensor, state: Any, a: torch.Tensor, keys: Any,
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, Any, AttentionOutput]: ...


def word_log_probs(logits: torch.Tensor, special: torch.Tensor) -> torch.Tensor:
    """log p(word) renormalised without `special` (<start> and <pad>, which are never targets in training; <unk>
    when it is suppressed)."""
    return F.log_softmax(logits.index_fill(1, special, float("-inf")), dim=-1)  # (N, V)


def special_ids(device: torch.device, suppress_unk: bool = False) -> torch.Tensor:
    """The ids decoding never emits: <start> and <pad>, and <unk> with `suppress_unk`."""
    return torch.tensor([START_ID, PAD_ID, UNK_ID][:3 if suppress_unk else 2], device=device)


def compact_due(done: torch.Tensor) -> tuple[bool, bool]:
    """(all done, worth compacting): the one host sync per step; compact once a quarter of the rows are done, so
    that each copy of a, keys and the state is paid back by the steps after it."""
    n = int(done.sum())
    return n == done.shape[0], n > 0 and 4 * n >= done.shape[0]


def _put(out: torch.Tensor, live: torch.Tensor | None, value: torch.Tensor) -> None:
    """Write value into the rows `live` of out (None: all rows, in order)."""
    if live is None:
        out.copy_(value)
    else:
        out.index_copy_(0, live, value.to(out.dtype))  # e.g. bf16 maps into a float32 buffer


@torch.no_grad()
def greedy_decode(decoder: StepDecoder, a: torch.Tensor, max_len: int, mask: torch.Tensor | None = None,
                  grid: tuple[int, int] | None = None, suppress_unk: bool = SUPPRESS_UNK) -> Decoded:
    """Pick the most likely word at every step, for a batch of annotation grids a (B, L, D).

    Captions that have ended drop out of the batch (once a quarter of the running ones has): the others decode
    exactly as they would have with them.
    """
    check_decoding(1, max_len)
    (B, L), pad, end = a.shape[:2], PAD_ID, END_ID
    keys = decoder.attention.prepare(a, grid, mask)  # (B, L, A)
    state = decoder.init_state(a, mask)
    words = a.new_full((B,), START_ID, dtype=torch.long)
    finished = torch.zeros(B, dtype=torch.bool, device=a.device)
    live: torch.Tensor | None = None  # the image of each running row (None: all, in order)
    scores = a.new_zeros(B)
    seqs = a.new_full((B, max_len), pad, dtype=torch.long)  # word t of each caption, written in place
    maps: torch.Tensor | None = None  # alpha_t of each word (and its channel weights), allocated at step 0
    lengths = torch.full((B,), max_len, dtype=torch.long, device=a.device)  # words before <end>
    run_scores, run_lengths = scores.clone(), lengths.clone()  # of the running rows
    special = special_ids(a.device, suppress_unk)
    a = autocast_input(a)  # under bf16/fp16 autocast: cast once, not at every step (the buffers stay float32)
    for t in range(max_len):
        logits, state, att = decoder.step(words, state, a, keys, mask)
        logp = word_log_probs(logits, special)  # (b, V)
        words = logp.argmax(dim=-1).masked_fill(finished, pad)  # (b,); finished captions are fed <pad>
        run_scores += logp.gather(1, words.unsqueeze(1)).squeeze(1).masked_fill(finished, 0.0)
        _put(seqs[:, t], live, words)
        if maps is None:
            maps = a.new_zeros(B, max_len, att.maps.shape[1], dtype=scores.dtype)
        _put(maps[:, t], live, att.maps)
        run_lengths = torch.where(words == end, t, run_lengths)
        finished |= words == end
        every, compact = compact_due(finished)
        if every:
            break
        if compact:  # drop the finished captions from the batch
            _put(scores, live, run_scores)
            _put(lengths, live, run_lengths)
            keep = (~finished).nonzero().squeeze(1)  # (b',)
            live = keep if live is None else live[keep]
            a, keys, mask, words, finished, run_scores, run_lengths = select_rows(keep, a, keys, mask, words, finished,
                                                                              run_scores, run_lengths)
            state = map_state(functools.partial(torch.index_select, dim=0, index=keep), state)
    _put(scores, live, run_scores)
    _put(lengths, live, run_lengths)
    assert maps is not None  # max_len >= 1: step 0 ran
    return finish(seqs, maps, lengths, scores, L)


@torch.no_grad()
def beam_search(decoder: StepDecoder, a: torch.Tensor, beam_size: int, max_len: int,
                length_penalty: float = 0.0, mask: torch.Tensor | None = None,
                grid: tuple[int, int] | None = None, n_best: int = 1, suppress_unk: bool = SUPPRESS_UNK) -> Decoded:
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
    - Alternatives (n_best > 1): every continuation by <end> that enters a pool as above (not only each step's
      best one), and at max_len the k live hypotheses, compete for n_best places by normalised score. An image is
      then done when no live hypothesis can enter its pool (the bound above against its n-th place): the search
      runs longer, but its beams and its choice are those of n_best = 1 (nothing found later beats the choice).
    """
    check_decoding(beam_size, max_len, length_penalty)
    if n_best < 1:
        raise ValueError(f"n_best must be >= 1, got {n_best}")
    (B, L), k, dev = a.shape[:2], beam_size, a.device
    lp, end = float(length_penalty), END_ID
    keys = decoder.attention.prepare(a, grid, mask)  # (B, L, A) once per image
    state = decoder.init_state(a, mask)
    buffers, a = a, autocast_input(a)  # under bf16/fp16 autocast: a cast once, not at every step; buffers float32
    # Step 0 runs once per image (all k beams would start identical), then every row is repeated k times.
    logits, state, att = decoder.step(a.new_full((B,), START_ID, dtype=torch.long), state, a, keys, mask)
    state, logits, alpha = repeat_rows((state, logits, att.maps), k)  # row b k + j
    shared = getattr(decoder, "rows_share_images", False)  # the decoder reads k rows per image of a, keys, mask
    if not shared:
        a, keys, mask = repeat_rows((a, keys, mask), k)  # (B k, L, D), ...
    scores = buffers.new_full((B, k), float("-inf"))
    scores[:, 0] = 0.0  # only the first copy may expand at step 0
    tokens = torch.zeros(max_len, B, k, dtype=torch.long, device=dev)  # word of live beam j after step t
    parents = torch.zeros_like(tokens)  # the beam (at step t - 1) it extends
    W = alpha.shape[1]  # L, or L + C with channel weights
    alphas = buffers.new_zeros(max_len, B, k, W)  # alpha_t of each row that ran step t, before reordering
    # Per image still searching (`live`: which image it is); images that are done drop out once a quarter of
    # them are (their results go to `out`), and the others search exactly as they would have with them.
    best_raw, best_norm = buffers.new_full((B,), float("-inf")), buffers.new_full((B,), float("-inf"))
    best_len = torch.zeros(B, dtype=torch.long, device=dev)  # words of the best candidate (its <end> excluded)
    best_beam = torch.zeros(B, dtype=torch.long, device=dev)  # the beam holding its last word
    # the n-best pool (n_best > 1): normalised and raw scores, length and beam of each place, per image
    pool = [best_norm.new_full((B, n_best), float("-inf")), best_raw.new_full((B, n_best), float("-inf")),
            best_len.new_zeros(B, n_best), best_beam.new_zeros(B, n_best)] if n_best > 1 else []
    out = [best_raw.clone(), best_len.clone(), best_beam.clone(), *[p.clone() for p in pool]]
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    live: torch.Tensor | None = None  # the image of each searching row (None: all, in order)
    special, steps = special_ids(dev, suppress_unk), max_len
    words = tokens[0, :, 0]  # placeholder: step 0 ran above; every step sets the next words (B k,)
    for t in range(max_len):
        b = scores.shape[0]
        if t > 0:
            logits, state, att = decoder.step(words, state, a, keys, mask)
            alpha = att.maps
        cand = word_log_probs(logits, special).add_(scores.view(-1, 1)).view(b, k, -1)  # (b, k, V) raw log p
        V = cand.shape[2]
        ends = cand[:, :, end].clone() if pool else cand[:, :, end]  # (b, k) each beam's continuation by <end>
        end_score, end_beam = ends.max(dim=1)  # (b,) the best one
        cand[:, :, end] = float("-inf")
        scores, flat = cand.view(b, k * V).topk(k, dim=1)  # (b, k) the k best live ones, best first
        if pool:
            entered = (ends >= scores[:, -1:]) & ~done.unsqueeze(1)
            pool = _merge_pool(pool, ends.masked_fill(~entered, float("-inf")), t, lp)
        parent, word = flat // V, flat % V  # (b, k)
        _put(tokens[t], live, word)
        _put(parents[t], live, parent)
        _put(alphas[t], live, alpha.view(b, k, W))
        end_norm = end_score / (t + 1) ** lp
        better = (end_score >= scores[:, -1]) & (end_norm > best_norm) & ~done  # among the k best, and better
        best_raw, best_norm = torch.where(better, end_score, best_raw), torch.where(better, end_norm, best_norm)
        best_len, best_beam = torch.where(better, t, best_len), torch.where(better, end_beam, best_beam)
        rows = (torch.arange(b, device=dev).unsqueeze(1) * k + parent).view(-1)  # (b k,) the row each beam continues
        state, words = map_state(functools.partial(torch.index_select, dim=0, index=rows), state), word.view(-1)
        if t + 1 < max_len:
            done |= (pool[0][:, -1] if pool else best_norm) >= scores[:, 0] / max_len ** lp
            every, compact = compact_due(done)
            if every:
                steps = t + 1
                break
            if compact:
                for o, v in zip(out, (best_raw, best_len, best_beam, *pool)):
                    _put(o, live, v)
                keep = (~done).nonzero().squeeze(1)  # (b',) images still searching
                beams = live_rows(keep, k)  # (b' k,)
                a, keys, mask = select_rows(keep if shared else beams, a, keys, mask)
                state = map_state(functools.partial(torch.index_select, dim=0, index=beams), state)
                words, scores, done = words[beams], scores[keep], done[keep]
                live = keep if live is None else live[keep]
                best_raw, best_norm, best_len, best_beam = select_rows(keep, best_raw, best_norm, best_len, best_beam)
                pool = select_rows(keep, *pool)
    else:  # max_len reached: the best live hypothesis (length max_len, no <end>) is a candidate too
        better = (scores[:, 0] / max_len ** lp > best_norm) & ~done
        best_raw = torch.where(better, scores[:, 0], best_raw)
        best_len, best_beam = torch.where(better, max_len, best_len), torch.where(better, 0, best_beam)
        if pool:
            pool = _merge_pool(pool, scores.masked_fill(done.unsqueeze(1), float("-inf")), max_len, lp)
    for o, v in zip(out, (best_raw, best_len, best_beam, *pool)):
        _put(o, live, v)
    best_raw, best_len, best_beam = out[:3]
    seqs, maps = backtrack(tokens[:steps], parents[:steps], alphas[:steps], best_len, best_beam)
    decoded = finish(seqs, maps, best_len, best_raw, L)
    if n_best > 1:
        decoded.alternatives = _alternatives(decoded, out[3:], tokens[:steps], parents[:steps], alphas[:steps],
                                             best_len, best_beam, L)
    return decoded


def decode(decoder: StepDecoder, a: torch.Tensor, beam_size: int, max_len: int, length_penalty: float = 0.0,
           n_best: int = 1, mask: torch.Tensor | None = None, grid: tuple[int, int] | None = None,
           suppress_unk: bool = SUPPRESS_UNK) -> Decoded:
    """Greedy decoding where it gives beam search's captions without the pool (beam 1, no length penalty, one
    caption), else beam search: what every captioner's `generate` runs. `suppress_unk`: never emit <unk>."""
    if beam_size == 1 and length_penalty == 0 and n_best == 1:
        return greedy_decode(decoder, a, max_len, mask=mask, grid=grid, suppress_unk=suppress_unk)
    return beam_search(decoder, a, beam_size, max_len, length_penalty, mask=mask, grid=grid, n_best=n_best,
                       suppress_unk=suppress_unk)


def _merge_pool(pool: list[torch.Tensor], raw: torch.Tensor, length: int, lp: float) -> list[torch.Tensor]:
    """The n best of the pool (norm, raw, len, beam; each (b, n)) and the k candidates raw (b, k) of this length."""
    b, k = raw.shape
    norm = raw / length ** lp
    lengths = pool[2].new_full((b, k), length)
    beams = torch.arange(k, device=raw.device).expand(b, k)
    merged = [torch.cat(pair, dim=1) for pair in zip(pool, (norm, raw, lengths, beams))]
    order = merged[0].topk(pool[0].shape[1], dim=1).indices  # (b, n)
    return [m.gather(1, order) for m in merged]


def _alternatives(decoded: Decoded, pool: list[torch.Tensor], tokens: torch.Tensor, parents: torch.Tensor,
                  alphas: torch.Tensor, best_len: torch.Tensor, best_beam: torch.Tensor,
                  num_regions: int) -> list[list[tuple[list[int], torch.Tensor, float]]]:
    """Per image: the chosen caption, then the pool's others by normalised score (n_best in all, fewer if fewer)."""
    _, raw, lengths, beams = pool
    n = raw.shape[1]
    found = [finish(*backtrack(tokens, parents, alphas, lengths[:, j], beams[:, j]), lengths[:, j], raw[:, j],
                     num_regions) for j in range(n)]
    same = ((lengths == best_len.unsqueeze(1)) & (beams == best_beam.unsqueeze(1))).tolist()
    real = torch.isfinite(raw).tolist()
    result = []
    for i, (words, maps, score) in enumerate(zip(decoded.tokens, decoded.alphas, decoded.scores.tolist())):
        others = [(f.tokens[i], f.alphas[i], float(f.scores[i])) for j, f in enumerate(found)
                  if real[i][j] and not same[i][j]]
        result.append([(words, maps, score), *others][:n])
    return result
