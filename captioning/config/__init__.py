"""Checking a composed Hydra config before any work starts: every problem named by its full key, at once.

    schema.py       the groups without a `_target_` (dataset, trainer, eval, top-level keys): TypedDicts, no defaults
    targets.py      `_target_` groups: checked against their target's signature (registry or torch classes)
    check.py        the walk, and ConfigError

The declarations it enforces (`Annotated[int, Range(ge=1)]`, signature binding) live on the ground floor,
captioning/base/, so the models and data readers declare them without importing the checker. Names are imported
lazily.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {"ConfigError": "check", "MONITORS": "schema", "validate_evaluate_config": "schema",
            "validate_train_config": "schema"}
__all__ = list(_EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time the names load lazily below
    from captioning.config.check import ConfigError  # noqa: F401
    from captioning.config.schema import (  # noqa: F401
        MONITORS,
        validate_evaluate_config,
        validate_train_config,
    )


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
