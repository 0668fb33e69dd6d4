"""A pure-Python stand-in for coco-caption's Java PTB tokenizer.

coco-caption (``pycocoevalcap.tokenizer.ptbtokenizer.PTBTokenizer``) writes every caption on its own
line, runs Stanford CoreNLP 3.4.1's ``edu.stanford.nlp.process.PTBTokenizer -preserveLines
-lowerCase`` over the file, splits each output line on single spaces and drops the tokens listed in
:data:`PUNCTUATIONS`.  :func:`ptb_tokenize` reproduces that output without Java, so BLEU, ROUGE-L and
CIDEr can still be computed the way papers report them on machines without a JVM.

How it works.  CoreNLP's tokenizer is a JFlex scanner: at each position the rule with the longest
match wins (trailing context counts towards the length), ties go to the rule listed first, and the
scanner runs over the whole file, so a rule's look-ahead can see the next caption's first
characters.  :mod:`captioning.metrics.ptb_rules` re-implements the scanner's rules that matter for
English captions; this module runs them in that same longest-match discipline and scans all captions
as one newline-joined stream, as the Java tool does.  The rules mirror the macros of CoreNLP's
``PTBLexer.flex`` grammar as they behave in version 3.4.1 and were checked token by token against
the real ``stanford-corenlp-3.4.1.jar`` shipped with pycocoevalcap (see ``tests/metrics/test_metrics.py`` and
``tests/metrics/test_tokenizer.py``).  NLTK's ``TreebankWordTokenizer`` was the first candidate, but its
regular-expression pipeline disagrees with the Java scanner on common caption text (sentence-internal
periods such as ``"a dog. A cat"``, single-letter abbreviations such as ``"the letter a."``,
``"AT&T"`` versus ``"at&t"``, ``"!!"`` and ``"?!"`` runs, bracket names, quote and URL handling), so
the scanner below is used instead.

What it reproduces (all checked against the jar): lower-casing; PTB contractions (``"man's"`` ->
``man 's``, ``"don't"`` -> ``do n't``, ``"can't"`` -> ``ca n't``, ``cannot/gonna/gotta/wanna/lemme/
gimme/'tis/'twas`` split, ``"o'clock"``, ``"ma'am"``, ``"'90s"`` kept); hyphenated words
(``t-shirt``, ``10-year-old``); numbers (``2.5``, ``3,000``, ``10:30``, ``1/2``, ``"1 1/2"`` joined by
a no-break space, ``.5``, ``-5``); ``$ 5``, ``5 %``, ``£`` -> ``#``, ``€`` -> ``$``, ``¢`` -> ``cents``;
fractions ``½`` -> ``1/2``; quotes (removed afterwards), curly quotes and apostrophes (``man’s`` ->
``man 's``); brackets (``-lrb-``, ``-rrb-``, ``-lsb-``, ``-rsb-``, ``-lcb-``, ``-rcb-`` - lower-cased
by ``-lowerCase``, so they are *not* in coco-caption's punctuation list and stay in the tokens);
sentence-internal and final periods; abbreviations (``mr.``, ``st.``, ``vs.``, ``etc.``, ``e.g.``,
``a.m.``, ``u.s.``, single letters ``a.``, ``no.`` only before a number) including the duplicated period after an
abbreviation that ends a sentence (``"... etc. The"`` -> ``etc. . the``); ellipses (``...``,
``....``, ``…`` -> ``...``); dashes (``--``, ``–``, ``—`` -> ``--``); ``!!``/``?!`` runs; slashes
(``and/or``, ``w / ``); ampersands (``&``, ``AT&T`` -> ``at&t`` but ``at&t`` -> ``at & t``,
``&amp;`` -> ``&``); URLs, e-mail addresses, file names, ``@names`` and ``#tags``; smileys
(``:)`` -> ``:-rrb-``); runs of numbers that look like phone numbers (``"2014 2015 2016"`` becomes one
token joined by no-break spaces); non-ASCII letters (``café``, ``naïve``); symbols kept as
one-character tokens or deleted exactly as the jar does (tables in ``ptb_rules``); characters outside
the Basic Multilingual Plane (emoji) deleted; runs of spaces, tabs and no-break spaces.

Agreement.  On 350 hand-written captions and probes, ~40 000 randomly assembled caption fragments and
~30 000 random strings over ASCII and the whole Basic Multilingual Plane, the output equals the jar's
output exactly (after coco-caption's punctuation removal).  Known differences - text that does not
occur in captions:

* Lower-casing is Python's ``str.lower`` where Java uses ``String.toLowerCase``; they differ on a few
  characters, e.g. the Greek capital sigma after a non-letter inside one token (``"x.Σ"``).
* The rules were reconstructed from the jar's behaviour, so constructs never probed (SGML entities
  such as ``&HT;``, exotic URL shapes) may still be tokenized differently.
* Captions with a line-break character inside (``\\r``, ``\\v``, ``\\f``, U+2028, U+2029): the Java
  tool would split them into two lines and misalign every later caption; this module and the Java
  path of :func:`captioning.metrics.score_captions` both replace such characters with spaces first, so
  they agree with each other and differ (on purpose) from a raw pycocoevalcap run on such text.

Speed.  Trying every rule at every position (:func:`_scan_full`, the reference) costs ~80 regular
expression calls per character.  :func:`_scan` gives the same tokens ~15x faster on captions: runs of
plain ASCII words separated by spaces are split off by one regular expression (no longer match can
start there, see :data:`_PLAIN_RUN`), and elsewhere only the rules whose pattern can begin with the
character at hand are tried (:class:`_RulesByFirstChar`, derived from the patterns themselves, so it
cannot drift from :data:`~captioning.metrics.ptb_rules.RULES`).  ``tests/metrics/test_tokenizer.py`` checks
that both scanners agree on many thousands of captions and adversarial strings.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Hashable, Iterable, Mapping, Sequence

from captioning.metrics.ptb_first_chars import RULES_BY_FIRST_CHAR
from captioning.metrics.ptb_rules import RULES, SPACE, Action

__all__ = ["PUNCTUATIONS", "ptb_tokenize", "clean_caption", "strip_punctuation"]

# coco-caption's list of tokens removed after tokenization (pycocoevalcap/tokenizer/ptbtokenizer.py).
try:  # pragma: no cover - depends on the environment
    from pycocoevalcap.tokenizer.ptbtokenizer import PUNCTUATIONS as _COCO_PUNCTUATIONS

    PUNCTUATIONS: tuple[str, ...] = tuple(_COCO_PUNCTUATIONS)
except ImportError:  # pragma: no cover
    PUNCTUATIONS = ("''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-", "--",
                    "...", ";")
_PUNCT_SET = frozenset(PUNCTUATIONS)

# Characters the Java scanner treats as line breaks (besides "\n"); they would split one caption
# into two lines, so they are replaced with a space before tokenizing (U+0085 is *not* one of them:
# the scanner reads it as a CP1252 ellipsis).
_LINE_BREAKS = re.compile("\r\n|[\r\n\u2028\u2029\u000b\u000c]")


def clean_caption(caption: str) -> str:
    """Replace line-break characters with spaces so that one caption stays one tokenizer line."""
    return _LINE_BREAKS.sub(" ", caption)


def strip_punctuation(line: str) -> str:
    """coco-caption's post-processing of one tokenizer output line: drop punctuation tokens."""
    return " ".join(w for w in line.rstrip().split(" ") if w not in _PUNCT_SET)


