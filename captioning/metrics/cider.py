"""Fast CIDEr-D: document frequencies computed once, many candidates scored with array operations.

:class:`CiderD` gives the numbers of pycocoevalcap's ``Cider()`` (``CiderScorer``: n-grams up to
``n=4``, tf-idf vectors, clipped cosine similarity, Gaussian length penalty with ``sigma=6``, mean over
n-gram orders and references, times 10, idf ``log(#images) - log(max(1, df))``) bit for bit, not only
to rounding: every sum runs in the same order as the library's loops, and every value the library
takes from ``pow`` / ``log`` / ``e**x`` comes from the same scalar call, looked up in a small table.

How it is fast.  Tokens become integer ids, and an n-gram of order k becomes the rank of its (k-1)-gram
prefix times the vocabulary size plus its last token, so all n-grams of a corpus are found and counted
with ``np.unique`` instead of per-n-gram dictionaries.  The references are cooked once (document
frequencies, tf-idf weights, norms, lengths) when the object is built; scoring looks each candidate
n-gram up in a table sorted by (image, n-gram) and sums the matches with ``np.bincount``.

Two quirks of the library are kept on purpose: the "length" in the length penalty is the number of
bigrams of a caption (``max(len - 1, 0)`` words), and a candidate n-gram never seen in the references
gets document frequency 0, i.e. the largest idf.

Document frequencies and ``log(#images)`` come from the references the object was built with.  Scoring
one candidate for each of those images gives exactly pycocoevalcap's numbers; scoring a subset (a
minibatch during reward training) or several candidates per image keeps the corpus-level statistics,
as CIDEr-D optimisation usually does.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from itertools import chain
from typing import Any

import numpy as np

__all__ = ["CiderD", "NgramCounts", "token_ids"]


def token_ids(sentences: Sequence[str], vocab: dict[str, int], grow: bool, sep: str | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """Flattened token ids of ``sentence.split(sep)`` for each of `sentences`, and their lengths.

    With ``grow`` unknown words are added to `vocab`; otherwise they get fresh ids >= len(vocab) that
    are only meaningful inside this call.
    """
    split = [sentence.split(sep) for sentence in sentences]
    lens = np.fromiter(map(len, split), dtype=np.int64, count=len(split))
    words = list(chain.from_iterable(split))
    new = [w for w in dict.fromkeys(words) if w not in vocab]
    lookup = vocab if grow else dict(vocab)
    lookup.update(zip(new, range(len(vocab), len(vocab) + len(new))))
    return np.fromiter(map(lookup.__getitem__, words), dtype=np.int64, count=len(words)), lens


def _distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values (a sort, not ``np.unique``'s hash path, which is slow on these keys)."""
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) else values


