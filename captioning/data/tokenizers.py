"""How caption text becomes words: one rule per data set (`dataset.tokenizer`), used alike by the readers (and so the
vocabulary), by scoring (BLEU, ROUGE-L, CIDEr-D: captioning/metrics/languages.py) and by the SCST rewards.

* `ptb` (the default): English. The readers split with NLTK's Treebank tokenizer (`vocab.tokenize`; a Karpathy
  file's own `tokens` are taken as they are), scoring with coco-caption's PTB tokenizer (captioning/metrics/
  tokenizer.py); both lower-case and drop punctuation tokens.
* `whitespace`: text whose words are separated by spaces (pre-segmented Chinese, Korean, Vietnamese, ...).
* `char`: Chinese and Japanese, written without spaces: every character is a token, except that a run of ASCII
  letters and digits is one ("iphone", "12"; other letters are one each: "café" -> "caf", "é"); white space only
  separates.

Both non-PTB rules first normalise the text (Unicode NFKC: full-width letters and digits become ASCII,
"ＯＫ" -> "OK"), lower-case it and replace every punctuation character (Unicode categories P*: "，。、！？「」・" as
well as ".,;:'-") by a space; symbols (S*: "+", "$", "°") and letters of every script stay. They read the raw caption
only (a Karpathy file's `tokens` are ignored), so the vocabulary holds exactly the tokens that scoring compares.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Literal, get_args

from captioning.base.constraints import choose_one
from captioning.data.vocab import tokenize

CaptionTokenizer = Literal["ptb", "whitespace", "char"]
CAPTION_TOKENIZERS: tuple[str, ...] = get_args(CaptionTokenizer)
DEFAULT_TOKENIZER: CaptionTokenizer = "ptb"  # conf/dataset/_base.yaml's; what a record or checkpoint naming none had
VERSION = "v1"  # of the whitespace and char rules: part of the prepared captions' key (data/prepared/store.py)

_char_token = re.compile(r"[a-z0-9]+|\S")  # after lower-casing: a run of ASCII letters and digits, or one character


class _Punctuation(dict[int, int | str]):
    """str.translate's table, filled in as characters are met: punctuation (Unicode categories P*) -> a space, any
    other character -> itself (a table of all of Unicode would take a third of a second to build)."""

    def __missing__(self, code: int) -> int | str:
        self[code] = value = " " if unicodedata.category(chr(code)).startswith("P") else code
        return value


_PUNCTUATION = _Punctuation()


def _normalised(text: str) -> str:
    """NFKC-normalised, lower-cased, punctuation replaced by spaces."""
    return unicodedata.normalize("NFKC", text).lower().translate(_PUNCTUATION)


def whitespace_words(text: str) -> list[str]:
    """The `whitespace` rule: the normalised caption split at white space."""
    return _normalised(text).split()


def char_words(text: str) -> list[str]:
    """The `char` rule: each character of the normalised caption a token, runs of ASCII letters and digits one."""
    return _char_token.findall(_normalised(text))


_RULES: dict[str, Callable[[str], list[str]]] = {"ptb": tokenize, "whitespace": whitespace_words, "char": char_words}


def words_of(tokenizer: str) -> Callable[[str], list[str]]:
    """The function that splits a caption into its words under `tokenizer` (one of CAPTION_TOKENIZERS)."""
    if tokenizer not in _RULES:
        raise ValueError(f"unknown caption tokenizer {tokenizer!r}; {choose_one(str(tokenizer), CAPTION_TOKENIZERS)}")
    return _RULES[tokenizer]


def rule_id(tokenizer: str) -> str:
    """What names a non-PTB rule in the key of prepared captions (the PTB one is named with NLTK's version there)."""
    words_of(tokenizer)
    return f"{tokenizer}-{VERSION}/nfkc/lower/no-punctuation"
