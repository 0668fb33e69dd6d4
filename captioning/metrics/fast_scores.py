"""BLEU-1..4 and ROUGE-L with array operations, identical to pycocoevalcap's ``Bleu(4)`` and ``Rouge()``.

Both take coco-caption's layout (``gts``: image id -> tokenized references, ``res``: image id -> a
one-element list with the tokenized candidate) and return what the library's ``compute_score`` returns.

* :func:`bleu` counts n-grams with :class:`~captioning.metrics.cider.NgramCounts` (clipped matches
  against each image's maximum reference counts, all integers), then runs the library's floating-point
  formula per image in plain Python - the same expressions in the same order, with its ``tiny`` /
  ``small`` constants, the "closest" reference length (ties go to the shorter reference) and the
  corpus-level brevity penalty - so the numbers are the same to the last bit.
* :func:`rouge_l` computes every (candidate, reference) longest common subsequence at once with a
  bit-parallel algorithm (Hyyrö 2004) on 64-bit words, tokenizing with ``split(" ")`` as the library
  does; references of more than 63 tokens fall back to the library's own dynamic programme.  Precision
  and recall take their maximum over the references and combine with ``beta = 1.2``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from captioning.metrics.cider import NgramCounts, token_ids

__all__ = ["bleu", "rouge_l"]

_Captions = Mapping[Hashable, Sequence[str]]


def _check(gts: _Captions, res: _Captions) -> list[Hashable]:
    if gts.keys() != res.keys():
        raise ValueError("gts and res must have the same image ids")
    for key in res:
        if len(res[key]) != 1 or len(gts[key]) == 0:
            raise ValueError(f"image {key!r} needs exactly one candidate and at least one reference")
    return list(res)


def _clipped_matches(gts: _Captions, res: _Captions, ids: list[Hashable], n: int
                     ) -> tuple[list[list[int]], list[int], list[int]]:
    """Per image: k-gram matches clipped by the max reference count (k = 1..n); all lengths in words."""
    refs = [r for key in ids for r in gts[key]]
    nrefs = np.array([len(gts[key]) for key in ids], dtype=np.int64)
    vocab: dict[str, int] = {}
    tok, lens = token_ids(refs + [res[key][0] for key in ids], vocab, grow=True)
    grams = NgramCounts(tok, lens, n, base=len(vocab))
    num_grams = int(max((len(c) for c in grams.codes), default=1)) * n
    gid = grams.order * (num_grams // n) + grams.gram
    image = np.concatenate((np.repeat(np.arange(len(ids)), nrefs), np.arange(len(ids))))[grams.sent]
    is_ref = grams.sent < len(refs)
    key = image * num_grams + gid
    ref_key, ref_tf = key[is_ref], grams.tf[is_ref]
    order = np.argsort(ref_key, kind="stable")
    ref_key, ref_tf = ref_key[order], ref_tf[order]
    starts = np.flatnonzero(np.concatenate(([True], ref_key[1:] != ref_key[:-1]))) if len(ref_key) else ref_key
    table_key = ref_key[starts]
    table_max = np.maximum.reduceat(ref_tf, starts) if len(starts) else ref_tf
    cand = ~is_ref
    ckey, ctf = key[cand], grams.tf[cand]
    idx = np.minimum(np.searchsorted(table_key, ckey), max(len(table_key) - 1, 0))
    found = table_key[idx] == ckey if len(table_key) else np.zeros(len(ckey), dtype=bool)
    clipped = np.where(found, np.minimum(ctf, table_max[idx] if len(table_key) else 0), 0)
    slot = image[cand] * n + grams.order[cand]
    correct = np.bincount(slot, weights=clipped, minlength=len(ids) * n).reshape(-1, n).astype(np.int64)
    return correct.tolist(), lens[: len(refs)].tolist(), lens[len(refs) :].tolist()


def bleu(gts: _Captions, res: _Captions, n: int = 4) -> tuple[list[float], list[list[float]]]:
    """pycocoevalcap ``Bleu(n).compute_score(gts, res)``: corpus BLEU-1..n and per-image lists."""
    ids = _check(gts, res)
    correct, ref_lens, cand_lens = _clipped_matches(gts, res, ids, n)
    small, tiny = 1e-9, 1e-15  # the library's constants
    bleu_list: list[list[float]] = [[] for _ in range(n)]
    total_test = total_ref = 0
    total_guess, total_correct = [0] * n, [0] * n
    first = 0
    for i, key in enumerate(ids):  # the library's per-image formula, verbatim
        testlen = cand_lens[i]
        reflens = ref_lens[first : first + len(gts[key])]
        first += len(reflens)
        reflen = min((abs(ln - testlen), ln) for ln in reflens)[1]
        guess = [max(0, testlen - k + 1) for k in range(1, n + 1)]
        total_test += testlen
        total_ref += reflen
        score = 1.0
        for k in range(n):
            total_guess[k] += guess[k]
            total_correct[k] += correct[i][k]
            score *= (float(correct[i][k]) + tiny) / (float(guess[k]) + small)
            bleu_list[k].append(score ** (1.0 / (k + 1)))
        ratio = (testlen + tiny) / (reflen + small)
        if ratio < 1:
            for k in range(n):
                bleu_list[k][-1] *= math.exp(1 - 1 / ratio)
    bleus: list[float] = []
    score = 1.0
    for k in range(n):
        score *= float(total_correct[k] + tiny) / (total_guess[k] + small)
        bleus.append(score ** (1.0 / (k + 1)))
    ratio = (total_test + tiny) / (total_ref + small)
    if ratio < 1:
        for k in range(n):
            bleus[k] *= math.exp(1 - 1 / ratio)
    return bleus, bleu_list


def _lcs_bitparallel(cand: np.ndarray, ref: np.ndarray, ref_len: np.ndarray) -> np.ndarray:
    """LCS length of each row pair; `cand` (P, Lc) padded with -1, `ref` (P, Lr <= 63) padded with -2."""
    bits = np.left_shift(np.uint64(1), np.arange(ref.shape[1], dtype=np.uint64))  # (Lr,)
    v = np.full(len(cand), np.iinfo(np.uint64).max, dtype=np.uint64)  # (P,)
    for i in range(cand.shape[1]):
        match = np.bitwise_or.reduce(np.where(cand[:, i : i + 1] == ref, bits, np.uint64(0)), axis=1)  # (P,)
        u = v & match
        v = (v + u) | (v - u)
    mask = np.left_shift(np.uint64(1), ref_len.astype(np.uint64)) - np.uint64(1)
    return ref_len - np.bitwise_count(v & mask).astype(np.int64)


def _lcs_dp(a: Sequence[int], b: Sequence[int]) -> int:
    """Plain dynamic programme (the fallback for long references)."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def _padded(tok: np.ndarray, lens: np.ndarray, fill: int) -> np.ndarray:
    out = np.full((len(lens), int(lens.max(initial=1))), fill, dtype=np.int64)
    out[np.arange(len(lens)).repeat(lens), np.arange(len(tok)) - (np.cumsum(lens) - lens).repeat(lens)] = tok
    return out


