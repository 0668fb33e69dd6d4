"""What every data reader produces: one `ImageRecord` per image of a split (no torch, no image decoding)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captioning.data.tokenizers import DEFAULT_TOKENIZER

SPLITS = ("train", "val", "test")


@dataclass
class ImageRecord:
    """One image of a split: where it is, its tokenised reference captions and optional object boxes."""

    image_id: int
    path: Path
    captions: list[list[str]]  # tokenised references
    raw: list[str]  # the references as written
    word_boxes: dict[str, list[list[float]]] = field(default_factory=dict)  # words naming objects -> boxes
    size: tuple[int, int] | None = None  # (height, width) if the annotation says
    tokenizer: str = DEFAULT_TOKENIZER  # the rule that made `captions` from `raw` (dataset.tokenizer: tokenizers.py)


def describe(value: Any) -> str:
    """A value and its type for an error message: `str 'ab'`, `int 3`."""
    return f"{type(value).__name__} {value!r:.60}"


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a reader builds millions of small objects (none of them in
    cycles): otherwise each collection scans all that is already built, which doubled the time to read COCO."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
