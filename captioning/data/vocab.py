"""Word vocabulary: PTB-style lower-cased tokens, a frequency threshold and four special tokens."""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from captioning.base.tokens import END, END_ID, PAD, PAD_ID, SPECIALS, START, START_ID, UNK, UNK_ID  # noqa: F401

# Tokens that are pure punctuation are dropped, as coco-caption does before scoring.
_punct = re.compile(r"^[^\w]+$")


@functools.cache
def _treebank() -> Callable[[str], list[str]]:
    """NLTK's Treebank tokenizer, imported on first use (reading files that carry tokens never needs it)."""
    from nltk.tokenize import TreebankWordTokenizer

    return TreebankWordTokenizer().tokenize


# Captions of lower-case ASCII words, digits, spaces, hyphens and the marks , & ; @ # $ % ? ! with at most one period,
# at the end (most COCO captions): for these the Treebank tokenizer only splits on spaces and splits off the marks
# and the final period (all then dropped as punctuation), unless a comma precedes a digit or another comma, there is
# a double dash, or a word is one it splits (cannot, gonna, ...). tests/data/test_vocab.py checks this shortcut
# against NLTK on generated and adversarial captions.
_plain = re.compile(r"[a-z0-9 ,&;@#$%?!-]*\.? *")
_treebank_splits = re.compile(r",[\d,]|--|cannot|gimme|gonna|gotta|lemme|wanna")
_marks = str.maketrans(",&;@#$%?!", " " * 9)


def tokenize(text: str) -> list[str]:
    """Lower-case a caption and split it into PTB-style word tokens without punctuation."""
    text = text.lower()
    if _plain.fullmatch(text) and not _treebank_splits.search(text):  # what the Treebank tokenizer gives, faster
        return [t for t in text.rstrip(" .").translate(_marks).split() if not _punct.match(t)]
    return [t for t in _treebank()(text) if not _punct.match(t)]


class Vocabulary:
    """Maps words to ids and back; ids 0..3 are <pad>, <start>, <end>, <unk>.

    `tokenizer`: the rule its words were made by (dataset.tokenizer), where known: a checkpoint's vocabulary names it
    (captioning/checkpoint/file.py) and a data set of captions made by another rule refuses it (CaptionDataset). It
    takes no part in equality: two vocabularies are equal when their words are."""

    def __init__(self, words: Sequence[str], tokenizer: str | None = None):
        if tuple(words[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with the special tokens {SPECIALS}, got {list(words[:4])}")
        if len(set(words)) != len(words):
            raise ValueError("a vocabulary must not list a word twice")
        self.itos: list[str] = list(words)
        self.stoi: dict[str, int] = {w: i for i, w in enumerate(self.itos)}
        self.tokenizer = tokenizer

    pad_id, start_id, end_id, unk_id = PAD_ID, START_ID, END_ID, UNK_ID

    @classmethod
    def build(cls, captions: Iterable[Sequence[str]], min_freq: int = 1, max_size: int | None = None) -> Vocabulary:
        """Build from tokenised training captions: words seen >= min_freq times, the most frequent max_size."""
        if min_freq < 1:
            raise ValueError(f"min_freq must be >= 1, got {min_freq}")
        counts = Counter(w for tokens in captions for w in tokens)
        return cls.from_counts(counts, min_freq, max_size)

    @classmethod
    def from_counts(cls, counts: Mapping[str, int], min_freq: int = 1, max_size: int | None = None) -> Vocabulary:
        """Build from training word counts (what `build` counts): words seen >= min_freq times, the most frequent
        max_size; prepared captions (captioning/data/prepared/store.py) store the counts and call this."""
        if min_freq < 1:
            raise ValueError(f"min_freq must be >= 1, got {min_freq}")
        # Sort by (-count, word) so the vocabulary does not depend on caption order.
        kept = (w for w, c in counts.items() if c >= min_freq and w not in SPECIALS)
        ranked = sorted(kept, key=lambda w: (-counts[w], w))
        if max_size is not None:
            ranked = ranked[: max(0, max_size - len(SPECIALS))]
        if not ranked:
            raise ValueError("the training captions gave an empty vocabulary: check the data and min_freq")
        return cls([*SPECIALS, *ranked])

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Map tokens to ids; unknown words become <unk>."""
        return [self.stoi.get(t, self.unk_id) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Map ids back to words, skipping <start>/<pad> and stopping at <end>."""
        words = []
        for i in ids:
            i = int(i)
            if i == self.end_id:
                break
            if i in (self.pad_id, self.start_id):
                continue
            words.append(self.itos[i])
        return words

    def to_list(self) -> list[str]:
        """The words in id order, for checkpoints."""
        return list(self.itos)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.itos == other.itos