class NgramCounts:
    """Every distinct n-gram of every sentence of a batch, with its count, in the library's order.

    Rows (one per distinct (sentence, n-gram)): ``sent`` sentence index, ``order`` k - 1, ``tf`` count in
    the sentence, ``pos`` flat position of its first occurrence, ``gram`` its id among the batch's
    k-grams.  ``rank[k - 1]`` maps a flat position to the id of the k-gram starting there (-1 where none
    starts) and ``codes[k - 1]`` lists the batch's k-gram codes, sorted: code = token id for k = 1,
    ``rank[k - 2] * base + last token id`` above.  Rows are sorted by (sentence, order, first
    occurrence), the insertion order of pycocoevalcap's ``precook`` dictionaries, which fixes the order
    of every floating-point sum.
    """

    def __init__(self, tok: np.ndarray, lens: np.ndarray, n: int, base: int) -> None:
        num = len(lens)
        sent_of = np.repeat(np.arange(num), lens)  # (T,)
        starts = np.cumsum(lens) - lens
        room = lens[sent_of] - (np.arange(len(tok)) - starts[sent_of])  # words left from each position
        self.rank: list[np.ndarray] = []
        self.codes: list[np.ndarray] = []
        per_order: list[tuple[np.ndarray, ...]] = []
        for k in range(1, n + 1):
            pos = np.flatnonzero(room >= k)
            code = tok[pos] if k == 1 else self.rank[-1][pos] * base + tok[pos + k - 1]
            uniq, inv = np.unique(code, return_inverse=True)
            rank = np.full(len(tok), -1, dtype=np.int64)
            rank[pos] = inv
            self.rank.append(rank)
            self.codes.append(uniq)
            # First occurrence and count of each (sentence, k-gram), kept in position order (no re-sort).
            key = sent_of[pos] * max(len(uniq), 1) + inv
            perm = np.argsort(key, kind="stable")
            head = np.flatnonzero(np.concatenate(([True], key[perm[1:]] != key[perm[:-1]]))) if len(key) else perm
            count = np.zeros(len(pos), dtype=np.int64)
            count[perm[head]] = np.diff(np.append(head, len(key)))
            first = np.flatnonzero(count)
            per_order.append((sent_of[pos[first]], count[first], pos[first], inv[first]))
        # Interleave the orders into (sentence, order, position) order with arithmetic instead of a sort.
        size = np.stack([np.bincount(rows[0], minlength=num) for rows in per_order], axis=1)  # (S, n)
        group_start = (np.cumsum(size) - size.ravel()).reshape(num, n)
        total = int(size.sum())
        self.sent, self.order, self.tf, self.pos, self.gram = (np.empty(total, dtype=np.int64) for _ in range(5))
        for k, (sent, tf, pos, gram) in enumerate(per_order):
            within = np.arange(len(sent)) - (np.cumsum(size[:, k]) - size[:, k])[sent]
            dest = group_start[sent, k] + within
            self.sent[dest], self.order[dest], self.tf[dest], self.pos[dest], self.gram[dest] = sent, k, tf, pos, gram


