"""Greedy decoding and beam search in NumPy over exported graphs: the captions of `models/decoding.py`, word for word.

These are ports of `models.decoding.greedy_decode` and `beam_search` (the reference; keep the two in step), for any
`Steps` backend (ONNX Runtime sessions, or TorchScript modules in the tests): the same renormalised word log-
probabilities (without <start> and <pad>, and <unk> when suppressed), the same pool of finished captions, stop rule,
length penalty, max_len candidates, tie rules (the first beam on equal <end> scores, the first word on equal greedy
scores; a finished caption wins a tie) and float32 arithmetic. Beam search repeats a and keys per beam (the graphs
take one row of each per state row) instead of sharing them, which gives the same numbers. Rows that have finished
drop out of the batch, as in the reference, which changes no caption.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from captioning.base.constraints import check_decoding
from captioning.base.decoding import SUPPRESS_UNK

PAD, START, END, UNK = 0, 1, 2, 3  # captioning.base.tokens' ids (the manifest's vocab starts with them)
NEG_INF = np.float32(-np.inf)

State = list[np.ndarray]  # the decoder state, flattened: every array row first


class Steps(Protocol):
    """What decoding needs from exported graphs: per-image keys and initial state, and one decoder step."""

    def init(self, a: np.ndarray) -> tuple[np.ndarray, State]: ...

    def step(self, words: np.ndarray, a: np.ndarray, keys: np.ndarray,
             state: State) -> tuple[np.ndarray, np.ndarray, State]: ...


@dataclass
class Found:
    """One image's caption: word ids without <start>/<end>, the raw log-probability, the map of each word (T, L)."""

    tokens: list[int]
    log_prob: float
    alphas: np.ndarray


def word_log_probs(logits: np.ndarray, suppress_unk: bool = SUPPRESS_UNK) -> np.ndarray:
    """log p(word) (N, V) renormalised without <start> and <pad> (and <unk> with `suppress_unk`), as
    `captioning.models.decoding.word_log_probs`."""
    x = logits.astype(np.float32, copy=True)
    x[:, [START, PAD, UNK][:3 if suppress_unk else 2]] = NEG_INF
    shifted = x - x.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))  # (N, V)


def _rows(state: State, index: np.ndarray) -> State:
    """These rows of every state tensor."""
    return [s[index] for s in state]


def greedy(steps: Steps, a: np.ndarray, max_len: int, suppress_unk: bool = SUPPRESS_UNK) -> list[Found]:
    """The most likely word at every step, for annotation grids a (B, L, D)."""
    check_decoding(1, max_len, 0.0)
    B, L = a.shape[:2]
    keys, state = steps.init(a)
    words = np.full(B, START, dtype=np.int64)
    live = np.arange(B)  # the image of each running row
    seqs = np.full((B, max_len), PAD, dtype=np.int64)
    maps = np.zeros((B, max_len, L), dtype=np.float32)  # widened at step 0 for channel weights after the map
    scores, lengths = np.zeros(B, dtype=np.float32), np.full(B, max_len, dtype=np.int64)
    finished = np.zeros(B, dtype=bool)
    for t in range(max_len):
        logits, alpha, state = steps.step(words, a, keys, state)
        if t == 0 and alpha.shape[1] != L:
            maps = np.zeros((B, max_len, alpha.shape[1]), dtype=np.float32)
        logp = word_log_probs(logits, suppress_unk)  # (b, V)
        words = np.where(finished, PAD, logp.argmax(axis=1))  # (b,); finished captions are fed <pad>
        scores[live] += np.where(finished, np.float32(0), logp[np.arange(len(words)), words])
        seqs[live, t], maps[live, t] = words, alpha
        lengths[live] = np.where(words == END, t, lengths[live])
        finished |= words == END
        n = int(finished.sum())
        if n == len(finished):
            break
        if n and 4 * n >= len(finished):  # drop the finished captions (the reference's rule; no caption changes)
            keep = np.flatnonzero(~finished)
            live, a, keys, words, finished = live[keep], a[keep], keys[keep], words[keep], finished[keep]
            state = _rows(state, keep)
    return [Found(seqs[i, : lengths[i]].tolist(), float(scores[i]), maps[i, : lengths[i]]) for i in range(B)]


