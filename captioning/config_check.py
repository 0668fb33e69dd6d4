"""The engine that checks a config against schema dataclasses (what it may contain is in captioning/schema.py).

`validate(cfg, schema)` resolves interpolations, then walks the values and the dataclass together: required keys,
types (bool, int, float, str, `X | None`, `Literal`, `list[X]`, nested dataclasses), the value constraints of
`checked(...)` fields, unknown keys with a did-you-mean, and each dataclass's cross-key `rules`. Every problem is
collected, then raised at once as one `ConfigError` naming each full key.

What a schema dataclass may declare for the walk:

* a `_target_` field, on a base class whose subclasses each default it to one class: the value's `_target_` picks
  the subclass (`registry`); a base with no such subclasses checks `_target_` like any fixed value;
* `extra_keys() -> set[str]` (a classmethod): keys accepted as they are, without a type;
* `rules(values) -> Iterator[Problem]` (a staticmethod): cross-key checks, keys relative to the group;
* `empty_is_none = True` (a ClassVar): an empty group (`{}` or null) stands for no group at all.
"""

from __future__ import annotations

import dataclasses
import difflib
import operator
import re
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

Problem = tuple[str, str]  # (full key, what is wrong)


class ConfigError(ValueError):
    """An invalid configuration; the message lists every problem with its full key."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = [f"{key}{msg}" if msg.startswith("=") else f"{key}: {msg}" for key, msg in problems]
        super().__init__(f"invalid configuration ({len(problems)} problem{'s' * (len(problems) > 1)}):\n  "
                         + "\n  ".join(lines))


_BOUNDS = (("gt", operator.gt, ">"), ("ge", operator.ge, ">="), ("lt", operator.lt, "<"), ("le", operator.le, "<="))


@dataclass(frozen=True)
class Check:
    """A constraint on one value: bounds, a regular expression, or case-insensitive choices."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    pattern: str | None = None
    expect: str = ""  # the pattern in words, for the message
    choices: tuple[str, ...] = ()

    def __call__(self, v: Any) -> str | None:
        """What is wrong with `v`, or None."""
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            for name, holds, symbol in _BOUNDS:
                bound = getattr(self, name)
                if bound is not None and not holds(v, bound):  # NaN fails every bound
                    return f"must be {symbol} {bound:g}"
        if isinstance(v, str) and self.pattern and not re.fullmatch(self.pattern, v):
            return f"must be {self.expect or self.pattern}"
        if isinstance(v, str) and self.choices and v.lower() not in self.choices:
            return choose_one(v, self.choices)
        return None


def checked(default: Any = dataclasses.MISSING, **check: Any) -> Any:
    """A dataclass field with a value constraint (`Check` keyword arguments); no default means required.

    List defaults are wrapped in a factory (dataclasses refuse mutable defaults).
    """
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"check": Check(**check)})
    return field(default=default, metadata={"check": Check(**check)})


def choose_one(value: str, choices: tuple[str, ...] | list[str]) -> str:
    """'choose one of a, b, c (did you mean 'b'?)', matching case-insensitively."""
    return f"choose one of {', '.join(choices)}{did_you_mean(value, choices)}"


def did_you_mean(value: str, choices: tuple[str, ...] | list[str]) -> str:
    """' (did you mean 'x'?)' for the choice closest to `value` (case-insensitive), or '' when none is close."""
    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(value.lower(), list(lowered), n=1, cutoff=0.6)
    return f" (did you mean {lowered[close[0]]!r}?)" if close else ""


# -- the walk ----------------------------------------------------------------------------------------
def validate(cfg: DictConfig | Mapping[str, Any], schema: type) -> None:
    """Resolve interpolations, then check every key against the schema dataclass; raises ConfigError."""
    cfg = OmegaConf.create(cfg) if not isinstance(cfg, DictConfig) else cfg
    if "hydra" in cfg:  # present only when composed with return_hydra_config; not the app's config
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    try:
        values = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as err:
        raise ConfigError([(str(getattr(err, "full_key", "") or "config"), f"cannot resolve: {err}")]) from err
    problems = list(_check(values, schema, ""))
    if problems:
        raise ConfigError(problems)


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def registry(base: type) -> dict[str, type]:
    """Concrete schemas below `base`, by the `_target_` they accept."""
    out, todo = {}, list(base.__subclasses__())
    while todo:  # breadth first: the order of the messages' choices follows the definitions in the schema
        cls = todo.pop(0)
        todo += cls.__subclasses__()
        default = next(f.default for f in dataclasses.fields(cls) if f.name == "_target_")
        if isinstance(default, str):
            out[default] = cls
    return out


