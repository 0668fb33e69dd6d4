"""Constraints on an argument, written once where the argument is declared: `Annotated[int, Range(ge=1)]`.

A component's signature is the one copy of what its arguments may be: the type, the choices (`Literal`), the
constraint (`Range`, `Pattern`, `OneOf`) and, for library callers, a default (a config always passes the YAML's
value; conf/ is the only place a config default lives). For example, in captioning/models/attention.py:

    @constrained
    def __init__(self, annotation_dim: int, hidden_dim: int, attention_dim: Annotated[int, Range(ge=1)] = 512):

Two readers use the same annotations:

* `@constrained` checks, at every call, the constraints and `Literal` choices of the arguments given, before the
  body runs, and raises a ValueError naming the parameter (`SoftAttention: attention_dim=0: must be >= 1`);
* the config validator binds a config group's keys to the signature without calling anything
  (captioning/base/signature.py `argument_problems`), so the same check fails before any work starts, with the
  config key named (`attention.attention_dim=0: must be >= 1`).

`File()` declares that an argument names a file the function reads. It is not checked at the call (the function
opens the file and reports a missing one in its own words); the validator checks that it exists before any work
starts (captioning/config/schema.py, the dataset rules).

Importable without torch or Hydra (the data readers and the models import it).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import operator
import re
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired, Required, TypeVar, Union

Problem = tuple[str, str]  # (key, what is wrong); a message starting with '=' follows the key directly
_BOUNDS = (("gt", operator.gt, ">"), ("ge", operator.ge, ">="), ("lt", operator.lt, "<"), ("le", operator.le, "<="))


class Constraint:
    """A check on one value beyond its type; `problem` ignores values of types it does not apply to."""

    def problem(self, v: Any) -> str | None:
        """What is wrong with `v`, or None."""
        raise NotImplementedError


@dataclass(frozen=True)
class Range(Constraint):
    """Bounds on a number (on each item of a list of numbers)."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def problem(self, v: Any) -> str | None:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            for name, holds, symbol in _BOUNDS:
                bound = getattr(self, name)
                if bound is not None and not holds(v, bound):  # NaN fails every bound
                    return f"must be {symbol} {bound:g}"
        return None


@dataclass(frozen=True)
class Pattern(Constraint):
    """A string matching a regular expression; `expect` says it in words."""

    regex: str
    expect: str

    def problem(self, v: Any) -> str | None:
        return f"must be {self.expect}" if isinstance(v, str) and not re.fullmatch(self.regex, v) else None


class OneOf(Constraint):
    """A string among `choices` (case-insensitive with `ignore_case`), e.g. a narrower set than a class's Literal."""

    def __init__(self, *choices: str, ignore_case: bool = False):
        self.choices, self.ignore_case = choices, ignore_case

    def problem(self, v: Any) -> str | None:
        if not isinstance(v, str) or (v.lower() if self.ignore_case else v) in self.choices:
            return None
        return f"must be {self.choices[0]!r}" if len(self.choices) == 1 else choose_one(v, self.choices)


@dataclass(frozen=True)
class File:
    """Declares an argument that names a file the function reads (checked to exist before work, not at the call)."""


def choose_one(value: str, choices: Sequence[str]) -> str:
    """'choose one of a, b, c (did you mean 'b'?)', matching case-insensitively."""
    return f"choose one of {', '.join(choices)}{did_you_mean(value, choices)}"


def did_you_mean(value: str, choices: Sequence[str]) -> str:
    """' (did you mean 'x'?)' for the choice closest to `value` (case-insensitive), or '' when none is close."""
    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(value.lower(), list(lowered), n=1, cutoff=0.6)
    return f" (did you mean {lowered[close[0]]!r}?)" if close else ""


# The shared aliases: a signature says what kind of number it takes, once, and every component uses the same words.
Size = Annotated[int, Range(ge=1)]  # a layer width, a count of layers, heads or filters
Count = Annotated[int, Range(ge=0)]  # how many (0 allowed)
Weight = Annotated[float, Range(ge=0)]  # a loss weight
Probability = Annotated[float, Range(ge=0, le=1)]
DropoutRate = Annotated[float, Range(ge=0, lt=1)]
MAX_IMAGE_SIDE = 2048  # pixels: an image size a config or a checkpoint may ask an encoder or generator for
ImageSide = Annotated[int, Range(ge=1, le=MAX_IMAGE_SIDE)]

