"""Fast CIDEr-D, BLEU and ROUGE-L give pycocoevalcap's numbers bit for bit on the same tokens.

Random token sequences over a small vocabulary make n-gram repeats, shared n-grams across images and
ties frequent; the edge cases the library handles in its own way are spelled out one by one.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.cider.cider_scorer import CiderScorer
from pycocoevalcap.rouge.rouge import Rouge

from captioning.metrics.cider import CiderD
from captioning.metrics.fast_scores import bleu, rouge_l


def _random_corpus(seed: int, num_images: int, vocab: int = 12, max_len: int = 14, max_refs: int = 6,
                   allow_empty: bool = True) -> tuple[dict, dict]:
    """(gts, res) in coco-caption's layout: id -> tokenized references / a one-element candidate list."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]

    def sentence() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(0 if allow_empty else 1, max_len)))

    gts = {f"img{i}": [sentence() for _ in range(rng.randint(1, max_refs))] for i in range(num_images)}
    res = {key: [sentence()] for key in gts}
    return gts, res


def _cider_both(gts: dict, res: dict, **kwargs) -> tuple[tuple, tuple]:
    ref = Cider(**kwargs).compute_score(gts, res)
    ours = CiderD(gts, **kwargs).score({k: v[0] for k, v in res.items()})
    return ref, ours


@pytest.mark.parametrize("seed", range(12))
def test_cider_identical_on_random_tokens(seed: int) -> None:
    gts, res = _random_corpus(seed, num_images=1 + 7 * seed)
    (score, scores), (our_score, our_scores) = _cider_both(gts, res)
    assert our_score == score  # bit for bit, not approximately
    np.testing.assert_array_equal(our_scores, scores)


@pytest.mark.parametrize("case, gts, res", [
    ("empty candidates", {1: ["a b c", "a b"], 2: ["b c d"], 3: ["c"]}, {1: [""], 2: ["b c d"], 3: [""]}),
    ("repeated n-grams", {1: ["a a a a b", "a a b b"], 2: ["b b b b", "a b a b"]}, {1: ["a a a a a a"], 2: ["b b a b b"]}),
    ("single reference per image", {1: ["a b c d e"], 2: ["c d e f"], 3: ["e f g"]}, {1: ["a b c"], 2: ["c d e f"], 3: ["x y"]}),
    ("single image", {1: ["a b c", "a c d"]}, {1: ["a b c"]}),
    ("empty reference", {1: ["", "a b"], 2: ["b c", "c d e"]}, {1: ["a b"], 2: ["c d"]}),
    ("unknown words only", {1: ["a b"], 2: ["b c"]}, {1: ["x y z z"], 2: ["q"]}),
    ("one-word captions", {1: ["a", "b"], 2: ["c"]}, {1: ["a"], 2: ["a"]}),
])
def test_cider_edge_cases(case: str, gts: dict, res: dict) -> None:
    (score, scores), (our_score, our_scores) = _cider_both(gts, res)
    assert our_score == score, case
    np.testing.assert_array_equal(our_scores, scores)


@pytest.mark.parametrize("sigma", [1.0, 3.0, 10.0])
def test_cider_other_sigma(sigma: float) -> None:
    # (pycocoevalcap counts n-grams up to 4 whatever its `n`, so only n = 4 can be compared with it.)
    gts, res = _random_corpus(99, num_images=25)
    (score, scores), (our_score, our_scores) = _cider_both(gts, res, sigma=sigma)
    assert our_score == score
    np.testing.assert_array_equal(our_scores, scores)


def test_cider_known_value() -> None:
    """A hand-checkable case: two images, identical candidate and single reference."""
    gts = {1: ["a b"], 2: ["c d"]}
    score, scores = CiderD(gts).score({1: "a b", 2: "c d"})
    # Each n-gram occurs in one of two images: idf = log 2, tf = 1, so every order's cosine is 1 and the
    # length penalty is 1: CIDEr-D = 10 * mean over orders with n-grams (2 of 4 orders) = 10 * 2 / 4 = 5.
    assert scores.tolist() == [5.0, 5.0] and score == 5.0
    # With unigrams only (n=1) every order that counts has cosine 1: CIDEr = 10.
    assert CiderD(gts, n=1).score({1: "a b", 2: "c d"})[1] == pytest.approx([10.0, 10.0], abs=1e-12)
    assert CiderD(gts).score_many([], []).shape == (0,)


def test_cider_document_frequency_matches_library() -> None:
    gts, res = _random_corpus(3, num_images=15)
    scorer = CiderScorer(n=4, sigma=6.0)
    for key in gts:
        scorer += (res[key][0], gts[key])
    scorer.compute_doc_freq()
    expected = {gram: int(df) for gram, df in scorer.document_frequency.items()}
    assert CiderD(gts).document_frequency == expected