# ------------------------------------------------------------------------------------------------
# Scanning
# ------------------------------------------------------------------------------------------------
# Runs of plain words: ASCII letters followed by " ", "\t" or a line end can only be scanned as that
# one word (no rule that can match longer starts with letters and crosses such a space; e-mail and
# URL rules can cross a no-break space) - except the assimilations split by the first rules.  The
# spaces after a word are skipped the way the space rule does (no other rule starts with " " or "\t").
_ASSIMILATED = "(?i:cannot|gonna|gotta|lemme|gimme|wanna)"
_PLAIN_RUN = re.compile(f"(?:(?!{_ASSIMILATED}(?=[ \t\n]|$))[A-Za-z]+(?=[ \t\n]|$)(?:[ \t]{SPACE}*)?)+")
_SPACES = re.compile(f"{SPACE}+")
_SPACE_STARTS = frozenset(" \t")


def _longest_match(text: str, pos: int, rules: Iterable[tuple[re.Pattern[str], Action]]) -> tuple[list[str], int]:
    """(tokens, characters consumed) of the rule with the longest match at `pos`; ties go to the first."""
    best_len, best_text, best_action = -1, "", None
    for rx, action in rules:
        m = rx.match(text, pos)
        if m is not None and m.end() - pos > best_len:
            best_len, best_text, best_action = m.end() - pos, m.group("t"), action
    assert best_action is not None  # the last rule matches any character
    return best_action(best_text)


