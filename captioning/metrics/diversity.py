"""How varied a model's captions are: a model that says "there is a ..." for every image can still score well on
n-gram metrics, so the scores are reported beside these counts, and a model that gives one caption for most images
(`collapsed_caption`) is said so in one line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

# one caption for more than this share of the images is said in one line: conf/eval/default.yaml's
# eval.collapse_share, the same value (tests/config/test_one_default_per_fact.py), for captioning-score's default
COLLAPSE_SHARE = 0.5


def caption_diversity(captions: Sequence[Sequence[str]], opening_words: int = 2) -> dict[str, float]:
    """Over generated captions (word lists): the share of distinct captions, the share of the most common caption,
    the number of distinct openings (first `opening_words` words), the share of the most common opening, and the
    number of distinct words used."""
    if not captions:
        return {"distinct_captions": 0.0, "top_caption_share": 0.0, "distinct_openings": 0,
                "top_opening_share": 0.0, "vocabulary_used": 0}
    whole = Counter(" ".join(c) for c in captions)
    openings = Counter(" ".join(c[:opening_words]) for c in captions)
    return {"distinct_captions": len(whole) / len(captions),
            "top_caption_share": whole.most_common(1)[0][1] / len(captions),
            "distinct_openings": len(openings),
            "top_opening_share": openings.most_common(1)[0][1] / len(captions),
            "vocabulary_used": len({w for c in captions for w in c})}


def collapsed_caption(captions: Sequence[Sequence[str]], share: float) -> str | None:
    """The caption given for more than `share` of the images (a model collapsed onto one caption), else None.

    Among captions given equally often, the first in the given order."""
    if not captions:
        return None
    caption, count = Counter(" ".join(c) for c in captions).most_common(1)[0]
    return caption if count > share * len(captions) else None


def diversity_and_collapse(captions: Sequence[Sequence[str]], threshold: float) -> tuple[dict[str, Any], str | None]:
    """caption_diversity, with `collapsed_caption` when one caption is given for more than `threshold` of the images,
    and the one line that says so (None when none is)."""
    out: dict[str, Any] = dict(caption_diversity(captions))
    collapsed = collapsed_caption(captions, threshold)
    if collapsed is None:
        return out, None
    out["collapsed_caption"] = collapsed
    return out, collapse_note(collapsed, out["top_caption_share"], len(captions), threshold)


def collapse_note(caption: str, share: float, total: int, threshold: float | None = None) -> str:
    """The one line the log (with the threshold) and the report page say about a collapsed model."""
    over = "" if threshold is None else f" (over eval.collapse_share={threshold:g})"
    return (f'one caption for {share:.0%} of the {total} images{over}: "{caption}": the model may have collapsed '
            "onto one caption")
