"""The rules of coco-caption's PTB tokenizer (CoreNLP 3.4.1's ``PTBLexer``) as Python regular expressions.

:data:`RULES` lists the JFlex scanner's rules that matter for English captions, in the grammar's order,
each as a compiled pattern and an action; :mod:`captioning.metrics.tokenizer` runs them with JFlex's
longest-match discipline and documents what they reproduce.  The rules mirror the macros of CoreNLP's
``PTBLexer.flex`` as they behave in version 3.4.1 (reconstructed from the grammar's published versions
and by probing the jar).  A rule's pattern has a group ``t``, the token text; whatever it matches after
that group is trailing context, which counts for the longest match but is scanned again.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from captioning.metrics.ptb_chars import ALNUM, ALPHA, DELETED, DIGIT, JALPHA

__all__ = ["RULES", "Action", "SPACE"]

# ------------------------------------------------------------------------------------------------
# Macros (the character classes: ptb_chars.py)
# ------------------------------------------------------------------------------------------------
_SP = "[ \t\u00a0\u2000-\u200a\u3000]"       # spaces
SPACE = _SP  # one space character, as the scanner sees it
_NL = "(?:\r\n?|[\n\u2028\u2029\u000b\u000c])"  # line breaks (only "\n" survives clean_caption)
_SPNL = f"(?:{_SP}|{_NL})"
_APOS = "(?:['\u0092\u2019]|&apos;)"
_APOSETC = "(?:['\u0092\u2019`\u0091\u2018\u201b]|&apos;)"
_SPLET = "&[aeiouAEIOU](?i:acute|grave|uml);"
_LETTER = f"(?:{ALPHA}|{_SPLET})"
_WORD = f"{_LETTER}(?:{_LETTER}|{DIGIT})*(?:[.!?]{_LETTER}(?:{_LETTER}|{DIGIT})*)*"
_REDAUX = f"{_APOS}(?:[msdMSD]|(?i:re|ve|ll))"
_SWORD = "[A-Za-z\u00ad]*[A-MO-Za-mo-z]\u00ad*"
_SREDAUX = f"(?i:n){_APOSETC}(?i:t)"
_NUMSEP = "[.:,\u00ad\u066b\u066c]"
# (Python alternation is ordered, not longest-match: every pattern lists its longer alternatives first.)
_NUM = f"(?:{DIGIT}+(?:{_NUMSEP}{DIGIT}+)*|(?:{_NUMSEP}{DIGIT}+)+)"
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
             f"[A-HJ-XZn]{_APOSETC}{JALPHA}{{2,}}", f"{_APOS}[2-9]0(?i:s)", f"{_APOS}(?i:till?)",
             f"{JALPHA}+[aeiouyAEIOUY]{_APOSETC}[aeiouA-Z]{JALPHA}*", f"{_APOS}(?i:cause)",
             "(?i:cont'd\\.?|nor'easter|c'mon|e'er|s'mores|ev'ry|li'l|nat'l)", f"(?i:o){_APOSETC}(?i:o)")
_FILENAME = (f"{ALNUM}+(?:\\.{ALNUM}+)*\\.(?i:bat|bmp|bz2|c|class|cgi|cpp|dll|doc|docx|exe|gif|gz|h|htm"
             "|html|jar|java|jpeg|jpg|mov|mp3|pdf|php|pl|png|ppt|ps|py|sql|tar|txt|wav|x|xml|zip|3gp|wm[va]|avi"
             "|flv|mp[34g])")
_FULLURL = "(?i:https?)://[^ \t\n\f\r\"<>|(){}]+[^ \t\n\f\r\"<>|.!?(){},-]"
_URLPATH = "(?:/[^ \t\n\f\r\"<>|()]+[^ \t\n\f\r\"<>|.!?(){},-])?"
_LIKELYURLS = (f"(?i:www)\\.(?:[^ \t\n\f\r\"<>|.!?(){{}},]+\\.)+[a-zA-Z]{{2,4}}{_URLPATH}",
               # ",-_" is a character range in the original pattern, kept as such
               f"(?:[^ \t\n\f\r\"`'<>|.!?(){{}},-_$]+\\.)+(?i:com|net|org|edu){_URLPATH}")
_SMILEY = "[<>]?[:;=][-o*']?[()DPdpO\\\\{@|\\[\\]]"
_ASIANSMILEY = ("[-^x=~<>']_[-^x=~<>']|\\([-^x=~<>'][_.]?[-^x=~<>']\\)|\\([\\^x=~<>']-[\\^x=~<>'`]\\)")
_EMAIL = ("(?:&lt;|<)?[a-zA-Z0-9][^ \t\n\f\r\"<>|(){}\u00a0]*@"
          "(?:[^ \t\n\f\r\"<>|(){}.\u00a0]+\\.)*[^ \t\n\f\r\"<>|(){}.\u00a0]+(?:&gt;|>)?")
_PHONE = ("(?:\\([0-9]{2,3}\\)[ \u00a0]?|(?:\\+\\+?)?(?:[0-9]{2,4}[- \u00a0])?[0-9]{2,4}[- \u00a0])"
          "[0-9]{3,4}[- \u00a0]?[0-9]{3,5}"
          "|(?:(?:\\+\\+?)?[0-9]{2,4}\\.)?[0-9]{2,4}\\.[0-9]{3,4}\\.[0-9]{3,5}")
_FRAC = f"(?:{DIGIT}{{1,4}}[- \u00a0])?{DIGIT}{{1,4}}(?:\\\\?/|\u2044){DIGIT}{{1,4}}"
_THING = (f"(?:[dDoOlL]{_APOSETC}{ALNUM})?{ALNUM}+"
          f"(?:{_HYPHEN}(?:[dDoOlL]{_APOSETC}{ALNUM})?{ALNUM}+)*")
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


Action = Callable[[str], tuple[list[str], int]]


def _emit(norm: Callable[[str], str] = lambda t: t) -> Action:
    return lambda t: ([norm(t)], len(t))


def _push_back(n: int) -> Action:
    """Emit all but the last `n` characters and scan those again (JFlex's ``yypushback``)."""
    return lambda t: ([t[:-n]], len(t) - n)


def _reduplicate(t: str) -> tuple[list[str], int]:
    """Abbreviation ending a sentence: emit it whole, then scan its final period again."""
    return [t], len(t) - 1


def _acronym_end(t: str) -> tuple[list[str], int]:
    """Acronym before a sentence-initial word: "U.S. The" -> "U.S." "." ...; but "I. The" -> "I" "."."""
    if len(t) == 2:
        return [t[0]], 1
    return [t], len(t) - 1


def _const(out: str) -> Action:
    return lambda t: ([out], len(t))


def _skip(t: str) -> tuple[list[str], int]:
    return [], len(t)


def _newline(t: str) -> tuple[list[str], int]:
    return ["\n"], len(t)


def _other(t: str) -> tuple[list[str], int]:
    """Any other single character: kept as a token unless the Java scanner deletes it."""
    if ord(t) > 0xFFFF or DELETED.match(t):
        return [], 1
    return [t], 1


# Each rule: (pattern, action).  The pattern's group "t" is the token text; anything matched after it
# is trailing context, which counts for the longest match but is scanned again.
_RULE_SPECS: list[tuple[str, Action]] = [
    ("(?P<t>(?i:c\\+\\+|[cf]#))", _emit()),
    ("(?P<t>(?i:cannot|'twas))", _push_back(3)),
    (f"(?P<t>{_APOS}(?i:tis)|(?i:gonna|gotta|lemme|gimme|wanna))", _push_back(2)),
    (f"(?P<t>{_SGML})", _emit(lambda t: t.replace(" ", "\u00a0"))),
    ("(?P<t>&(?:MD|mdash|ndash);|[\u0096\u0097\u2013\u2014\u2015])", _const("--")),
    ("(?P<t>(?i:&amp;))", _const("&")),
    ("(?P<t>&(?:HT|TL|UR|LR|QC|QL|QR|odq|cdq|#[0-9]+);)", _emit()),
    (f"(?P<t>{_WORD})(?={_REDAUX})(?P<c>{_REDAUX})", _emit(_soft)),
    (f"(?P<t>{_SWORD})(?P<c>{_SREDAUX})", _emit(_soft)),
    (f"(?P<t>{_WORD})", _emit(lambda t: _soft(t) or "-")),  # a lone soft hyphen comes out as "-"
    *[(f"(?P<t>{p})", _emit()) for p in _APOWORDS],
    (f"(?P<t>(?i:y){_APOS})(?P<c>{JALPHA})", _emit()),
    (f"(?P<t>{_FULLURL})", _emit()),
    *[(f"(?P<t>{p})", _emit()) for p in _LIKELYURLS],
    (f"(?P<t>{_EMAIL})", _emit()),
    (f"(?P<t>@[a-zA-Z_][a-zA-Z_0-9]*|#{ALPHA}+)", _emit()),
    (f"(?P<t>{_REDAUX})(?P<c>[^A-Za-z])", _emit(lambda t: _latex_quotes(t, False))),
    (f"(?P<t>{_SREDAUX})", _emit(lambda t: _latex_quotes(t, False))),
    (f"(?P<t>{DIGIT}{{1,2}}[-/]{DIGIT}{{1,2}}[-/]{DIGIT}{{2,4}})", _emit()),
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
    (f"(?P<t>{_ABBREV3})(?P<c>{_SPNL}?{DIGIT})", _emit()),
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

RULES: list[tuple[re.Pattern[str], Action]] = [(re.compile(p), a) for p, a in _RULE_SPECS]
