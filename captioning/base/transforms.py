"""An image transform's steps: the one walk over torchvision's Compose (duck-typed: no torchvision import here)."""

from __future__ import annotations

from typing import Any


def flat_steps(transform: Any) -> list[Any]:
    """A transform's steps in the order they run, nested Compose flattened; any other transform is one step."""
    if any(c.__name__ == "Compose" for c in type(transform).__mro__):  # torchvision's, or a subclass of it
        return [step for t in transform.transforms for step in flat_steps(t)]
    return [transform]
