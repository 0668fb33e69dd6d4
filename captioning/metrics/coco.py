"""Caption scores computed exactly as the coco-caption toolkit (pycocoevalcap) computes them.

:func:`score_captions` computes coco-caption's metrics - BLEU-1..4 (corpus BLEU with the "closest"
reference length), METEOR 1.5, ROUGE-L and CIDEr-D - on captions tokenized by the Stanford PTB
tokenizer jar that pycocoevalcap ships, with the same options and post-processing as its
``PTBTokenizer``, and references and candidates tokenized in two separate runs as
``COCOEvalCap.evaluate`` does.  METEOR (and SPICE) run pycocoevalcap's own scorers; BLEU, ROUGE-L and
CIDEr-D run the array re-implementations in :mod:`captioning.metrics.fast_scores` and
:mod:`captioning.metrics.cider`, which give the same numbers as pycocoevalcap's ``Bleu(4)``,
``Rouge()`` and ``Cider()`` to the last bit (``tests/metrics/test_metrics_parity.py``) several times faster
(``experiments/bench_scoring.py``).  The numbers are therefore the ones papers report.

Behaviour worth knowing:

* Only the candidates' image ids are scored; references of other images are ignored (coco-caption
  evaluates ``imgIds = cocoRes.getImgIds()``).
* ``tokenizer="auto"`` uses the Java PTB tokenizer when ``java`` is on the PATH, otherwise the
  pure-Python re-implementation in :mod:`captioning.metrics.tokenizer` (which gives the same tokens on
  caption text; see its docstring for the exotic differences).  ``"ptb-java"`` / ``"python"`` force one;
  ``"ptb"`` (the name ``dataset.tokenizer`` gives it) is ``"auto"``.
* ``tokenizer="whitespace"`` / ``"char"``: captions in other languages, split by the data set's own rule
  (:mod:`captioning.metrics.languages`, the rule that made the vocabulary) instead of PTB; METEOR and SPICE, which
  are English-only, are then skipped with that reason.
* METEOR runs in Java; without Java it is skipped and the reason is recorded in
  :attr:`CaptionScores.skipped` (never silently dropped).  The METEOR subprocess is always shut down
  after use, also when scoring fails.
* SPICE (``"spice"``) needs Java 8+ and the Stanford CoreNLP 3.6.0 jars that pycocoevalcap downloads
  on first use.  They are never downloaded from here (that would hang or fail offline): when they are
  missing, or SPICE fails, it is skipped with a reason telling how to enable it.
* Empty candidate captions (or captions made only of punctuation, which tokenize to nothing) are
  scored as coco-caption scores them: pycocoevalcap's scorers accept empty hypotheses and give such an
  image 0 for every metric (its n-gram counts are zero), while its references still count in BLEU's
  corpus-level brevity penalty and in CIDEr's document frequencies.  No special rule is applied.
* References that are all empty after tokenizing, for some images or all of them, give a logged warning;
  the scores are still computed exactly as coco-caption computes them (for all-empty references that
  is a BLEU near 0, such as 1e-16, and 0 elsewhere), never silently re-defined.
* Line breaks inside a caption are replaced by spaces before tokenizing (pycocoevalcap does this for
  ``"\\n"`` only; other line-break characters would make its tokenizer output misaligned).
"""

from __future__ import annotations

import logging
import math
import shutil
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from captioning.metrics.cider import CiderD
from captioning.metrics.fast_scores import bleu, rouge_l
from captioning.metrics.java import java_ptb_tokenize, java_score
from captioning.metrics.languages import ENGLISH_ONLY, LANGUAGE_TOKENIZERS, english_only, split_captions
from captioning.metrics.names import VALID_METRICS
from captioning.metrics.tokenizer import ptb_tokenize

logger = logging.getLogger(__name__)

__all__ = ["CaptionScores", "score_captions", "VALID_METRICS", "TOKENIZERS"]

TOKENIZERS = ("auto", "ptb", "ptb-java", "python", *LANGUAGE_TOKENIZERS)

