"""A pure-Python stand-in for coco-caption's Java PTB tokenizer.

coco-caption (``pycocoevalcap.tokenizer.ptbtokenizer.PTBTokenizer``) writes every caption on its own
line, runs Stanford CoreNLP 3.4.1's ``edu.stanford.nlp.process.PTBTokenizer -preserveLines
-lowerCase`` over the file, splits each output line on single spaces and drops the tokens listed in
:data:`PUNCTUATIONS`.  :func:`ptb_tokenize` reproduces that output without Java, so BLEU, ROUGE-L and
CIDEr can still be computed the way papers report them on machines without a JVM.

How it works.  CoreNLP's tokenizer is a JFlex scanner: at each position the rule with the longest
match wins (trailing context counts towards the length), ties go to the rule listed first, and the
scanner runs over the whole file, so a rule's look-ahead can see the next caption's first
characters.  This module re-implements the scanner's rules that matter for English captions in that
same longest-match discipline (:data:`_RULES`) and scans all captions as one newline-joined stream, as
the Java tool does.  The rules were written from the tokenizer's documented behaviour and checked
token by token against the real ``stanford-corenlp-3.4.1.jar`` shipped with pycocoevalcap (see
``tests/test_metrics.py``).  NLTK's ``TreebankWordTokenizer`` was the first candidate, but its
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
sentence-internal and final periods; abbreviations (``mr.``, ``st.``, ``no.``, ``vs.``, ``etc.``,
``e.g.``, ``a.m.``, ``u.s.``, single letters ``a.``) including the duplicated period after an
abbreviation that ends a sentence (``"... etc. The"`` -> ``etc. . the``); ellipses (``...``,
``....``, ``…`` -> ``...``); dashes (``--``, ``–``, ``—`` -> ``--``); ``!!``/``?!`` runs; slashes
(``and/or``, ``w / ``); ampersands (``&``, ``AT&T`` -> ``at&t`` but ``at&t`` -> ``at & t``,
``&amp;`` -> ``&``); simple URLs, e-mail addresses, ``@names`` and ``#tags``; non-ASCII letters
(``café``, ``naïve``); symbols kept as one-character tokens; characters outside the Basic
Multilingual Plane (emoji) deleted; runs of spaces, tabs and no-break spaces.

Known differences (exotic input only; excluded from the equality test with a comment):

* ``<...>`` spans that look like SGML tags: the Java scanner joins ``"a <b c> d"`` into one token
  (``<b c>`` with a no-break space) and may even run such a tag across captions; here a tag never
  crosses a caption boundary.
* ``"a@b"`` without a dot after the ``@`` stays one token in Java; here it becomes ``a @b``.
* Very long runs of dots mixed with spaces (``"...... ..a"``), where Java's ellipsis rules interact in
  ways not reproduced here.
* Characters whose Unicode category changed between the JVM's tables of 2014 and Python's
  ``unicodedata`` (newly assigned letters), and rarely used control or format characters.
* Captions with a line-break character inside (``\\r``, ``\\v``, ``\\f``, U+2028, U+2029): the Java
  tool would split them into two lines and misalign every later caption; both tokenizers in this
  package first replace such characters with spaces, so the Java path of
  :func:`captioning.metrics.score_captions` and this module agree, and both differ (on purpose) from
  a raw pycocoevalcap run on such text.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Callable, Hashable, Mapping, Sequence

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
# Character classes
# ------------------------------------------------------------------------------------------------
def _class_from(predicate: Callable[[str], bool]) -> str:
    """Regex character-class body for the BMP characters satisfying `predicate`, as ranges."""
    parts: list[str] = []
    start = prev = None
    for cp in range(0x10000):
        if 0xD800 <= cp <= 0xDFFF:
            ok = False
        else:
            ok = predicate(chr(cp))
        if ok:
            if start is None:
                start = cp
            prev = cp
        elif start is not None:
            parts.append(re.escape(chr(start)) if start == prev else f"{re.escape(chr(start))}-{re.escape(chr(prev))}")
            start = None
    if start is not None:
        parts.append(re.escape(chr(start)) if start == prev else f"{re.escape(chr(start))}-{re.escape(chr(prev))}")
    return "".join(parts)


def _is_letter(ch: str) -> bool:
    # Java's [:letter:] plus the combining marks and soft hyphen that the scanner's WORD also allows.
    return ch.isalpha() or unicodedata.category(ch) in ("Mn", "Mc") or ch == "\u00ad"


_LCH = _class_from(_is_letter)
_DCH = _class_from(lambda ch: unicodedata.category(ch) == "Nd")
_ALPHA = f"[{_LCH}]"          # one letter
_DIGIT = f"[{_DCH}]"          # one decimal digit
_ALNUM = f"[{_LCH}{_DCH}]"

_SP = "[ \t\u00a0\u2000-\u200a\u3000]"       # spaces
_NL = "(?:\r\n?|[\n\u2028\u2029\u000b\u000c])"  # line breaks (only "\n" survives clean_caption)
_SPNL = f"(?:{_SP}|{_NL})"
_APOS = "(?:['\u0092\u2019]|&apos;)"
_APOSETC = "(?:['\u0092\u2019`\u0091\u2018\u201b]|&apos;)"
_SPLET = "&[aeiouAEIOU](?i:acute|grave|uml);"
_LETTER = f"(?:{_ALPHA}|{_SPLET})"
_WORD = f"{_LETTER}(?:{_LETTER}|{_DIGIT})*(?:[.!?]{_LETTER}(?:{_LETTER}|{_DIGIT})*)*"
_REDAUX = f"{_APOS}(?:[msdMSD]|(?i:re|ve|ll))"
_SWORD = "[A-Za-z\u00ad]*[A-MO-Za-mo-z]\u00ad*"
_SREDAUX = f"(?i:n){_APOSETC}(?i:t)"
_NUMSEP = "[.:,\u00ad\u066b\u066c]"
# (Python alternation is ordered, not longest-match: every pattern lists its longer alternatives first.)
_NUM = f"(?:{_DIGIT}+(?:{_NUMSEP}{_DIGIT}+)*|(?:{_NUMSEP}{_DIGIT}+)+)"
_NUMBER = f"[-+]?{_NUM}"
_HYPHEN = "[-_\u058a\u2010\u2011]"
_ACRO = "(?:[A-Za-z](?:\\.[A-Za-z])+|(?i:(?:canada|sino|korean|eu|japan|non)-u\\.s|u\\.s\\.-(?:u\\.k|u\\.s\\.s\\.r)))"
_SGML_NAME = "[A-Za-z][A-Za-z0-9_:.-]*"
_SGML_VALUE = "(?:'[^\\r\\n']*'|\"[^\\r\\n\"]*\")"
_SGML = (f"<(?:[!?][A-Za-z-][^>\\r\\n]*|/?{_SGML_NAME}"
         f"(?: +(?:{_SGML_NAME} *= *{_SGML_VALUE}|{_SGML_NAME}|{_SGML_VALUE}| */))* */?)>")

# Abbreviations (the scanner is case-insensitive except inside character classes such as "[A]rk").
_ABMONTH = "(?i:jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec)"
_ABDAYS = "(?i:mon|tue|tues|wed|thu|thurs|fri)"
_ABSTATE = ("(?:(?i:ala|ariz)|A(?i:z)|A(?i:rk)|(?i:calif|colo|conn|ct|dak)|D(?i:el)|(?i:fla|ga)|I(?i:ll)"
            "|(?i:ind|kans?|ky)|L(?i:a)|M(?i:ass)|(?i:md|mich|minn)|M(?i:iss)|(?i:mo|mont|neb|nev|okla)|O(?i:re)"
            "|P(?i:a)|(?i:penn|tenn)|T(?i:ex)|(?i:va|vt)|W(?i:ash)|(?i:wisc?|wyo))")
_ABCOMP = "(?i:inc|cos?|corp|pp?tys?|ltd|plc|rt|bancorp|dept|bhd|assn|univ|intl|sys)"
_ABNUM = "(?i:tel|est|ext|sq)"
# Abbreviations recognised only before a number ("No. 5", "fig. 3").
_ABBREV3 = "(?i:ca|figs?|prop|nos?|art|bldg|pp|op)\\."
_ABPTIT = "(?i:jr|sr|bros|(?:ed|ph)\\.d|blvd|rd|esq)"
_ABBREV1 = f"(?:{_ABPTIT}|{_ABMONTH}|{_ABDAYS}|{_ABSTATE}|{_ABCOMP}|{_ABNUM}|(?i:etc|al|seq))\\."
_ABTITLE = ("(?:(?i:mr|mrs|ms)|M(?i:iss)|(?i:drs?|profs?|sens?|reps?|attys?|lt|col|gen|messrs|govs?|adm|rev|maj|sgt"
            "|cpl|pvt|mt|ft|capt|ste?|ave|pres|lieut|hon|brig|co?mdr|pfc|spc|supts?|det))")
_ABCOMP2 = "(?i:invt|elec|natl|m[ft]g)"
_ABBREV4 = f"(?:{_ACRO}|(?i:a\\.k\\.a)|{_ABTITLE}|(?i:vs|alex|wm|jos|cie|cf|treas|ph)|{_ABCOMP2}|[A-Za-z])"
_SENTEND = f"{_SPNL}(?:{_SPNL}|[A-Z]|{_SGML})"
_INSENTP = "[,;:]"
_ACRONYM_NEXT = ("(?:A(?i:bout|ccording|dditionally|fter|n|s|t)|A|B(?i:ut)|E(?i:arlier)|H(?i:e|er|ere|owever)"
                 "|I(?i:f|n|t)|L(?i:ast)|M(?i:any|ore|r\\.|s\\.)|N(?i:ow)|O(?i:nce|ne|ther|ur)"
                 "|S(?i:he|ince|o|ome|uch)|T(?i:hat|he|hen|here|hese|hey|his)|W(?i:e|hen|hile|hat)|Y(?i:et|ou)"
                 f"|{_SGML})")

# APOWORD: words with an apostrophe inside that stay one token; one pattern per alternative so that
# the longest one wins, as in JFlex.
_APOWORDS = (f"{_APOS}(?i:n){_APOS}?", f"[lLdDjJ]{_APOS}", f"(?i:dunkin|somethin|ol){_APOS}", f"{_APOS}(?i:em)",
             f"[A-HJ-XZn]{_APOSETC}{_ALPHA}{{2,}}", f"{_APOS}[2-9]0(?i:s)", f"{_APOS}(?i:till?)",
             f"{_ALPHA}+[aeiouyAEIOUY]{_APOSETC}[aeiouA-Z]{_ALPHA}*", f"{_APOS}(?i:cause)",
             "(?i:cont'd\\.?|nor'easter|c'mon|e'er|s'mores|ev'ry|li'l|nat'l)", f"(?i:o){_APOSETC}(?i:o)")
_FILENAME = (f"{_ALNUM}+(?:\\.{_ALNUM}+)*\\.(?i:bat|bmp|bz2|c|class|cgi|cpp|dll|doc|docx|exe|gif|gz|h|htm|html"
             "|jar|java|jpeg|jpg|mov|mp3|pdf|php|pl|png|ppt|ps|py|sql|tar|txt|wav|x|xml|zip|3gp|wm[va]|avi|flv|mp[34g])")
_FULLURL = "(?i:https?)://[^ \t\n\f\r\"<>|(){}]+[^ \t\n\f\r\"<>|.!?(){},-]"
_URLPATH = "(?:/[^ \t\n\f\r\"<>|()]+[^ \t\n\f\r\"<>|.!?(){},-])?"
_LIKELYURLS = (f"(?i:www)\\.(?:[^ \t\n\f\r\"<>|.!?(){{}},]+\\.)+[a-zA-Z]{{2,4}}{_URLPATH}",
               # ",-_" is a character range in the original pattern, kept as such
               f"(?:[^ \t\n\f\r\"`'<>|.!?(){{}},-_$]+\\.)+(?i:com|net|org|edu){_URLPATH}")
_SMILEY = "[<>]?[:;=][-o*']?[()DPdpO\\\\{@|\\[\\]]"
_ASIANSMILEY = ("[-^x=~<>']_[-^x=~<>']|\\([-^x=~<>'][_.]?[-^x=~<>']\\)|\\([\\^x=~<>']-[\\^x=~<>'`]\\)")
_EMAIL = "(?:&lt;|<)?[a-zA-Z0-9][^ \t\n\f\r\"<>|(){}\u00a0]*@(?:[^ \t\n\f\r\"<>|(){}.\u00a0]+\\.)*[^ \t\n\f\r\"<>|(){}.\u00a0]+(?:&gt;|>)?"
_PHONE = ("(?:\\([0-9]{2,3}\\)[ \u00a0]?|(?:\\+\\+?)?(?:[0-9]{2,4}[- \u00a0])?[0-9]{2,4}[- \u00a0])[0-9]{3,4}[- \u00a0]?[0-9]{3,5}"
          "|(?:(?:\\+\\+?)?[0-9]{2,4}\\.)?[0-9]{2,4}\\.[0-9]{3,4}\\.[0-9]{3,5}")
_FRAC = f"(?:{_DIGIT}{{1,4}}[- \u00a0])?{_DIGIT}{{1,4}}(?:\\\\?/|\u2044){_DIGIT}{{1,4}}"
_THING = (f"(?:[dDoOlL]{_APOSETC}{_ALNUM})?{_ALNUM}+"
          f"(?:{_HYPHEN}(?:[dDoOlL]{_APOSETC}{_ALNUM})?{_ALNUM}+)*")
_THINGA = "[A-Z]+(?:(?:[+&]|(?i:&amp;))[A-Z]+)+"
_THING3 = "[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}(?:\\\\?/[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}){1,2}"
_HTHING = f"[A-Za-z0-9][A-Za-z0-9.,\u00ad]*(?:-(?:{_ACRO}\\.|[A-Za-z0-9\u00ad]+))+"

# ------------------------------------------------------------------------------------------------
# Token normalisations
# ------------------------------------------------------------------------------------------------
_FRACTIONS = {"\u00bc": "1/4", "\u00bd": "1/2", "\u00be": "3/4", "\u2153": "1/3", "\u2154": "2/3"}
_CURRENCY = str.maketrans({"\u00a2": "cents", "\u00a3": "#", "\u0080": "$", "\u00a4": "$", "\u20a0": "$",
                           "\u20ac": "$"})
_LEFT_SINGLE = re.compile("[\u0091\u2018\u201b\u2039]")
_RIGHT_SINGLE = re.compile("[\u0092\u2019\u203a]")
_LEFT_DOUBLE = re.compile("[\u0093\u201c\u00ab]")
_RIGHT_DOUBLE = re.compile("[\u0094\u201d\u00bb]")


def _latex_quotes(tok: str, probably_left: bool) -> str:
    """The scanner's default quote normalisation (``latexQuotes``)."""
    if probably_left:
        tok = re.sub("&apos;|'", "`", tok)
        tok = re.sub('"|&quot;', "``", tok)
    else:
        tok = re.sub("&apos;|'", "'", tok)
        tok = re.sub('"|&quot;', "''", tok)
    tok = _LEFT_SINGLE.sub("`", tok)
    tok = _RIGHT_SINGLE.sub("'", tok)
    tok = _LEFT_DOUBLE.sub("``", tok)
    return _RIGHT_DOUBLE.sub("''", tok)


