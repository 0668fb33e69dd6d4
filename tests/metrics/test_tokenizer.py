"""The fast PTB scanner gives exactly the tokens of the reference scanner (every rule at every position).

:func:`captioning.metrics.tokenizer._scan` takes shortcuts (runs of plain words, rules chosen by their
first character); :func:`~captioning.metrics.tokenizer._scan_full` is the plain transcription of the
Java scanner's longest-match loop.  They are compared token for token on realistic captions (several
seeds of :func:`synthetic_text.realistic_corpus`), on adversarial strings and on
seeded random fragment soup, and, when Java is installed, :func:`ptb_tokenize` is compared with the
jar itself.  Token-level checks of the rules themselves live in ``tests/test_metrics.py``.
"""

from __future__ import annotations

import random
import re

import pytest
from fixtures import needs_java
from synthetic_text import realistic_corpus

from captioning.metrics import java_ptb_tokenize, ptb_tokenize
from captioning.metrics.ptb_first_chars import RULES_BY_FIRST_CHAR, _first_chars
from captioning.metrics.ptb_rules import RULES
from captioning.metrics.tokenizer import _output_line, _scan, _scan_full, clean_caption

# Strings aimed at the shortcuts' edges: words next to punctuation, other spaces and line ends,
# assimilations ("cannot", "gonna") in every position, and text the scanner handles specially.
ADVERSARIAL = [
    "", " ", "\t", "   ", "a", "A", "a ", " a", "a\tb", "a \u00a0b", "a\u00a0b", "a\u3000b c\u2002d", "word.",
    "word.\u00a0x", "cannot", "Cannot go", "I cannot", "gonna", "GONNA wanna gotta lemme gimme dunno", "cannotx",
    "xcannot", "can not", "'tis 'twas", "a gonna.", "wanna\tgo", "don't can't won't ain't shan't y'all",
    "rock'n'roll o'clock ma'am '90s 1990's dogs' the '80s", "O'Neil d'Artagnan l'hôtel",
    'He said "hi" and "bye." ""', "''quoted'' ``latex'' `tick' ‘single’ “double” «guillemets» „low“",
    "t-shirt 10-year-old black-and-white - -- --- ---- ----- x-", "e-mail anti-war pro-choice -LRB- -rrb-",
    "3,000 2.5 .5 -5 +5 1,234,567.89 10:30 1/2 1 1/2 12/25/2014 3-2 5th 1990s 007", "½ ¼ ¾ ⅓ ⅔ ⅛",
    "$5 $ 5 US$5 5% £5 €10 ¢ ¥100 #1 # 1",
    "c++ C# f# at&t AT&T AT&T. R&B S&P-500 S&Ls &amp; &amp &nbsp; &quot;x&quot;",
    "Mr. Smith Mrs. Dr. St. Ave. etc. Etc. e.g. i.e. a.m. p.m. U.S. u.s. U.S.A. vs. Inc. Co. No. 5 no. x",
    "The U.S. The end. A. B. c. I. The Jan. 5 Dec. 25, 2014 Calif. Ark. fig. 3 pp. 12 Ph.D. Jr.",
    "etc.\nThe next line", "U.S.\n\nThe", "a.\nb", "e.g.", "etc.", "etc", "Wait... what.... ok … . . . .. ... .",
    "http://example.com/path?q=1 https://x.org. www.example.com example.org/page mail@example.com <a@b.c>",
    "image.jpg file.tar.gz report.pdf, x.y a.b.c @user #hashtag #1 @ # _ __ * ** \\* = / \\",
    ":) ;-) :( :-D :P =) <:) :o) ^_^ (^_^) (-_-) xD :-/ ;] :3 <3 </3",
    "Hi!!! What?? Yes?! ¿Qué? ¡Hola! ; : , ,, ;; ::",
    "(a) [b] {c} ((x)) <b>bold</b> <br/> <!-- c --> <p class='x'>",
    "Café naïve Zürich São Paulo crème brûlée jalapeño façade Ångström Œuvre straße ΑΒΓ Ωμέγα Россия 東京 한국",
    "\u00ad soft\u00adhyphen \u200b zero\u200bwidth \ufeff bom \u0085 nel \x00 nul \x7f del \u2028 \u2029",
    "emoji 😀 inside 👍🏽 text 🇫🇷 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "2014 2015 2016 (555) 123-4567 +1 555 123 4567 555.123.4567",
    "a" * 500, "A" * 300 + ".", "x-" * 200 + "y", "1" * 200 + ",5", ".-" * 150, "'" * 50, "ab " * 300,
    "a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p", "yes.No.Maybe!Who?Me", "A man.a dog sign.The end",
    "ALL CAPS SENTENCE HERE.", "MiXeD cAsE WoRdS", "word\tword  word   word\u00a0 word \u00a0word",
    "Salt&pepper rock&roll Q&A", "w/ w/o km/h and/or 24/7 1/2-inch", "a\\/b",
]

# Fragments for seeded random soup: every shortcut boundary (plain words, spaces of every kind, line
# ends) next to every kind of special text.
FRAGMENTS = [
    "a", "A", "the", "dog", "Dog", "DOG", "cannot", "gonna", "Wanna", "st", "St", "etc", "u", "s", "e", "g",
    "x", "I", "No", "Jan", "www", "com", "jpg", "http", "n't", "'s", "'", "\"", "`", "’", "“", "”", "-", "--",
    ".", "..", "...", "…", ",", ";", ":", "!", "?", "&", "&amp;", "/", "\\", "(", ")", "[", "]", "{", "}",
    "<", ">", "@", "#", "$", "%", "*", "=", "+", "_", "0", "5", "12", "3,000", "2.5", "10:30", "1/2", "½",
    "£", "€", "café", "Ωμέγα", "東京", "\u00ad", "😀", " ", " ", " ", "  ", "\t", "\u00a0", "\u3000", "\n",
]


