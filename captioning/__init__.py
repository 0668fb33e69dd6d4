"""Show, Attend and Tell: attention-based image captioning.

`captioning.load(checkpoint)` gives a model that captions images (captioning/inference/model.py). It is imported
on first use, so `import captioning` (and the torch-free exported-model runner, captioning/export/) never loads
torch (lazy loading as in Scientific Python's SPEC 1, with the stub `__init__.pyi` for type checkers).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["load", "CaptionModel", "CaptionResult"]  # their types for checkers and editors: __init__.pyi


def __getattr__(name: str) -> Any:
    if name in __all__:
        from captioning.inference import model

        return getattr(model, name)
    raise AttributeError(f"module 'captioning' has no attribute {name!r}")