class CiderD:
    """CIDEr-D with document frequencies from `references`; identical to pycocoevalcap's ``Cider()``.

    Build it once from the references, then call :meth:`score` (one candidate per image, like
    ``Cider().compute_score``) or :meth:`score_many` (any image ids, repeats allowed) as often as needed.

    Args:
        references: image id -> its tokenized reference captions (tokens separated by whitespace, as
            pycocoevalcap's tokenizer returns them).  Every image needs at least one reference.
        n: largest n-gram order.
        sigma: standard deviation of the Gaussian length penalty.
    """

    def __init__(self, references: Mapping[Any, Sequence[str]], n: int = 4, sigma: float = 6.0) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not isinstance(references, Mapping) or not references:
            raise ValueError("CiderD needs a non-empty mapping image id -> reference captions")
        self.n, self.sigma = n, sigma
        self.image_ids: list[Hashable] = list(references)
        self._index = {key: i for i, key in enumerate(self.image_ids)}
        sentences: list[str] = []
        for key in self.image_ids:
            refs = references[key]
            if isinstance(refs, str) or not isinstance(refs, Sequence) or len(refs) == 0:
                raise ValueError(f"image {key!r} needs a non-empty list of reference captions, got {refs!r:.80}")
            if not all(isinstance(r, str) for r in refs):
                raise ValueError(f"the reference captions of image {key!r} must be strings")
            sentences.extend(refs)
        self._nrefs = np.array([len(references[key]) for key in self.image_ids], dtype=np.int64)
        self._first_ref = np.cumsum(self._nrefs) - self._nrefs
        self._vocab: dict[str, int] = {}
        tok, lens = token_ids(sentences, self._vocab, grow=True)
        grams = NgramCounts(tok, lens, n, base=len(self._vocab))
        self._codes = grams.codes  # codes[0] == arange(V): every vocabulary word occurs in a reference
        self._offset = np.cumsum([0] + [len(c) for c in self._codes])  # global n-gram id = offset[k-1] + id
        self._num_grams = max(int(self._offset[-1]), 1)  # (1 only keeps the arithmetic below defined)
        gid = self._offset[grams.order] + grams.gram
        image = np.repeat(np.arange(len(self.image_ids)), self._nrefs)[grams.sent]  # image of each row
        pairs = _distinct(image * self._num_grams + gid)  # distinct (image, n-gram)
        self._df = np.bincount(pairs % self._num_grams, minlength=self._num_grams)
        self._ref_len = np.log(float(len(self.image_ids)))  # CiderScorer.compute_cider's "ref_len"
        self._tfidf_cache: dict[int, tuple[float, float]] = {}
        self._penalty_cache: dict[int, float] = {}
        w, w2 = self._tfidf(grams.tf, self._df[gid])
        self._ref_norm = np.sqrt(np.bincount(grams.sent * n + grams.order, weights=w2,
                                             minlength=len(sentences) * n)).reshape(-1, n)  # (R, n)
        self._ref_length = np.maximum(lens - 1, 0) if n >= 2 else np.zeros_like(lens)  # number of bigrams
        table = image * self._num_grams + gid  # lookup table of reference n-grams, by (image, n-gram, reference)
        order = np.argsort(table, kind="stable")  # rows are already sorted by reference
        self._table_key, self._table_ref, self._table_w = table[order], grams.sent[order], w[order]

    @property
    def document_frequency(self) -> dict[tuple[str, ...], int]:
        """n-gram (tuple of words) -> number of images whose references contain it (for inspection)."""
        words = sorted(self._vocab, key=self._vocab.__getitem__)  # position = token id = unigram rank
        grams: list[tuple[str, ...]] = [(w,) for w in words]
        prev = grams
        for codes in self._codes[1:]:  # code = rank of the (k-1)-gram prefix * vocabulary size + last token
            prev = [prev[c // len(words)] + (words[c % len(words)],) for c in codes.tolist()]
            grams.extend(prev)
        return dict(zip(grams, self._df.tolist()))

    def _tfidf(self, tf: np.ndarray, df: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """tf-idf weights and their squares, each computed with the library's scalar expressions."""
        key = tf * (len(self.image_ids) + 1) + df
        table = np.zeros((int(key.max(initial=0)) + 1, 2))
        cache = self._tfidf_cache
        for k in np.flatnonzero(np.bincount(key)).tolist():  # the few distinct (tf, df) pairs
            if k not in cache:
                t, d = divmod(k, len(self.image_ids) + 1)
                v = float(t) * (self._ref_len - np.log(max(1.0, float(d))))
                cache[k] = (float(v), float(pow(v, 2)))
            table[k] = cache[k]
        return table[key, 0], table[key, 1]

    def _penalty(self, delta: np.ndarray) -> np.ndarray:
        """Gaussian length penalty, ``np.e ** (-(delta ** 2) / (2 * sigma ** 2))`` as the library writes it."""
        uniq, inv = np.unique(delta, return_inverse=True)
        for d in uniq.tolist():
            if d not in self._penalty_cache:
                self._penalty_cache[d] = np.e ** (-(float(d) ** 2) / (2 * self.sigma ** 2))
        return np.array([self._penalty_cache[d] for d in uniq.tolist()], dtype=np.float64)[inv]

    def _image_index(self, image_ids: Sequence[Any]) -> np.ndarray:
        try:
            return np.array([self._index[key] for key in image_ids], dtype=np.int64)
        except KeyError as err:
            raise ValueError(f"image id {err.args[0]!r} has no references in this CiderD object") from None

    def _ref_gram_ids(self, tok: np.ndarray, grams: NgramCounts) -> np.ndarray:
        """Global reference n-gram id of every row of `grams` (candidate n-grams), -1 if no reference has it."""
        vocab_size = len(self._vocab)
        ref_rank = [np.where(tok < vocab_size, tok, -1)]
        for k in range(2, self.n + 1):
            pos = np.flatnonzero(grams.rank[k - 1] >= 0)
            prev, last = ref_rank[-1][pos], tok[pos + k - 1]
            ok = (prev >= 0) & (last < vocab_size)
            code = prev[ok] * vocab_size + last[ok]
            codes = self._codes[k - 1]
            idx = np.minimum(np.searchsorted(codes, code), max(len(codes) - 1, 0))
            hit = codes[idx] == code if len(codes) else np.zeros(len(code), dtype=bool)
            rank = np.full(len(tok), -1, dtype=np.int64)
            rank[pos[ok][hit]] = idx[hit]
            ref_rank.append(rank)
        rank = np.stack(ref_rank)[grams.order, grams.pos] if len(grams.pos) else np.zeros(0, dtype=np.int64)
        return np.where(rank >= 0, self._offset[grams.order] + rank, -1)

    def _matches(self, image: np.ndarray, grams: NgramCounts, gid: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(candidate n-gram row, reference, reference tf-idf weight) for every reference of the row's
        image that contains the row's n-gram; rows in order, references ascending within a row."""
        rows = np.flatnonzero(gid >= 0)
        key = image[grams.sent[rows]] * self._num_grams + gid[rows]
        lo = np.searchsorted(self._table_key, key, side="left")
        count = np.searchsorted(self._table_key, key, side="right") - lo
        entry = np.repeat(lo - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))
        return np.repeat(rows, count), self._table_ref[entry], self._table_w[entry]

    def score_many(self, image_ids: Sequence[Any], captions: Sequence[str]) -> np.ndarray:
        """CIDEr-D of each tokenized caption against the references of the image id beside it."""
        if len(image_ids) != len(captions):
            raise ValueError(f"got {len(image_ids)} image ids but {len(captions)} captions")
        for caption in captions:
            if not isinstance(caption, str):
                raise ValueError(f"captions must be tokenized strings, got {type(caption).__name__}")
        n = self.n
        if len(captions) == 0:
            return np.zeros(0, dtype=np.float64)
        image = self._image_index(image_ids)  # (C,)
        tok, lens = token_ids(captions, self._vocab, grow=False)
        grams = NgramCounts(tok, lens, n, base=int(max(len(self._vocab), tok.max() + 1 if len(tok) else 0)))
        gid = self._ref_gram_ids(tok, grams)
        vh, vh2 = self._tfidf(grams.tf, np.where(gid >= 0, self._df[np.maximum(gid, 0)], 0))
        num = len(captions)
        norm = np.sqrt(np.bincount(grams.sent * n + grams.order, weights=vh2, minlength=num * n)).reshape(num, n)
        length = np.maximum(lens - 1, 0) if n >= 2 else np.zeros_like(lens)

        # One slot per (candidate, its image's reference): pair p = pair_start[c] + j.
        nrefs = self._nrefs[image]
        pair_start = np.cumsum(nrefs) - nrefs
        cand_of_pair = np.repeat(np.arange(num), nrefs)  # (P,)
        ref_of_pair = self._first_ref[image][cand_of_pair] + np.arange(len(cand_of_pair)) - pair_start[cand_of_pair]

        # Matches: candidate n-gram rows x references of the same image that contain the n-gram, in the
        # candidate's n-gram order, so that np.bincount sums each (pair, order) as the library's loop does.
        row, ref, w = self._matches(image, grams, gid)
        cand = grams.sent[row]
        slot = (pair_start[cand] + ref - self._first_ref[image[cand]]) * n + grams.order[row]
        val = np.bincount(slot, weights=np.minimum(vh[row], w) * w, minlength=len(cand_of_pair) * n)
        val = val.reshape(-1, n).astype(np.float64)  # (P, n); bincount gives integers when nothing matches

        norm_h, norm_r = norm[cand_of_pair], self._ref_norm[ref_of_pair]
        np.divide(val, norm_h * norm_r, out=val, where=(norm_h != 0) & (norm_r != 0))
        val *= self._penalty(length[cand_of_pair] - self._ref_length[ref_of_pair])[:, None]
        per_order = np.bincount((cand_of_pair[:, None] * n + np.arange(n)).ravel(), weights=val.ravel(),
                                minlength=num * n).reshape(num, n)  # summed over references in order
        return np.mean(per_order, axis=1) / nrefs * 10.0

    def score(self, candidates: Mapping[Any, str]) -> tuple[float, np.ndarray]:
        """(corpus CIDEr-D, per-image scores in `candidates`' order), as ``Cider().compute_score`` returns."""
        if not candidates:
            raise ValueError("no candidate captions to score")
        scores = self.score_many(list(candidates), list(candidates.values()))
        return float(np.mean(scores)), scores