def test_cider_object_is_reusable() -> None:
    """Built once, it scores other candidate sets, subsets and several candidates per image consistently."""
    gts, res = _random_corpus(5, num_images=30, allow_empty=False)
    cider = CiderD(gts)
    first = cider.score({k: v[0] for k, v in res.items()})
    _, other = _random_corpus(6, num_images=30)
    other_scores = cider.score({k: v[0] for k, v in other.items()})[1]
    np.testing.assert_array_equal(other_scores, Cider().compute_score(gts, other)[1])
    again = cider.score({k: v[0] for k, v in res.items()})  # the cached tables do not change anything
    assert again[0] == first[0]
    keys = list(gts)
    many = cider.score_many(keys[:5] + keys[:5], [res[k][0] for k in keys[:5]] + [other[k][0] for k in keys[:5]])
    np.testing.assert_array_equal(many[:5], first[1][:5])  # corpus statistics stay those of all 30 images
    np.testing.assert_array_equal(many[5:], other_scores[:5])


def test_cider_bad_input() -> None:
    with pytest.raises(ValueError, match="image 2 needs a non-empty list"):
        CiderD({1: ["a b"], 2: []})
    with pytest.raises(ValueError, match="image 1 needs a non-empty list"):
        CiderD({1: "a b"})
    with pytest.raises(ValueError, match="non-empty mapping"):
        CiderD({})
    cider = CiderD({1: ["a b"]})
    with pytest.raises(ValueError, match="image id 7 has no references"):
        cider.score({7: "a b"})
    with pytest.raises(ValueError, match="2 image ids but 1 captions"):
        cider.score_many([1, 1], ["a"])
    with pytest.raises(ValueError, match="tokenized strings"):
        cider.score_many([1], [["a", "b"]])  # type: ignore[list-item]


# ------------------------------------------------------------------------------------------------
# BLEU and ROUGE-L
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(10))
def test_bleu_identical_on_random_tokens(seed: int) -> None:
    gts, res = _random_corpus(100 + seed, num_images=1 + 6 * seed, vocab=6 + seed)
    score, scores = Bleu(4).compute_score(gts, res, verbose=0)
    our_score, our_scores = bleu(gts, res)
    assert our_score == score and our_scores == scores


@pytest.mark.parametrize("seed", range(10))
def test_rouge_identical_on_random_tokens(seed: int) -> None:
    gts, res = _random_corpus(200 + seed, num_images=1 + 6 * seed, vocab=5 + seed)
    score, scores = Rouge().compute_score(gts, res)
    our_score, our_scores = rouge_l(gts, res)
    assert our_score == score
    np.testing.assert_array_equal(our_scores, scores)


@pytest.mark.parametrize("case, gts, res", [
    ("empty candidate", {1: ["a b c"], 2: ["b c"]}, {1: [""], 2: ["b c"]}),
    ("empty reference", {1: ["", "a b"], 2: ["b"]}, {1: [""], 2: ["b b"]}),
    ("closest length tie goes to the shorter reference", {1: ["a b", "a b c d"]}, {1: ["a b c"]}),
    ("repeated words clipped", {1: ["the cat the mat", "a cat"]}, {1: ["the the the the cat"]}),
    ("long references use the fallback", {1: [" ".join(["a", "b", "c"] * 30), "a b"]}, {1: ["c b a c b a"]}),
    ("double spaces count for ROUGE-L's split(' ')", {1: ["a  b c", "a b"]}, {1: ["a  b"]}),
])
def test_bleu_and_rouge_edge_cases(case: str, gts: dict, res: dict) -> None:
    assert bleu(gts, res) == tuple(Bleu(4).compute_score(gts, res, verbose=0)), case
    score, scores = Rouge().compute_score(gts, res)
    our_score, our_scores = rouge_l(gts, res)
    assert our_score == score, case
    np.testing.assert_array_equal(our_scores, scores)


def test_rouge_known_value() -> None:
    # LCS("a b c d", "a x c") = 2: P = 2/3, R = 2/4; F = (1 + 1.2^2) P R / (R + 1.2^2 P).
    p, r = 2 / 3, 2 / 4
    assert rouge_l({1: ["a b c d"]}, {1: ["a x c"]})[0] == pytest.approx((1 + 1.44) * p * r / (r + 1.44 * p))


def test_fast_scores_refuse_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="same image ids"):
        bleu({1: ["a"]}, {2: ["a"]})
    with pytest.raises(ValueError, match="exactly one candidate"):
        rouge_l({1: ["a"]}, {1: ["a", "b"]})


def test_cider_all_references_empty() -> None:
    """pycocoevalcap fails on this corpus (max() of no document frequencies); CiderD scores it 0."""
    cider = CiderD({1: [""], 2: ["", ""]})
    assert cider.score({1: "a b", 2: ""})[1].tolist() == [0.0, 0.0]
