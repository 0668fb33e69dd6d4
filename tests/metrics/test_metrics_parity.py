"""`score_captions` equals pycocoevalcap run as COCOEvalCap runs it, on hundreds of realistic captions.

The captions are generated deterministically (:func:`synthetic_text.realistic_corpus`,
also used by ``experiments/bench_scoring.py``): scenes described five ways with mixed casing, punctuation,
apostrophes, hyphens, numbers, a few non-ASCII words and varied lengths, and candidates that overlap
their references partially (some empty, some unrelated).
"""

from __future__ import annotations

import pytest
from fixtures import HAS_JAVA, needs_java
from synthetic_text import realistic_corpus

from captioning.metrics import VALID_METRICS, score_captions

BLEU = VALID_METRICS["bleu"]
NUM_IMAGES = 400

# ------------------------------------------------------------------------------------------------
# The reference: pycocoevalcap exactly as COCOEvalCap.evaluate runs it
# ------------------------------------------------------------------------------------------------
def coco_eval_scores(candidates: dict, references: dict, meteor: bool) -> tuple[dict, dict]:
    """(overall, per image) from pycocoevalcap's PTBTokenizer + Bleu(4), Meteor(), Rouge(), Cider()."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({k: [{"caption": c} for c in references[k]] for k in candidates})
    res = tokenizer.tokenize({k: [{"caption": candidates[k]}] for k in candidates})
    scorers: list = [(Bleu(4), list(BLEU)), (Rouge(), "ROUGE_L"), (Cider(), "CIDEr")]
    if meteor:
        scorers.insert(1, (Meteor(), "METEOR"))
    overall: dict = {}
    per_image: dict = {k: {} for k in gts}
    try:
        for scorer, method in scorers:
            score, scores = scorer.compute_score(gts, res)
            for name, sc, scs in (zip(method, score, scores) if isinstance(method, list) else [(method, score, scores)]):
                overall[name] = sc
                for k, s in zip(gts.keys(), scs):
                    per_image[k][name] = s
    finally:
        for scorer, _ in scorers:
            if isinstance(scorer, Meteor):
                scorer.__del__()  # pycocoevalcap 1.2 shuts the METEOR process down here
    return overall, per_image


def _assert_close(ours, overall: dict, per_image: dict, names: list[str], tol: float) -> None:
    for name in names:
        assert abs(ours.overall[name] - overall[name]) <= tol, (name, ours.overall[name], overall[name])
        worst = max(abs(ours.per_image[k][name] - per_image[k][name]) for k in per_image)
        assert worst <= tol, (name, worst)
    assert list(ours.per_image) == list(per_image)


@pytest.fixture(scope="module")
def corpus() -> tuple[dict[int, str], dict[int, list[str]]]:
    candidates, references = realistic_corpus(NUM_IMAGES, seed=0)
    references[999_999] = ["An image without a candidate is ignored."]  # as coco-caption ignores it
    return candidates, references


@pytest.fixture(scope="module")
def reference(corpus) -> tuple[dict, dict]:
    if not HAS_JAVA:
        pytest.skip("needs Java")
    return coco_eval_scores(*corpus, meteor=False)


def test_corpus_is_realistic(corpus) -> None:
    """The generated text has what the parity claim is about: casing, punctuation, non-ASCII, overlap."""
    candidates, references = corpus
    text = " ".join(c for refs in references.values() for c in refs)
    for needle in ("'s", "n't", "-", ",", "!", "...", "&", "(", '"', "é", "ñ", "2014", "10-year-old", "P.M."):
        assert needle in text, needle
    assert sum(c == c.lower() for c in candidates.values()) > NUM_IMAGES // 4
    lengths = [len(c.split()) for refs in references.values() for c in refs]
    assert min(lengths) <= 6 and max(lengths) >= 18
    assert 3 <= sum(c in ("", "...") for c in candidates.values()) <= 20
    assert realistic_corpus(20, seed=0) == realistic_corpus(20, seed=0)  # deterministic


@pytest.mark.integration
@needs_java
def test_java_path_equals_pycocoevalcap(corpus, reference) -> None:
    ours = score_captions(*corpus, metrics=("bleu", "rouge", "cider"), tokenizer="ptb-java")
    assert ours.tokenizer == "ptb-java"
    _assert_close(ours, *reference, [*BLEU, "ROUGE_L", "CIDEr"], tol=1e-9)
    assert 0.3 < reference[0]["Bleu_4"] < 0.6 and 1.0 < reference[0]["CIDEr"] < 2.5  # a plausible regime


@pytest.mark.integration
@needs_java
def test_java_free_path_equals_pycocoevalcap(corpus, reference, monkeypatch: pytest.MonkeyPatch) -> None:
    from captioning.metrics import coco

    monkeypatch.setattr(coco.shutil, "which", lambda name: None)  # as on a machine without Java
    ours = score_captions(*corpus, metrics=("bleu", "meteor", "rouge", "cider"))
    assert ours.tokenizer == "python"
    assert set(ours.skipped) == {"METEOR"} and "Java" in ours.skipped["METEOR"]
    _assert_close(ours, *reference, [*BLEU, "ROUGE_L", "CIDEr"], tol=1e-9)


@pytest.mark.slow
@pytest.mark.integration
@needs_java
def test_all_metrics_with_meteor_equal_pycocoevalcap(corpus) -> None:
    """METEOR included (two METEOR 1.5 runs over 400 images: 1-3 minutes on one busy core)."""
    overall, per_image = coco_eval_scores(*corpus, meteor=True)
    ours = score_captions(*corpus, metrics=("bleu", "meteor", "rouge", "cider"), tokenizer="ptb-java")
    assert ours.skipped == {}
    _assert_close(ours, overall, per_image, [*BLEU, "ROUGE_L", "CIDEr"], tol=1e-9)
    _assert_close(ours, overall, per_image, ["METEOR"], tol=1e-6)
