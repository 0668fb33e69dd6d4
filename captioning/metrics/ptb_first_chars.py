"""Which of the PTB tokenizer's rules can start with a given character: the scanner (tokenizer.py) tries only
those at each position, found once per character from each rule's regular expression, read by Python's own
parser."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from typing import Any

from captioning.metrics.ptb_rules import RULES, Action

# The regular-expression parser (private modules, untyped), to find the characters each rule can start with.
_sre: Any = importlib.import_module("re._constants")
_sre_parse: Any = importlib.import_module("re._parser")

__all__ = ["RULES_BY_FIRST_CHAR"]


class _AnyStart(Exception):
    """A pattern construct this analysis does not model: assume the rule can start anywhere."""


_CATEGORIES = {_sre.CATEGORY_DIGIT: r"\d", _sre.CATEGORY_NOT_DIGIT: r"\D", _sre.CATEGORY_SPACE: r"\s",
               _sre.CATEGORY_NOT_SPACE: r"\S", _sre.CATEGORY_WORD: r"\w", _sre.CATEGORY_NOT_WORD: r"\W"}
_REPEATS = tuple(getattr(_sre, name) for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
                 if hasattr(_sre, name))  # possessive repeats: Python 3.11+
_ZERO_WIDTH = (_sre.AT, _sre.ASSERT, _sre.ASSERT_NOT)


def _char(code: int) -> str:
    return re.escape(chr(code))


def _first_of_sequence(items: Iterable[tuple[object, object]], flags: int) -> tuple[list[str], bool]:
    """(patterns matching the possible first characters, whether the sequence can match nothing)."""
    firsts: list[str] = []
    for op, arg in items:
        more, empty = _first_of_item(op, arg, flags)
        firsts += more
        if not empty:
            return firsts, False
    return firsts, True


def _first_of_item(op: object, arg: Any, flags: int) -> tuple[list[str], bool]:
    """:func:`_first_of_sequence` for one parsed item; one-character patterns keep the item's flags."""
    case = "(?i:{})" if flags & re.IGNORECASE else "{}"
    if op is _sre.LITERAL:
        return [case.format(_char(arg))], False
    if op is _sre.NOT_LITERAL:
        return [case.format(f"[^{_char(arg)}]")], False
    if op is _sre.ANY:
        return [r"[\s\S]"], False
    if op is _sre.IN:
        body: list[str] = []
        for kind, value in arg:
            if kind is _sre.NEGATE:
                body.insert(0, "^")
            elif kind is _sre.LITERAL:
                body.append(_char(value))
            elif kind is _sre.RANGE:
                body.append(f"{_char(value[0])}-{_char(value[1])}")
            elif kind is _sre.CATEGORY and value in _CATEGORIES:
                body.append(_CATEGORIES[value])
            else:
                raise _AnyStart(kind)
        return [case.format("[" + "".join(body) + "]")], False
    if op is _sre.BRANCH:
        firsts: list[str] = []
        empty = False
        for branch in arg[1]:
            more, branch_empty = _first_of_sequence(branch, flags)
            firsts, empty = firsts + more, empty or branch_empty
        return firsts, empty
    if op is _sre.SUBPATTERN:
        _, add_flags, del_flags, sub = arg
        return _first_of_sequence(sub, (flags | add_flags) & ~del_flags)
    if op in _REPEATS:
        low, _, sub = arg
        firsts, empty = _first_of_sequence(sub, flags)
        return firsts, empty or low == 0
    if op in _ZERO_WIDTH:  # look-arounds only narrow the match: ignoring them keeps a superset
        return [], True
    raise _AnyStart(op)


def _first_chars(pattern: re.Pattern[str]) -> re.Pattern[str] | None:
    """A pattern for the characters a match of `pattern` can start with; None: any (or empty) start."""
    try:
        parsed = _sre_parse.parse(pattern.pattern, pattern.flags)
        firsts, empty = _first_of_sequence(parsed, parsed.state.flags)
    except _AnyStart:
        return None
    return None if empty or not firsts else re.compile("|".join(firsts))


_FIRST_CHARS = [_first_chars(rx) for rx, _ in RULES]


class _RulesByFirstChar(dict[str, tuple[tuple[re.Pattern[str], Action], ...]]):
    """character -> the rules (in grammar order) whose match can begin with it; filled on first use."""

    def __missing__(self, ch: str) -> tuple[tuple[re.Pattern[str], Action], ...]:
        rules = tuple(rule for rule, first in zip(RULES, _FIRST_CHARS) if first is None or first.match(ch))
        self[ch] = rules
        return rules


RULES_BY_FIRST_CHAR = _RulesByFirstChar()