def _random_soup(rng: random.Random, count: int) -> list[str]:
    return ["".join(rng.choice(FRAGMENTS) for _ in range(rng.randrange(1, 16))) for _ in range(count)]


def _corpus(num_images: int, seeds: range) -> list[str]:
    captions: list[str] = []
    for seed in seeds:
        candidates, references = realistic_corpus(num_images, seed=seed)
        for image_id, refs in references.items():
            captions += [*refs, candidates[image_id]]
    return captions


def _assert_same_scan(captions: list[str]) -> None:
    """Both scanners on the captions as one stream (look-ahead crosses lines), and on each alone."""
    text = "\n".join(clean_caption(c) for c in captions)
    full = _scan_full(text)
    assert len(full) == len(captions)
    assert _scan(text) == full
    for caption in captions:
        alone = clean_caption(caption)
        assert _scan(alone) == _scan_full(alone), caption
    expected = [_output_line(tokens) for tokens in full]
    out = ptb_tokenize({i: [c] for i, c in enumerate(captions)})
    assert [out[i][0] for i in range(len(captions))] == expected


def test_fast_scanner_equals_full_scanner_on_realistic_captions() -> None:
    captions = _corpus(60, range(4))  # 1,440 captions, four seeds
    assert len(set(captions)) > 1000
    _assert_same_scan(captions)


def test_fast_scanner_equals_full_scanner_on_adversarial_strings() -> None:
    _assert_same_scan(ADVERSARIAL)
    _assert_same_scan(list(reversed(ADVERSARIAL)))  # other neighbours for the cross-line look-ahead


def test_fast_scanner_equals_full_scanner_on_random_soup() -> None:
    _assert_same_scan(_random_soup(random.Random(0), 1500))


@pytest.mark.slow
def test_fast_scanner_equals_full_scanner_large() -> None:
    _assert_same_scan(_corpus(400, range(4, 9)))  # 12,000 captions, five more seeds
    _assert_same_scan(_random_soup(random.Random(1), 8000))


def test_every_matching_rule_is_a_candidate_for_its_first_character() -> None:
    """Stronger than equal output: at *every* position, each rule that matches is among those tried."""
    text = "\n".join(ADVERSARIAL + _random_soup(random.Random(2), 300) + _corpus(5, range(2)))
    for pos in range(len(text)):
        candidates = RULES_BY_FIRST_CHAR[text[pos]]
        for rule in RULES:
            if rule[0].match(text, pos) is not None:
                assert rule in candidates, (rule[0].pattern[:60], text[pos:pos + 20])


def test_first_characters_of_patterns() -> None:
    first = _first_chars(re.compile("(?i:ab)|[0-3]x|(?:-)?y+|_"))
    assert first is not None
    assert [ch for ch in "aAbBc0349-yY_%" if first.match(ch)] == ["a", "A", "0", "3", "-", "y", "_"]
    negated = _first_chars(re.compile("[^a-z]q"))
    assert negated is not None and negated.match("\n") and negated.match("Q") and not negated.match("q")
    assert _first_chars(re.compile("a?")) is None  # can match nothing: tried everywhere
    assert _first_chars(re.compile("(?=a)b*")) is None
    lookahead = _first_chars(re.compile("(?!x)[a-z]+"))
    assert lookahead is not None and lookahead.match("x")  # look-arounds ignored: a superset
    # the catch-all last rule is tried everywhere; a plain letter needs far fewer than all the rules
    assert all(RULES_BY_FIRST_CHAR[ch][-1] == RULES[-1] for ch in "a.\n,'\"A3é(-😀")
    assert len(RULES_BY_FIRST_CHAR["z"]) < len(RULES) / 2 and len(RULES_BY_FIRST_CHAR["\n"]) == 2


def test_plain_words_take_the_shortcut_and_assimilations_do_not() -> None:
    assert _scan("a dog  runs\tfast\nCannot gonna wanna") == [["a", "dog", "runs", "fast"],
                                                              ["Can", "not", "gon", "na", "wan", "na"]]
    assert ptb_tokenize({1: ["Gonna go, cannot stay."]}) == {1: ["gon na go can not stay"]}


@pytest.mark.integration
@needs_java
def test_python_tokenizer_matches_java_on_varied_captions() -> None:
    """ptb_tokenize against the jar on thousands of realistic captions (four seeds) and the adversarial
    strings that are caption-like (the module docstring lists the known, non-caption differences)."""
    captions = _corpus(500, range(4)) + JAVA_ADVERSARIAL
    batch = {i: [c] for i, c in enumerate(captions)}
    java = java_ptb_tokenize(batch)
    python = ptb_tokenize(batch)
    assert [(captions[i], python[i]) for i in batch if python[i] != java[i]] == []


# Printable, caption-like strings.
JAVA_ADVERSARIAL = [c for c in ADVERSARIAL if c.isprintable() and "\u00ad" not in c]


@pytest.mark.integration
@needs_java
def test_dunno_is_kept_whole_as_by_java() -> None:
    captions = {1: ["I dunno.", "Dunno what", "dunnox is", "a dunno-thing", "we dunno's", "DUNNO"]}
    assert java_ptb_tokenize(captions)[1][0] == "i dunno"
    assert ptb_tokenize(captions) == java_ptb_tokenize(captions)
