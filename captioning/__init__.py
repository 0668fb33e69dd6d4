"""Show, Attend and Tell: attention-based image captioning.

`captioning.load(checkpoint)` gives a model that captions images (captioning/inference/model.py). It is imported
on first use, so `import captioning` (and the torch-free exported-model runner, captioning/export/) never loads
torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["load", "CaptionModel", "CaptionResult"]

if TYPE_CHECKING:
    from captioning.inference.model import CaptionModel, CaptionResult, load


def __getattr__(name: str) -> Any:
    if name in __all__:
        from captioning.inference import model

        return getattr(model, name)
    raise AttributeError(f"module 'captioning' has no attribute {name!r}")