def _top(cand: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values of each row (b, n), best first (ties: the lower index first) and their indices."""
    part = np.argpartition(-cand, k - 1, axis=1)[:, :k] if cand.shape[1] > k else np.tile(np.arange(cand.shape[1]),
                                                                                          (cand.shape[0], 1))
    vals = np.take_along_axis(cand, part, axis=1)
    order = np.lexsort((part, -vals), axis=1)  # by value descending, then index
    return np.take_along_axis(vals, order, axis=1), np.take_along_axis(part, order, axis=1)


def _backtrack(tokens: np.ndarray, parents: np.ndarray, alphas: np.ndarray, length: int,
               beam: int) -> tuple[list[int], np.ndarray]:
    """Words and maps of one image's hypothesis: the beam `beam` at step length - 1, followed back."""
    words, maps, cur = [], [], beam
    for s in range(length - 1, -1, -1):
        parent = int(parents[s, cur])
        words.append(int(tokens[s, cur]))
        maps.append(alphas[s, parent])  # the map of the row that ran step s produced word s
        cur = parent
    L = alphas.shape[-1]
    return words[::-1], np.stack(maps[::-1]) if maps else np.zeros((0, L), dtype=np.float32)


def beam(steps: Steps, a: np.ndarray, beam_size: int, max_len: int, length_penalty: float = 0.0,
         suppress_unk: bool = SUPPRESS_UNK) -> list[Found]:
    """Batched beam search with a pool of finished captions per image (rules: `models.decoding.beam_search`)."""
    check_decoding(beam_size, max_len, length_penalty)
    B, k, lp = a.shape[0], beam_size, float(length_penalty)
    keys, state = steps.init(a)
    logits, alpha, state = steps.step(np.full(B, START, dtype=np.int64), a, keys, state)  # step 0: once per image
    state, logits, alpha = _repeat(state, k), np.repeat(logits, k, axis=0), np.repeat(alpha, k, axis=0)
    a, keys = np.repeat(a, k, axis=0), np.repeat(keys, k, axis=0)  # row b k + j: beam j of image b
    scores = np.full((B, k), NEG_INF, dtype=np.float32)
    scores[:, 0] = 0.0  # only the first copy may expand at step 0
    tokens = np.zeros((max_len, B, k), dtype=np.int64)
    parents = np.zeros((max_len, B, k), dtype=np.int64)
    W = alpha.shape[1]  # L, or L + C with channel weights after the map
    alphas = np.zeros((max_len, B, k, W), dtype=np.float32)
    best_raw, best_norm = np.full(B, NEG_INF, dtype=np.float32), np.full(B, NEG_INF, dtype=np.float32)
    best_len, best_beam = np.zeros(B, dtype=np.int64), np.zeros(B, dtype=np.int64)
    done, live = np.zeros(B, dtype=bool), np.arange(B)  # live: the image of each image still searching
    words, steps_run = np.zeros(B * k, dtype=np.int64), max_len
    for t in range(max_len):
        b = len(live)
        if t > 0:
            logits, alpha, state = steps.step(words, a, keys, state)
        cand = (word_log_probs(logits, suppress_unk) + scores.reshape(-1, 1)).reshape(b, k, -1)  # (b, k, V) raw log p
        V = cand.shape[2]
        end_beam = cand[:, :, END].argmax(axis=1)  # (b,) the best continuation by <end>: the first on a tie
        end_score = cand[np.arange(b), end_beam, END]
        cand[:, :, END] = NEG_INF
        scores, flat = _top(cand.reshape(b, k * V), k)  # (b, k) the k best live ones, best first
        parent, word = flat // V, flat % V
        tokens[t, live], parents[t, live], alphas[t, live] = word, parent, alpha.reshape(b, k, W)
        end_norm = end_score / np.float32((t + 1) ** lp)
        better = (end_score >= scores[:, -1]) & (end_norm > best_norm[live]) & ~done
        best_raw[live] = np.where(better, end_score, best_raw[live])
        best_norm[live] = np.where(better, end_norm, best_norm[live])
        best_len[live] = np.where(better, t, best_len[live])
        best_beam[live] = np.where(better, end_beam, best_beam[live])
        state = _rows(state, (np.arange(b)[:, None] * k + parent).reshape(-1))  # the row each beam continues
        words = word.reshape(-1)
        if t + 1 < max_len:
            done |= best_norm[live] >= scores[:, 0] / np.float32(max_len ** lp)
            n = int(done.sum())
            if n == b:
                steps_run = t + 1
                break
            if n and 4 * n >= b:  # images that are done drop out (their results stay in best_*)
                keep = np.flatnonzero(~done)
                rows = (keep[:, None] * k + np.arange(k)).reshape(-1)  # (b' k,)
                a, keys, state, words = a[rows], keys[rows], _rows(state, rows), words[rows]
                scores, done, live = scores[keep], done[keep], live[keep]
    else:  # max_len reached: the best live hypothesis (length max_len, no <end>) is a candidate too
        better = (scores[:, 0] / np.float32(max_len ** lp) > best_norm[live]) & ~done
        best_raw[live] = np.where(better, scores[:, 0], best_raw[live])
        best_len[live] = np.where(better, max_len, best_len[live])
        best_beam[live] = np.where(better, 0, best_beam[live])
    out = []
    for i in range(B):
        ids, maps = _backtrack(tokens[:steps_run, i], parents[:steps_run, i], alphas[:steps_run, i],
                               int(best_len[i]), int(best_beam[i]))
        out.append(Found(ids, float(best_raw[i]), maps))
    return out


def _repeat(state: State, k: int) -> State:
    """Every row repeated k times, consecutively (row b k + j is copy j of row b)."""
    return [np.repeat(s, k, axis=0) for s in state]


def decode(steps: Steps, a: np.ndarray, beam_size: int, max_len: int, length_penalty: float = 0.0,
           suppress_unk: bool = SUPPRESS_UNK) -> list[Found]:
    """What `Captioner.generate` does with a: greedy for beam 1 without a length penalty, else beam search."""
    if beam_size == 1 and length_penalty == 0:
        return greedy(steps, a, max_len, suppress_unk)
    return beam(steps, a, beam_size, max_len, length_penalty, suppress_unk)


def words_of(tokens: Sequence[int], itos: Sequence[str]) -> list[str]:
    """Word ids to words as `Vocabulary.decode` does: <start>/<pad> skipped, stopping at <end>."""
    out = []
    for i in tokens:
        if i == END:
            break
        if i not in (PAD, START):
            out.append(itos[i])
    return out