def _add(lines: list[list[str]], tokens: list[str]) -> None:
    for tok in tokens:
        if tok == "\n":
            lines.append([])
        else:
            lines[-1].append(tok)


def _scan_full(text: str) -> list[list[str]]:
    """Tokens of each line of `text` (before lower-casing), every rule tried at every position.

    The reference for :func:`_scan`: a direct transcription of the scanner, ~15x slower.
    """
    lines: list[list[str]] = [[]]
    pos = 0
    while pos < len(text):
        tokens, consumed = _longest_match(text, pos, RULES)
        _add(lines, tokens)
        pos += consumed
    return lines


def _scan(text: str) -> list[list[str]]:
    """Tokens of each line of `text`, as the Java PTBTokenizer scans it (before lower-casing)."""
    lines: list[list[str]] = [[]]
    pos, n = 0, len(text)
    plain, spaces, by_first_char = _PLAIN_RUN.match, _SPACES.match, RULES_BY_FIRST_CHAR
    while pos < n:
        m = plain(text, pos)
        if m is not None:
            lines[-1].extend(m.group().split())  # the run holds only letters and SPACE characters
            pos = m.end()
            continue
        ch = text[pos]
        if ch in _SPACE_STARTS:
            pos = spaces(text, pos).end()  # type: ignore[union-attr]
            continue
        tokens, consumed = _longest_match(text, pos, by_first_char[ch])
        _add(lines, tokens)
        pos += consumed
    return lines


def _output_line(tokens: list[str]) -> str:
    """coco-caption's output for one caption: lower-cased tokens, punctuation tokens dropped."""
    line = " ".join(tokens)
    # str.lower is context-sensitive (Greek final sigma) outside ASCII: lower each token on its own there
    line = line.lower() if line.isascii() else " ".join(tok.lower() for tok in tokens)
    return strip_punctuation(line)


def ptb_tokenize(captions: Mapping[Hashable, Sequence[str]]) -> dict[Hashable, list[str]]:
    """Tokenize captions the way coco-caption's ``PTBTokenizer().tokenize`` does, without Java.

    `captions` maps an id to its caption strings; the result maps the same ids to the tokenized
    captions (lower-cased PTB tokens without coco-caption's punctuation tokens, joined by single
    spaces), in the same order.  Like the Java tool, all captions are scanned as one stream with one
    caption per line, in the mapping's order.
    """
    ids: list[Hashable] = []
    texts: list[str] = []
    for key, caps in captions.items():
        if isinstance(caps, str):
            raise TypeError(f"captions[{key!r}] must be a sequence of strings, not a string")
        for cap in caps:
            if not isinstance(cap, str):
                raise TypeError(f"captions[{key!r}] contains a {type(cap).__name__}, expected str")
            ids.append(key)
            texts.append(clean_caption(cap))
    out: dict[Hashable, list[str]] = {key: [] for key in captions}
    if not texts:
        return out
    lines = _scan("\n".join(texts))
    if len(lines) != len(texts):  # pragma: no cover - clean_caption removes every line break
        raise RuntimeError(f"tokenizer produced {len(lines)} lines for {len(texts)} captions")
    for key, toks in zip(ids, lines):
        out[key].append(_output_line(toks))
    return out


def _main(argv: Sequence[str]) -> None:  # pragma: no cover - debugging helper
    """Tokenize stdin (one caption per line) and print the result, for comparisons with Java."""
    caps = [line.rstrip("\n") for line in sys.stdin]
    res = ptb_tokenize({i: [c] for i, c in enumerate(caps)})
    for i in range(len(caps)):
        sys.stdout.write(res[i][0] + "\n")


if __name__ == "__main__":  # pragma: no cover
    _main(sys.argv[1:])