def _amp(tok: str) -> str:
    return re.sub("(?i:&amp;)", "&", tok)


def _soft(tok: str) -> str:
    return tok.replace("\u00ad", "")


_Action = Callable[[str], tuple[list[str], int]]


def _emit(norm: Callable[[str], str] = lambda t: t) -> _Action:
    return lambda t: ([norm(t)], len(t))


def _push(keep: int) -> _Action:
    """Emit the first `keep` characters and scan the rest again (JFlex's ``yypushback``)."""
    return lambda t: ([t[:keep]], keep)


def _push_back(n: int) -> _Action:
    return lambda t: ([t[:-n]], len(t) - n)


def _reduplicate(t: str) -> tuple[list[str], int]:
    """Abbreviation ending a sentence: emit it whole, then scan its final period again."""
    return [t], len(t) - 1


def _acronym_end(t: str) -> tuple[list[str], int]:
    """Acronym before a sentence-initial word: "U.S. The" -> "U.S." "." ...; but "I. The" -> "I" "."."""
    if len(t) == 2:
        return [t[0]], 1
    return [t], len(t) - 1


def _const(out: str) -> _Action:
    return lambda t: ([out], len(t))


def _skip(t: str) -> tuple[list[str], int]:
    return [], len(t)


def _newline(t: str) -> tuple[list[str], int]:
    return ["\n"], len(t)


