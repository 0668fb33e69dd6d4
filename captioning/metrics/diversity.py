"""How varied a model's captions are: a model that says "there is a ..." for every image can still score well on
n-gram metrics, so the scores are reported beside these counts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def caption_diversity(captions: Sequence[Sequence[str]], opening_words: int = 2) -> dict[str, float]:
    """Over generated captions (word lists): the share of distinct captions, the number of distinct openings (first
    `opening_words` words), the share of the most common opening, and the number of distinct words used."""
    if not captions:
        return {"distinct_captions": 0.0, "distinct_openings": 0, "top_opening_share": 0.0, "vocabulary_used": 0}
    openings = Counter(" ".join(c[:opening_words]) for c in captions)
    return {"distinct_captions": len({" ".join(c) for c in captions}) / len(captions),
            "distinct_openings": len(openings),
            "top_opening_share": openings.most_common(1)[0][1] / len(captions),
            "vocabulary_used": len({w for c in captions for w in c})}
