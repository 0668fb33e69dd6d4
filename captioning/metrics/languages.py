"""Scoring captions in other languages than English: BLEU, ROUGE-L and CIDEr-D on the words of the data set's own
tokenizer (`dataset.tokenizer`, captioning/data/tokenizers.py) instead of the PTB tokenizer's.

With `whitespace` or `char`, candidates and references are both split by that rule (the one that made the
vocabulary), and each caption is scored as its words joined by single spaces, the form coco-caption's scorers read.
METEOR and SPICE are English-only (METEOR 1.5's stemmer, synonyms and paraphrase tables; SPICE's English parser):
with these tokenizers they are not computed, and `english_only` gives the reason score_captions records as skipped.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

from captioning.data.tokenizers import CAPTION_TOKENIZERS, words_of

K = TypeVar("K", bound=Hashable)

#: The caption tokenizers that are not PTB: scoring splits by the data set's rule.
LANGUAGE_TOKENIZERS: tuple[str, ...] = tuple(t for t in CAPTION_TOKENIZERS if t != "ptb")
ENGLISH_ONLY = ("meteor", "spice")  # metrics computed on English text only


def split_captions(captions: Mapping[K, Sequence[str]], tokenizer: str) -> dict[K, list[str]]:
    """Each caption as its words under `tokenizer` (one of LANGUAGE_TOKENIZERS) joined by single spaces."""
    if tokenizer not in LANGUAGE_TOKENIZERS:
        raise ValueError(f"split_captions takes one of {', '.join(LANGUAGE_TOKENIZERS)}, got {tokenizer!r} (PTB "
                         "tokenizing is captioning.metrics.tokenizer's)")
    words = words_of(tokenizer)
    return {key: [" ".join(words(c)) for c in caps] for key, caps in captions.items()}


def english_only(name: str, tokenizer: str) -> str:
    """Why metric `name` (METEOR, SPICE) is not computed on captions split by `tokenizer`: one line."""
    return (f"{name} is English-only and the captions are split with tokenizer={tokenizer} (dataset.tokenizer, "
            f"captioning-score --tokenizer); score them with bleu, rouge and cider")
