"""Rows per image: N = B k query rows hold k consecutive rows for each of B images (row b k + j is copy j of
image b: its k captions in teacher forcing, k beams in beam search, k samples in self-critical training).

The decoders keep a, the keys and the mask once per image and their state k rows per image (`images_and_rows`,
`repeat_rows`); the paper's plain loop gives every row its own copy (`plain_rows`); decoding drops the rows of
images that are done (`live_rows`, `select_rows`). Every helper of that layout is here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def rows_per_image(images: int, rows: int) -> int:
    """k such that `rows` = images * k query rows hold k consecutive rows per image."""
    if images == 0:
        return 1
    if rows % images:
        raise ValueError(f"attention got {rows} query rows for {images} images; rows must be a multiple of images")
    return rows // images


def images_and_rows(a: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None,
                    image_index: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """Per-image tensors for N captions: kept per image with k = N / B captions each when image_index is
    0..0, 1..1, ... (k each; attention shares a and keys), else gathered per caption (k = 1)."""
    if image_index is None:
        return a, keys, mask, 1
    B, N = a.shape[0], image_index.shape[0]
    k = N // B if B else 0
    if k and N == B * k and torch.equal(image_index, torch.arange(B, device=image_index.device).repeat_interleave(k)):
        return a, keys, mask, k
    return a[image_index], keys[image_index], None if mask is None else mask[image_index], 1  # (N, L, D), ...


def repeat_rows(state: Any, k: int) -> Any:
    """Every row of a decoder state (or any tensors in tuples, row first) repeated k times, consecutively: row
    b k + j is copy j of row b (the k captions, beams or samples of image b)."""
    return state if k == 1 else map_state(lambda x: x.repeat_interleave(k, dim=0), state)


def map_state(fn: Callable[[torch.Tensor], torch.Tensor], state: Any) -> Any:
    """Apply fn to every tensor of a decoder state: a tensor, or tuples of them (nested), row first; None stays."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return fn(state)
    if isinstance(state, (tuple, list)):
        items = [map_state(fn, s) for s in state]
        return type(state)(*items) if hasattr(state, "_fields") else type(state)(items)
    raise TypeError(f"decoder state must be tensors (row first) in tuples, got {type(state).__name__}")


def plain_rows(a: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None,
               image_index: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Every caption's own copy of its image's a (N, L, D), keys and mask, as the paper's loop has them."""
    if image_index is None:
        return a, keys, mask
    return a[image_index], keys[image_index], None if mask is None else mask[image_index]


def live_rows(keep: torch.Tensor, k: int) -> torch.Tensor:
    """The k consecutive rows b k .. b k + k - 1 of each kept image b (n,) -> (n k,)."""
    return (keep.unsqueeze(1) * k + torch.arange(k, device=keep.device)).view(-1)


def select_rows(index: torch.Tensor, *tensors: Any) -> list[Any]:
    """These rows of each tensor, or of every tensor in (nested) tuples of them, as an ensemble's keys hold one
    (a, keys) per model (None stays None)."""
    return [map_state(lambda x: x.index_select(0, index), x) for x in tensors]