def _other(t: str) -> tuple[list[str], int]:
    """Any other single character: kept as a token unless the Java scanner deletes it."""
    cp = ord(t)
    if cp > 0xFFFF or unicodedata.category(t) in ("Cc", "Cf", "Cs", "Co", "Cn") or 0x2010 <= cp <= 0x2012:
        return [], 1
    return [t], 1


# Each rule: (pattern, action).  The pattern's group "t" is the token text; anything matched after it
# is trailing context, which counts for the longest match but is scanned again.
_RULE_SPECS: list[tuple[str, _Action]] = [
    ("(?P<t>(?i:c\\+\\+|[cf]#))", _emit()),
    ("(?P<t>(?i:cannot|'twas|dunno))", _push_back(3)),
    (f"(?P<t>{_APOS}(?i:tis)|(?i:gonna|gotta|lemme|gimme|wanna))", _push_back(2)),
    (f"(?P<t>{_SGML})", _emit(lambda t: t.replace(" ", "\u00a0"))),
    ("(?P<t>&(?:MD|mdash|ndash);|[\u0096\u0097\u2013\u2014\u2015])", _const("--")),
    ("(?P<t>(?i:&amp;))", _const("&")),
    ("(?P<t>&(?:HT|TL|UR|LR|QC|QL|QR|odq|cdq|#[0-9]+);)", _emit()),
    (f"(?P<t>{_WORD})(?={_REDAUX})(?P<c>{_REDAUX})", _emit(_soft)),
    (f"(?P<t>{_SWORD})(?P<c>{_SREDAUX})", _emit(_soft)),
    (f"(?P<t>{_WORD})", _emit(_soft)),
    *[(f"(?P<t>{p})", _emit()) for p in _APOWORDS],
    (f"(?P<t>(?i:y){_APOS})(?P<c>{_ALPHA})", _emit()),
    (f"(?P<t>{_FULLURL})", _emit()),
    *[(f"(?P<t>{p})", _emit()) for p in _LIKELYURLS],
    (f"(?P<t>{_EMAIL})", _emit()),
    (f"(?P<t>@[a-zA-Z_][a-zA-Z_0-9]*|#{_ALPHA}+)", _emit()),
    (f"(?P<t>{_REDAUX})(?P<c>[^A-Za-z])", _emit(lambda t: _latex_quotes(t, False))),
    (f"(?P<t>{_SREDAUX})", _emit(lambda t: _latex_quotes(t, False))),
    (f"(?P<t>{_DIGIT}{{1,2}}[-/]{_DIGIT}{{1,2}}[-/]{_DIGIT}{{2,4}})", _emit()),
    (f"(?P<t>{_NUMBER})", _emit(_soft)),
    ("(?P<t>[\u207a\u207b\u208a\u208b]?(?:[\u2070\u00b9\u00b2\u00b3\u2074-\u2079]+|[\u2080-\u2089]+))", _emit()),
    (f"(?P<t>{_FRAC})", _emit(lambda t: t.replace(" ", "\u00a0"))),
    ("(?P<t>[\u00bc\u00bd\u00be\u2153-\u215e])", _emit(lambda t: _FRACTIONS.get(t, t))),
    (f"(?P<t>(?i:-(?:rrb|lrb|rcb|lcb|rsb|lsb)-|c\\.d\\.s|pro-|anti-|s(?:&|&amp;)p-500|s(?:&|&amp;)ls"
     f"|cap{_APOS}n|c{_APOS}est))", _emit(_amp)),
    (f"(?P<t>{_THING3})", _emit()),
    ("(?P<t>[A-Z]*\\$|#)", _emit()),
    ("(?P<t>[\u00a2\u00a3\u00a4\u00a5\u0080\u20a0\u20ac\u060b\u0e3f\u20a4\uffe0\uffe1\uffe5\uffe6])",
     _emit(lambda t: t.translate(_CURRENCY))),
    (f"(?P<t>[A-Za-z](?:\\.[A-Za-z])*\\.)(?P<c>{_SPNL}+{_ACRONYM_NEXT}{_SPNL})", _acronym_end),
    (f"(?P<t>{_ABBREV3})(?P<c>{_SPNL}?{_DIGIT})", _emit()),
    (f"(?P<t>{_ABBREV1})(?P<c>{_SENTEND})", _reduplicate),
    (f"(?P<t>{_ABBREV1})(?P<c>[\\s\\S]{{2}})", _emit()),
    (f"(?P<t>{_ABBREV1})", _reduplicate),  # only at the very end of the input
    (f"(?P<t>{_ABBREV4}\\.)", _emit()),
    (f"(?P<t>{_ABBREV4})(?P<c>{_SP})", _emit()),
    (f"(?P<t>{_ACRO})(?P<c>{_SPNL})", _emit()),
    (f"(?P<t>{_APOS}[0-9][0-9])(?P<c>{_SPNL})", _emit()),
    (f"(?P<t>{_FILENAME})(?P<c>{_SPNL}|[.?!,\"'<])", _emit()),
    (f"(?P<t>{_WORD}\\.)(?P<c>{_INSENTP})", _emit(_soft)),
    (f"(?P<t>{_PHONE})", _emit(lambda t: t.replace(" ", "\u00a0").replace("(", "-LRB-").replace(")", "-RRB-"))),
    ('(?P<t>"|&quot;)(?P<c>[A-Za-z0-9$])', _emit(lambda t: _latex_quotes(t, True))),
    ('(?P<t>"|&quot;)', _emit(lambda t: _latex_quotes(t, False))),
    (f"(?P<t>{_SMILEY})(?![A-Za-z0-9])", _emit(lambda t: t.replace("(", "-LRB-").replace(")", "-RRB-"))),
    (f"(?P<t>{_ASIANSMILEY})", _emit(lambda t: t.replace("(", "-LRB-").replace(")", "-RRB-"))),
    ("(?P<t><<|>>)", _emit()),
    ("(?P<t>[+%&\u2030\u2031~^|\\\\<>])", _emit()),
    ("(?P<t>\\[)", _const("-LSB-")),
    ("(?P<t>\\])", _const("-RSB-")),
    ("(?P<t>\\{)", _const("-LCB-")),
    ("(?P<t>\\})", _const("-RCB-")),
    ("(?P<t>\\()", _const("-LRB-")),
    ("(?P<t>\\))", _const("-RRB-")),
    ("(?P<t>-+)", lambda t: (["--" if 3 <= len(t) <= 4 else t], len(t))),
    ("(?P<t>\\.{3,5}|(?:\\.[ \u00a0]){2,4}\\.|[\u0085\u2026])", _const("...")),
    ("(?P<t>@+|#+|_+)", _emit()),
    ("(?P<t>\\*+|(?:\\\\\\*){1,3})", _emit()),
    (f"(?P<t>{_INSENTP})", _emit()),
    ("(?P<t>[?!]+)", _emit()),
    ("(?P<t>[.\u00a1\u00bf\u037e\u0589\u061f\u06d4\u0700-\u0702\u07fa])", _emit()),
    ("(?P<t>=)", _emit()),
    ("(?P<t>/)", _emit()),
    (f"(?P<t>{_HTHING}\\.)(?P<c>{_INSENTP})", _emit(_soft)),
    (f"(?P<t>{_HTHING})", _emit(_soft)),
    (f"(?P<t>{_THING}\\.)(?P<c>{_INSENTP})", _emit()),
    (f"(?P<t>{_THING})", _emit()),
    (f"(?P<t>{_THINGA}\\.)(?P<c>{_INSENTP})", _emit(_amp)),
    (f"(?P<t>{_THINGA})", _emit(_amp)),
    ("(?P<t>')(?P<c>[A-Za-z][^ \t\n\r\u00a0])", _emit(lambda t: _latex_quotes(t, True))),
    (f"(?P<t>{_REDAUX})", _emit(lambda t: _latex_quotes(t, False))),
    (f"(?P<t>''|[`\u2018\u2019\u201a\u201b\u201c\u201d\u0091\u0092\u0093\u0094\u201e\u201f\u2039\u203a"
     f"\u00ab\u00bb]{{1,2}}|{_APOS})", _emit(lambda t: _latex_quotes(t, False))),
    (f"(?P<t>\x00|{_SP}+|[\u200b\u200e\u200f\ufeff])", _skip),
    (f"(?P<t>{_NL})", _newline),
    ("(?P<t>&nbsp;)", _skip),
    ("(?P<t>[\\s\\S])", _other),
]

