"""What the report's pages show per image: a decoded image (`Prediction`, what `evaluation` produces) and a report
row (`ReportItem`, what the page renderer draws)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch


@dataclass
class Prediction:
    """One decoded image: its caption and the (T, h, w) attention maps of its words."""

    index: int
    image_id: int
    words: list[str]
    alphas: torch.Tensor  # (T, h, w)
    scores: dict[str, Any] = field(default_factory=dict)  # per-image metrics, once scored (and CHAIR's words)
    sentinel: list[float] | None = None  # decoder=adaptive: each word's visual sentinel weight beta_t

    @property
    def caption(self) -> str:
        return " ".join(self.words)


@dataclass
class ReportItem:
    """One row of the report: an image's caption, references, scores and (optionally) its attention maps."""

    image_id: int
    words: list[str]
    references: list[str]
    scores: dict[str, Any] = field(default_factory=dict)  # numbers; CHAIR's `hallucinated`: the words
    image_uri: str | None = None  # JPEG thumbnail of the encoder's view, as a data URI
    alphas: np.ndarray | None = None  # (T, h, w), one map per word
    mark_regions: bool = False  # hard attention: outline the cell each map selects (its argmax)
    sentinel: list[float] | None = None  # decoder=adaptive: each word's visual sentinel weight, shown beside it

    def __post_init__(self) -> None:
        if self.alphas is not None:
            a = np.asarray(self.alphas, dtype=np.float64)
            if a.ndim != 3 or a.shape[0] != len(self.words) or 0 in a.shape[1:]:
                raise ValueError(f"image {self.image_id}: alphas must be (T, h, w) with T = {len(self.words)} "
                                 f"words, got shape {a.shape}")
            if not np.all(np.isfinite(a)):
                raise ValueError(f"image {self.image_id}: alphas contain non-finite values")
            self.alphas = a
        if self.sentinel is not None and len(self.sentinel) != len(self.words):
            raise ValueError(f"image {self.image_id}: {len(self.sentinel)} sentinel weights for "
                             f"{len(self.words)} words")