def rouge_l(gts: _Captions, res: _Captions, beta: float = 1.2) -> tuple[float, np.ndarray]:
    """pycocoevalcap ``Rouge().compute_score(gts, res)``: mean ROUGE-L and per-image scores."""
    ids = _check(gts, res)
    nrefs = np.array([len(gts[key]) for key in ids], dtype=np.int64)
    refs = [r for key in ids for r in gts[key]]
    vocab: dict[str, int] = {}
    ref_tok, ref_len = token_ids(refs, vocab, grow=True, sep=" ")
    cand_tok, cand_len = token_ids([res[key][0] for key in ids], vocab, grow=True, sep=" ")
    cand_of_pair = np.repeat(np.arange(len(ids)), nrefs)  # pairs in order: (image, reference)
    ref_pad, cand_pad = _padded(ref_tok, ref_len, -2), _padded(cand_tok, cand_len, -1)
    lcs = np.zeros(len(refs), dtype=np.int64)
    short = ref_len <= 63
    if short.any():
        rows = np.flatnonzero(short)
        width = int(ref_len[rows].max())
        lcs[rows] = _lcs_bitparallel(cand_pad[cand_of_pair[rows]], ref_pad[rows, :width], ref_len[rows])
    for p in np.flatnonzero(~short).tolist():
        c = cand_of_pair[p]
        lcs[p] = _lcs_dp(cand_pad[c, : cand_len[c]].tolist(), ref_pad[p, : ref_len[p]].tolist())
    prec = lcs / cand_len[cand_of_pair].astype(np.float64)
    rec = lcs / ref_len.astype(np.float64)
    starts = np.cumsum(nrefs) - nrefs
    prec_max, rec_max = np.maximum.reduceat(prec, starts), np.maximum.reduceat(rec, starts)
    ok = (prec_max != 0) & (rec_max != 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        f = ((1 + beta**2) * prec_max * rec_max) / (rec_max + beta**2 * prec_max)
    scores = np.where(ok, f, 0.0)
    return float(np.mean(scores)), scores
