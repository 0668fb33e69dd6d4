"""A `_target_` group's keys bound to its target's signature without calling it: one checker, configs and checkpoints.

`argument_problems(fn, kwargs)` reads `fn`'s signature (`inspect.signature`, annotations with their `Annotated`
constraints, captioning/base/constraints.py) and returns every problem of `kwargs` at once:

* a Hydra instantiation key (`_args_`, `_partial_`...) or an argument the builder passes itself (`reserved`);
* an unknown key, with a did-you-mean among the arguments `fn` takes;
* a value of the wrong type, outside its `Literal` choices (did you mean) or its constraints;
* a required argument (no default) that is missing.

The config validator (captioning/config/targets.py) reports them as config problems; the component registry
(captioning/factory/registry.py `check_arguments`) raises the first as a ModelSpecError when it checks a checkpoint.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from captioning.base.constraints import Constraint, File, did_you_mean, split_annotated, value_problems


@dataclass(frozen=True)
class ArgumentProblem:
    """One problem of a group's keys: the key (an argument, `name[i]` for a list item, '' for the group), its kind
    (hydra, reserved, unknown, value or missing) and the validator's words for it."""

    key: str
    kind: str
    message: str


def callable_of(fn: Callable[..., Any]) -> Callable[..., Any]:
    """What a call of `fn` runs: a class's `__init__`, or `fn` itself."""
    return fn.__init__ if isinstance(fn, type) else fn  # type: ignore[misc]


def parameters(fn: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    """The named parameters of `fn` (a class: of its constructor), without `self`, *args and **kwargs."""
    return {n: p for n, p in inspect.signature(callable_of(fn)).parameters.items()
            if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def owner_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", str(fn))


def argument_problems(fn: Callable[..., Any], kwargs: Mapping[str, Any], reserved: Sequence[str] = (),
                      policy: Mapping[str, Constraint] | None = None) -> list[ArgumentProblem]:
    """Every problem of `kwargs` as arguments of `fn`; `policy` adds constraints by name (for classes we don't own)."""
    params, name = parameters(fn), owner_name(fn)
    hints = typing.get_type_hints(callable_of(fn), include_extras=True)
    known = [n for n in params if n not in reserved]
    out: list[ArgumentProblem] = []
    for key, value in kwargs.items():
        if not isinstance(key, str) or key.startswith("_"):
            out.append(ArgumentProblem(str(key), "hydra", f"not an argument of {name} (a Hydra instantiation key)"))
        elif key in reserved:
            out.append(ArgumentProblem(key, "reserved", f"set by the code that builds {name}, not by a config"))
        elif key not in params:
            hint = did_you_mean(key, known) or f" (allowed: {', '.join(known)})"
            out.append(ArgumentProblem(key, "unknown", f"unknown key{hint}"))
        else:
            checks = [policy[key]] if policy and key in policy else []
            problems = value_problems(value, hints.get(key, Any), key, checks)
            out += [ArgumentProblem(k, "value", msg) for k, msg in problems]
    for key, p in params.items():
        if p.default is p.empty and key not in kwargs and key not in reserved:
            out.append(ArgumentProblem(key, "missing", f"missing; {name} requires it"))
    return out


def file_parameters(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The parameters of `fn` annotated `File()`: files it reads, which must exist before work starts."""
    hints = typing.get_type_hints(callable_of(fn), include_extras=True)
    return tuple(n for n in parameters(fn) if any(isinstance(m, File) for m in split_annotated(hints.get(n))[1]))