# -- types ---------------------------------------------------------------------------------------------
def split_annotated(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    """The plain type and the metadata of `Annotated[T, ...]` (also under Required/NotRequired)."""
    meta: tuple[Any, ...] = ()
    while typing.get_origin(tp) in (Annotated, Required, NotRequired):
        if typing.get_origin(tp) is Annotated:
            meta += tp.__metadata__
            tp = tp.__origin__
        else:
            (tp,) = typing.get_args(tp)
    return tp, meta


def _is_sequence(tp: Any) -> bool:
    return tp in (list, tuple) or typing.get_origin(tp) in (list, tuple, Sequence)


def matches(value: Any, expected: Any) -> bool:
    """Whether plain data `value` fits the annotation `expected` (bool, int, float, str, Literal, unions, sequences)."""
    expected = split_annotated(expected)[0]
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if expected is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(matches(value, a) for a in args)
    if expected is None or expected is type(None):
        return value is None
    if origin is Literal:
        return any(type(value) is type(a) and value == a for a in args)
    if expected in (bool, str):
        return isinstance(value, expected)
    if expected in (int, float):
        return isinstance(value, (int, float) if expected is float else int) and not isinstance(value, bool)
    if _is_sequence(expected):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return len(value) == len(args) and all(matches(v, a) for v, a in zip(value, args))
        return all(matches(v, args[0]) for v in value) if args else True
    return False  # callables, modules, tensors...: never from a config


_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", type(None): "null"}
_OTHER = "a value of another kind"


def describe(tp: Any) -> str:
    """An annotation in words, leaving out what a config cannot hold ('float | Tensor' -> 'a number')."""
    tp = split_annotated(tp)[0]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        words = [describe(a) for a in args if a in _NAMES or typing.get_origin(a) in (Literal, list, tuple)]
        return " or ".join(dict.fromkeys(words)) or _OTHER
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if _is_sequence(tp):
        item = describe(args[0]) if args else _OTHER
        return "a list" if item == _OTHER else f"a list of {item.removeprefix('a ').removeprefix('an ')}s"
    return _NAMES.get(tp, _OTHER)


def value_problems(v: Any, tp: Any, key: str, checks: Sequence[Constraint] = (),
                   types_too: bool = True) -> Iterator[Problem]:
    """Problems of one value against its annotation: type (unless `types_too` is False), Literal choices, constraints
    (those of `Annotated` and `checks`). List items are reported as key[i]."""
    tp, meta = split_annotated(tp)
    checks = (*checks, *(m for m in meta if isinstance(m, Constraint)))
    if isinstance(v, str) and v == "???":
        yield key, f"missing value (???); set it on the command line: {key}=..."
        return
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if v is None and type(None) in args:
            return
        fitting = next((a for a in args if a is not type(None) and matches(v, a)), None)
        if fitting is None:
            if types_too:
                yield key, f"={v!r}: must be {describe(tp)}"
                return
            fitting = Any
        yield from value_problems(v, fitting, key, checks, types_too)
    elif origin is Literal and not matches(v, tp):
        choices = [str(a) for a in args]
        yield key, f"={v!r}: " + (f"must be {args[0]!r}" if len(args) == 1 else choose_one(str(v), choices))
    elif _is_sequence(tp) and isinstance(v, (list, tuple)):
        items = args if origin is tuple and args and args[-1] is not Ellipsis else (args[:1] or (Any,)) * len(v)
        if types_too and len(items) != len(v):
            yield key, f"={v!r}: must be {len(items)} values ({describe(tp)})"
            return
        for i, (item, item_tp) in enumerate(zip(v, items)):
            yield from value_problems(item, item_tp, f"{key}[{i}]", checks, types_too)
    elif types_too and not matches(v, tp):
        yield key, f"={v!r}: must be {describe(tp)}"
    else:
        msg = next((m for c in checks if (m := c.problem(v))), None)
        if msg:
            yield key, f"={v!r}: {msg}"


# -- at the call ---------------------------------------------------------------------------------------
F = TypeVar("F", bound=Callable[..., Any])


def constrained(fn: F) -> F:
    """Check the `Literal` choices and `Annotated` constraints of the arguments `fn` is called with, before it runs.

    Raises ValueError naming the owner and the parameter, e.g. `SoftAttention: attention_dim=0: must be >= 1`.
    Types are not checked here (a caller may pass a Path or a NumPy integer); the config validator checks those.
    """
    signature = inspect.signature(fn)
    owner = fn.__qualname__.removesuffix(".__init__")
    hints: dict[str, Any] | None = None

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal hints
        if hints is None:  # resolved at the first call: an annotation may name a class defined after `fn`
            hints = {n: tp for n, tp in typing.get_type_hints(fn, include_extras=True).items() if _has_checks(tp)}
        for name, value in signature.bind(*args, **kwargs).arguments.items():
            if name in hints:
                for key, msg in value_problems(value, hints[name], name, types_too=False):
                    raise ValueError(f"{owner}: {key}{msg}")
        return fn(*args, **kwargs)

    return typing.cast(F, call)


def _has_checks(tp: Any) -> bool:
    """Whether an annotation carries a constraint or Literal choices (anywhere inside it)."""
    tp, meta = split_annotated(tp)
    return any(isinstance(m, Constraint) for m in meta) or typing.get_origin(tp) is Literal or any(
        _has_checks(a) for a in typing.get_args(tp) if a is not Ellipsis and not isinstance(a, (str, int, float)))


def check_decoding(beam_size: int, max_len: int, length_penalty: float = 0.0) -> None:
    """Refuse decoding settings that cannot decode anything (the torch and the exported searches share this)."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if length_penalty < 0:
        raise ValueError(f"length_penalty must be >= 0 (0 ranks by raw log-probability), got {length_penalty}")