@dataclass
class CaptionScores:
    """Corpus-level and per-image caption scores, with coco-caption's metric names."""

    overall: dict[str, float]  # keys among Bleu_1..Bleu_4, METEOR, ROUGE_L, CIDEr, SPICE
    per_image: dict[Any, dict[str, float]]  # keyed by the caller's image ids
    tokenizer: str  # "ptb-java" or "python" (the PTB tokenizer), or a language tokenizer: "whitespace", "char"
    skipped: dict[str, str] = field(default_factory=dict)  # metric name -> why it was not computed


# ------------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------------
def _normalise_metrics(metrics: Sequence[str]) -> list[str]:
    if isinstance(metrics, str):
        metrics = [metrics]
    out: list[str] = []
    for m in metrics:
        if not isinstance(m, str) or m.lower() not in VALID_METRICS:
            raise ValueError(f"unknown metric {m!r}; valid metrics are {', '.join(VALID_METRICS)}")
        if m.lower() not in out:
            out.append(m.lower())
    if not out:
        raise ValueError(f"no metrics requested; valid metrics are {', '.join(VALID_METRICS)}")
    return out


_Captions = dict[Hashable, list[str]]


def _validate(candidates: Mapping[Any, str],
              references: Mapping[Any, Sequence[str]]) -> tuple[_Captions, _Captions]:
    """(gts, res) in coco-caption's layout, over the candidates' ids, after checking the inputs."""
    if not isinstance(candidates, Mapping) or not isinstance(references, Mapping):
        raise ValueError("candidates and references must be mappings from image id to caption(s)")
    if not candidates:
        raise ValueError("no candidate captions to score")
    missing = [k for k in candidates if k not in references]
    if missing:
        shown = ", ".join(repr(k) for k in missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise ValueError(f"{len(missing)} candidate image id(s) have no references: {shown}")
    gts: dict[Hashable, list[str]] = {}
    res: dict[Hashable, list[str]] = {}
    for key, cand in candidates.items():
        if not isinstance(cand, str):
            raise ValueError(f"candidate caption for image {key!r} must be a str, got {type(cand).__name__}")
        refs = references[key]
        if isinstance(refs, str) or not isinstance(refs, Sequence):
            raise ValueError(f"references for image {key!r} must be a list of strings, got {type(refs).__name__}")
        if len(refs) == 0:
            raise ValueError(f"image {key!r} has an empty reference list")
        for ref in refs:
            if not isinstance(ref, str):
                raise ValueError(f"reference caption for image {key!r} must be a str, got {type(ref).__name__}")
        gts[key] = list(refs)
        res[key] = [cand]
    ignored = len(references) - len(gts)
    if ignored > 0:
        logger.debug("ignoring the references of %d image(s) without a candidate", ignored)
    return gts, res


# ------------------------------------------------------------------------------------------------
# Tokenizer and scoring
# ------------------------------------------------------------------------------------------------
def _resolve_tokenizer(tokenizer: str, java: str | None) -> str:
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; valid tokenizers are {', '.join(TOKENIZERS)}")
    if tokenizer in ("auto", "ptb"):
        chosen = "ptb-java" if java else "python"
        if not java:
            logger.info("java not found on the PATH: tokenizing with the pure-Python PTB tokenizer")
        return chosen
    if tokenizer == "ptb-java" and not java:
        raise RuntimeError("tokenizer='ptb-java' needs Java, but no `java` executable is on the PATH; install a "
                           "Java runtime (8 or newer) or use tokenizer='python' / 'auto'")
    return tokenizer


def _warn_empty_references(gts: Mapping[Any, Sequence[str]]) -> None:
    """A warning for images whose references all tokenize to nothing: they are scored anyway, as coco-caption does."""
    empty = [key for key, caps in gts.items() if not any(c.strip() for c in caps)]
    if len(empty) == len(gts):
        logger.warning("every reference caption is empty after tokenizing: the scores are computed as coco-caption "
                       "computes them (BLEU near 0, such as 1e-16, CIDEr and ROUGE-L 0) but mean nothing; check "
                       "the reference file")
    elif empty:
        logger.warning("%d of %d images have only empty reference captions after tokenizing (e.g. image %r); they "
                       "are scored as coco-caption scores them (about 0 on every metric) and still count in the "
                       "averages and in corpus BLEU's length statistics", len(empty), len(gts), empty[0])


def score_captions(candidates: Mapping[Any, str], references: Mapping[Any, Sequence[str]],
                   metrics: Sequence[str] = ("bleu", "meteor", "rouge", "cider"),
                   tokenizer: str = "auto") -> CaptionScores:
    """Score candidate captions against references exactly as the coco-caption toolkit does.

    Args:
        candidates: image id -> the generated caption (raw text; may be empty).
        references: image id -> its reference captions (raw text); ids without a candidate are ignored.
        metrics: any of ``"bleu"``, ``"meteor"``, ``"rouge"``, ``"cider"``, ``"spice"``.
        tokenizer: ``"auto"`` or ``"ptb"`` (Java PTB tokenizer when Java is available, else the Python one),
            ``"ptb-java"`` or ``"python"``; or ``"whitespace"`` / ``"char"`` (the data set's rule, for other
            languages: METEOR and SPICE are then skipped).

    Returns:
        :class:`CaptionScores` with corpus-level scores, per-image scores (keyed like `candidates`, in
        its order), the tokenizer used and the metrics skipped with the reason.

    Raises:
        ValueError: unknown metric or tokenizer name; a candidate without references; an empty
            reference list; a caption that is not a string; no candidates.
        RuntimeError: ``tokenizer="ptb-java"`` without Java, or the Java tokenizer failing.
    """
    wanted = _normalise_metrics(metrics)
    java = shutil.which("java")
    tok_name = _resolve_tokenizer(tokenizer, java)
    gts_raw, res_raw = _validate(candidates, references)

    # Two separate tokenizer runs, references first, as COCOEvalCap.evaluate does.
    if tok_name in LANGUAGE_TOKENIZERS:
        gts, res = split_captions(gts_raw, tok_name), split_captions(res_raw, tok_name)
    elif tok_name == "ptb-java":
        assert java is not None
        gts = java_ptb_tokenize(gts_raw, java)
        res = java_ptb_tokenize(res_raw, java)
    else:
        gts = ptb_tokenize(gts_raw)
        res = ptb_tokenize(res_raw)

    _warn_empty_references(gts)
    ids = list(res)
    overall: dict[str, float] = {}
    per_image: dict[Any, dict[str, float]] = {k: {} for k in ids}
    skipped: dict[str, str] = {}

    def record(name: str, score: float, scores: Sequence[float]) -> None:
        overall[name] = float(score)
        for key, value in zip(ids, scores):
            per_image[key][name] = float(value)

    score: float
    scores: Any  # per image: a list, or an array from the fast scorers
    for metric in wanted:
        if metric == "bleu":
            bleu_n, bleu_n_per_image = bleu(gts, res, n=4)  # BLEU-1..4
            for n, name in enumerate(VALID_METRICS["bleu"]):
                record(name, bleu_n[n], bleu_n_per_image[n])
        elif metric == "rouge":
            score, scores = rouge_l(gts, res)
            record("ROUGE_L", score, scores)
        elif metric == "cider":
            score, scores = CiderD(gts).score({key: caps[0] for key, caps in res.items()})
            record("CIDEr", score, scores)
        elif metric in ENGLISH_ONLY and tok_name in LANGUAGE_TOKENIZERS:
            skipped[VALID_METRICS[metric][0]] = english_only(VALID_METRICS[metric][0], tok_name)
        else:  # meteor, spice: pycocoevalcap's Java scorers
            name, result = java_score(metric, gts, res, java)
            if isinstance(result, str):
                skipped[name] = result
                continue
            record(name, *result)

    for name, reason in skipped.items():
        logger.warning("%s not computed: %s", name, reason)
    logger.info("scored %d images with the %s tokenizer: %s", len(ids), tok_name,
                ", ".join(f"{k}={v:.4f}" for k, v in overall.items() if not math.isnan(v)))
    return CaptionScores(overall=overall, per_image=per_image, tokenizer=tok_name, skipped=skipped)
