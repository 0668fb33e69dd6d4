"""The engine that checks a composed config: typed groups (captioning/config/schema.py) and `_target_` groups.

`validate(cfg, schema)` resolves interpolations, then walks the values and the schema together and raises one
`ConfigError` naming every problem by its full key. A schema is a `TypedDict` (it cannot hold defaults: conf/ is the
only place a default lives), whose fields are

* plain values: bool, int, float, str, `X | None`, `Literal`, `list[X]`, with constraints as in a signature
  (`Annotated[int, Range(ge=1)]`, captioning/base/constraints.py); a field is required unless `NotRequired`;
* nested groups (another TypedDict);
* `Target` (or `Target | None`, where `{}` or null means no group): a `_target_` group, checked against its target's
  signature (captioning/config/targets.py). A `_target_` group the schema does not name (a group added to conf/
  later) is checked the same way; any other unknown key is an error with a did-you-mean.

What a schema may add, registered by decorators: `@rules_for(Schema)`, cross-key checks (paths that must exist...)
yielding (key relative to the group, message); `@extra_keys_for(Schema)`, keys accepted as they are, untyped.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Union, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from captioning.base.constraints import Problem, did_you_mean, split_annotated, value_problems

Rules = Callable[[Mapping[str, Any]], Iterator[Problem]]
RULES: dict[type, Rules] = {}
EXTRA_KEYS: dict[type, Callable[[], set[str]]] = {}


class ConfigError(ValueError):
    """An invalid configuration; the message lists every problem with its full key."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = [f"{key}{msg}" if msg.startswith("=") else f"{key}: {msg}" for key, msg in problems]
        super().__init__(f"invalid configuration ({len(problems)} problem{'s' * (len(problems) > 1)}):\n  "
                         + "\n  ".join(lines))


class Target:
    """Schema type of a `_target_` group: its keys are checked against its target's signature."""


def rules_for(schema: type) -> Callable[[Rules], Rules]:
    """Register a function as the cross-key rules of `schema` (keys in its problems are relative to the group)."""
    def register(fn: Rules) -> Rules:
        RULES[schema] = fn
        return fn
    return register


def extra_keys_for(schema: type) -> Callable[[Callable[[], set[str]]], Callable[[], set[str]]]:
    """Register a function giving the keys `schema` accepts untyped."""
    def register(fn: Callable[[], set[str]]) -> Callable[[], set[str]]:
        EXTRA_KEYS[schema] = fn
        return fn
    return register


def validate(cfg: DictConfig | Mapping[str, Any], schema: type) -> None:
    """Resolve interpolations, then check every key against the schema; raises ConfigError naming each problem."""
    conf = OmegaConf.create(dict(cfg)) if not isinstance(cfg, DictConfig) else cfg
    if "hydra" in conf:  # present only when composed with return_hydra_config; not the app's config
        conf = OmegaConf.masked_copy(conf, [str(k) for k in conf if k != "hydra"])
    try:
        values = cast(dict[str, Any], OmegaConf.to_container(conf, resolve=True, throw_on_missing=False))
    except OmegaConfBaseException as err:
        raise ConfigError([(str(getattr(err, "full_key", "") or "config"), f"cannot resolve: {err}")]) from err
    problems = list(_group(values, schema, ""))
    if problems:
        raise ConfigError(problems)


def _target_problems(v: Mapping[str, Any], key: str) -> Iterator[Problem]:
    """captioning/config/targets.py's check of a `_target_` group, imported when a config has one: it loads the
    registry (the models, torch), which a config of plain keys (captioning-evaluate's) does without."""
    from captioning.config.targets import target_problems as check_target

    return check_target(v, key)


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def _group(v: Mapping[str, Any], schema: type, key: str) -> Iterator[Problem]:
    """Problems of one group (a dict) against its TypedDict: fields, then unknown keys, then the group's rules."""
    hints = typing.get_type_hints(schema, include_extras=True)
    for name, tp in hints.items():
        if name in v:
            yield from _value(v[name], tp, _join(key, name))
        elif name in schema.__required_keys__:  # type: ignore[attr-defined]
            yield _join(key, name), "missing; this key is required"
    extra = EXTRA_KEYS[schema]() if schema in EXTRA_KEYS else set()
    for name, value in v.items():
        if name in hints:
            continue
        if isinstance(value, dict) and "_target_" in value:  # a _target_ group the schema does not name
            yield from _target_problems(value, _join(key, name))
        elif name not in extra:
            allowed = sorted(set(hints) | extra)
            hint = did_you_mean(name, allowed) or " (allowed: " + ", ".join(allowed) + ")"
            yield _join(key, name), f"unknown key{hint}"
    if schema in RULES:  # cross-key rules (paths); they skip values of the wrong type
        yield from ((_join(key, k), msg) for k, msg in RULES[schema](v))


def _value(v: Any, tp: Any, key: str) -> Iterator[Problem]:
    """Problems of one field's value: a nested group, a `_target_` group, or a plain value."""
    plain = split_annotated(tp)[0]
    args = typing.get_args(plain)
    optional = typing.get_origin(plain) in (Union, types.UnionType) and type(None) in args
    inner = next((a for a in args if a is not type(None)), plain) if optional else plain
    if inner is Target or typing.is_typeddict(inner):
        if optional and (v is None or (inner is Target and v == {})):
            return
        if not isinstance(v, dict):
            yield key, f"={v!r}: must be a group of keys" + (" with a _target_" if inner is Target else "")
        elif inner is Target:
            yield from _target_problems(v, key)
        else:
            yield from _group(v, inner, key)
    else:
        yield from value_problems(v, tp, key)