_RULES: list[tuple[re.Pattern[str], _Action]] = [(re.compile(p), a) for p, a in _RULE_SPECS]

# Fast path: a run of ASCII letters followed by " ", "\t" or a line end can only be scanned as that
# one word (no rule that can match longer starts with letters and crosses such a space; e-mail and URL
# rules can cross a no-break space) - except the assimilations split by the first rules.
_PLAIN = re.compile("[A-Za-z]+(?=[ \t\n]|$)")
_ASSIMILATED = frozenset({"cannot", "dunno", "gonna", "gotta", "lemme", "gimme", "wanna"})
_SPACES = re.compile(f"{_SP}+")
# No rule other than the space rule can start with " " or "\t" (some can start with other spaces).
_SPACE_STARTS = frozenset(" \t")


def _scan(text: str) -> list[list[str]]:
    """Tokens of each line of `text`, as the Java PTBTokenizer scans it (before lower-casing)."""
    lines: list[list[str]] = [[]]
    pos, n = 0, len(text)
    while pos < n:
        if text[pos] in _SPACE_STARTS:
            pos = _SPACES.match(text, pos).end()  # type: ignore[union-attr]
            continue
        m = _PLAIN.match(text, pos)
        if m and m.group().lower() not in _ASSIMILATED:
            lines[-1].append(m.group())
            pos = m.end()
            continue
        best_len, best = -1, None
        for rx, action in _RULES:
            m = rx.match(text, pos)
            if m is not None and m.end() - pos > best_len:
                best_len, best = m.end() - pos, (m.group("t"), action)
        assert best is not None  # the last rule matches any character
        tokens, consumed = best[1](best[0])
        pos += consumed
        for tok in tokens:
            if tok == "\n":
                lines.append([])
            else:
                lines[-1].append(tok)
    return lines


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
        out[key].append(strip_punctuation(" ".join(tok.lower() for tok in toks)))
    return out


def _main(argv: Sequence[str]) -> None:  # pragma: no cover - debugging helper
    """Tokenize stdin (one caption per line) and print the result, for comparisons with Java."""
    caps = [line.rstrip("\n") for line in sys.stdin]
    res = ptb_tokenize({i: [c] for i, c in enumerate(caps)})
    for i in range(len(caps)):
        sys.stdout.write(res[i][0] + "\n")


if __name__ == "__main__":  # pragma: no cover
    _main(sys.argv[1:])