def _choose(v: dict, base: type, key: str) -> type | Problem:
    """The schema for a group that picks its class by `_target_`, or what is wrong."""
    targets = registry(base)
    if not targets:  # a fixed class (e.g. the decoder): `_target_` is checked like any Literal field
        return base
    target = v.get("_target_")
    short = {t.rsplit(".", 1)[-1]: t for t in targets}
    if target in targets:
        return targets[target]
    if target is None:
        return key, f"no _target_; choose one of {', '.join(short)}"
    return key, (f"unknown type {target!r}; {choose_one(str(target).rsplit('.', 1)[-1], list(short))} "
                 "(a new class needs its dataclass in captioning/schema.py)")


def _check(v: Any, schema: type, key: str) -> Iterator[Problem]:
    """Problems of one group (a dict) against its schema dataclass."""
    chosen = _choose(v, schema, key)
    if isinstance(chosen, tuple):
        yield chosen
        return
    hints = typing.get_type_hints(chosen)
    fields = {f.name: f for f in dataclasses.fields(chosen)}
    problems: list[Problem] = []
    for name, f in fields.items():
        if name not in v:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                problems.append((_join(key, name), "missing; this key is required"))
            continue
        if name == "_target_" and chosen is not schema:
            continue  # already matched by _choose
        if name == "_target_":
            if v[name] != f.default:
                problems.append((_join(key, name), f"={v[name]!r}: must be {f.default!r}"))
            continue
        problems += _check_value(v[name], hints[name], _join(key, name), f.metadata.get("check"))
    extra = chosen.extra_keys() if hasattr(chosen, "extra_keys") else set()
    for name in v:
        if name not in fields and name not in extra:
            allowed = sorted(set(fields) | extra)
            hint = did_you_mean(name, allowed) or f" (allowed: {', '.join(allowed)})"
            problems.append((_join(key, name), f"unknown key{hint}"))
    if hasattr(chosen, "rules"):  # cross-key rules (paths); they skip values of the wrong type
        problems += [(_join(key, k), msg) for k, msg in chosen.rules(v)]
    yield from problems


_SCALARS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _check_value(v: Any, tp: Any, key: str, check: Check | None) -> Iterator[Problem]:
    """Problems of one value against its annotated type and constraint."""
    if v == "???":
        yield key, f"missing value (???); set it on the command line: {key}=..."
        return
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if v is None and type(None) in args:
            return
        (tp,) = [a for a in args if a is not type(None)]  # the schema uses unions only as `X | None`
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return
    if dataclasses.is_dataclass(tp):
        if v in (None, {}) and getattr(tp, "empty_is_none", False):
            return
        if not isinstance(v, dict):
            yield key, f"={v!r}: must be a group of keys ({tp.__name__})"
            return
        yield from _check(v, tp, key)
    elif origin is Literal:
        if v not in args or isinstance(v, bool) != isinstance(args[0], bool):
            choices = [str(a) for a in args]
            yield key, f"={v!r}: " + (f"must be {args[0]!r}" if len(args) == 1 else choose_one(str(v), choices))
    elif origin is list:
        if not isinstance(v, list):
            yield key, f"={v!r}: must be a list"
            return
        for i, item in enumerate(v):
            yield from _check_value(item, args[0], f"{key}[{i}]", check)
    elif not _is_instance(v, tp):
        yield key, f"={v!r}: must be {_SCALARS.get(tp, tp)}"
    elif check is not None and (msg := check(v)):
        yield key, f"={v!r}: {msg}"


def _is_instance(v: Any, tp: type) -> bool:
    if tp is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if tp is int:
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, tp)
