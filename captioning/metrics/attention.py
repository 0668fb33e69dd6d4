"""Attention correctness: how much of the attention used for an object word falls on that object.

Geometry.  An attention map ``alpha`` of shape (h, w) covers an image of (H, W) = (height, width)
pixels.  Grid cell (r, c) covers the rectangle rows [r*H/h, (r+1)*H/h) x columns [c*W/w, (c+1)*W/w)
of the image plane, and its mass is spread uniformly over that rectangle.  A box (x0, y0, x1, y1) in
pixels (x1 and y1 exclusive) covers [x0, x1) x [y0, y1) - i.e. the pixels x0..x1-1 and y0..y1-1 for
integer boxes.  The mass inside a union of boxes is

    sum over cells of  alpha[r, c] * area(cell ∩ union) / area(cell),

computed exactly (coordinate compression over the box and cell edges, so overlapping boxes count
once, and boxes need not be integers).  When H is a multiple of h and W of w every cell is a block of
whole pixels and this equals rasterising per pixel - each pixel getting its cell's mass divided by
the cell's pixel count.  When they are not multiples, cells have fractional sizes (a 100-pixel side
split into 7 cells of 100/7 pixels), and the exact area keeps two properties a per-pixel rasterisation
with ``floor(p*h/H)`` cell indices would lose: every cell has the same area, and a uniform attention
map puts exactly area(union) / (H*W) inside the boxes.

The share is taken relative to the map's total mass (``alpha`` normally sums to 1 already; monotonic attention's
may sum to less, the rest attending to nothing): it is the share of the attention the word gave that fell on the
object. A word whose map has no mass at all gave none to the object, and counts 0 in attention correctness.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["attention_mass_in_boxes", "attention_correctness", "box_coverage"]


def _as_boxes(boxes: Sequence[Sequence[float]]) -> np.ndarray:
    arr = np.asarray(boxes, dtype=np.float64)
    if arr.size == 0:
        return arr.reshape(0, 4)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise ValueError(f"boxes must be a sequence of (x0, y0, x1, y1), got an array of shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("box coordinates must be finite numbers")
    return arr


def _check_size(image_size: tuple[int, int], h: int, w: int) -> tuple[float, float]:
    if len(image_size) != 2:
        raise ValueError(f"image_size must be (height, width), got {image_size!r}")
    H, W = float(image_size[0]), float(image_size[1])
    if not (H > 0 and W > 0):
        raise ValueError(f"image_size must be positive, got {image_size!r}")
    if h < 1 or w < 1:
        raise ValueError(f"attention map must have a non-empty (h, w) grid, got ({h}, {w})")
    return H, W


def _axis_parts(lo: np.ndarray, hi: np.ndarray, extent: float, cells: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split [0, extent) at the cell edges and the (clipped) box edges along one axis.

    Returns the elementary intervals' lengths (n,), the cell each one lies in (n,), and whether each
    lies inside each box (boxes, n).
    """
    cell_edges = np.arange(cells + 1, dtype=np.float64) * extent / cells
    cell_edges[-1] = extent
    lo_c, hi_c = np.clip(lo, 0.0, extent), np.clip(hi, 0.0, extent)
    edges = np.unique(np.concatenate([cell_edges, lo_c, hi_c]))
    left, right = edges[:-1], edges[1:]
    length = right - left
    mid = (left + right) / 2.0
    cell = np.clip(np.searchsorted(cell_edges, mid, side="right") - 1, 0, cells - 1)
    inside = (lo_c[:, None] <= left[None, :]) & (right[None, :] <= hi_c[:, None])
    return length, cell, inside


def box_coverage(boxes: Sequence[Sequence[float]], grid: tuple[int, int], image_size: tuple[int, int]) -> np.ndarray:
    """(h, w) array: the fraction of each attention cell's area covered by the union of `boxes`."""
    h, w = int(grid[0]), int(grid[1])
    H, W = _check_size(image_size, h, w)
    arr = _as_boxes(boxes)
    if len(arr) == 0:
        return np.zeros((h, w))
    dx, col, in_x = _axis_parts(arr[:, 0], arr[:, 2], W, w)
    dy, row, in_y = _axis_parts(arr[:, 1], arr[:, 3], H, h)
    # union[j, i]: elementary rectangle (row j, column i) inside at least one box
    union = np.einsum("bj,bi->ji", in_y.astype(np.int64), in_x.astype(np.int64)) > 0
    area = union * (dy[:, None] * dx[None, :])
    covered = np.zeros((h, w))
    np.add.at(covered, (row[:, None], col[None, :]), area)
    return covered / ((H / h) * (W / w))


def _masses(alphas: np.ndarray, coverage: np.ndarray) -> np.ndarray:
    """Share of each (h, w) map's mass inside the covered area; alphas has shape (n, h, w)."""
    inside = np.einsum("nhw,hw->n", alphas, coverage)
    total = alphas.reshape(len(alphas), -1).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total != 0, inside / np.where(total != 0, total, 1.0), np.nan)


def attention_mass_in_boxes(alpha: np.ndarray, boxes: Sequence[Sequence[float]], image_size: tuple[int, int]) -> float:
    """Share of an attention map's mass that falls inside the union of boxes (x0, y0, x1, y1 pixels, x1/y1 exclusive).

    `alpha` is an (h, w) map over the encoder's grid covering the whole image of size
    `image_size` = (height, width); see the module docstring for the exact geometry.  Returns nan for
    an all-zero map.
    """
    a = np.asarray(alpha, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"alpha must be an (h, w) attention map, got shape {a.shape}")
    cov = box_coverage(boxes, a.shape, image_size)
    return float(_masses(a[None], cov)[0])


def attention_correctness(words: Sequence[Sequence[str]], alphas: Sequence[np.ndarray],
                          word_boxes: Sequence[Mapping[str, Sequence[Sequence[float]]]],
                          image_sizes: Sequence[tuple[int, int]]) -> dict[str, float]:
    """Mean share of attention mass inside the named object's box over every generated word that names an object.

    For image i, `words[i]` are its generated words (no special tokens), `alphas[i]` the (T_i, h, w)
    attention maps used to produce them, `word_boxes[i]` maps object-naming words to their boxes and
    `image_sizes[i]` is its (height, width).  Every position t whose word is a key of `word_boxes[i]`
    counts once; other words are ignored.

    A map with no mass (monotonic attention that attended to nothing) counts 0.

    Returns ``{"attention_correctness": mean share (nan if no word names an object),
    "attention_words": number of such words}``.
    """
    n = len(words)
    if not (len(alphas) == len(word_boxes) == len(image_sizes) == n):
        raise ValueError(f"words, alphas, word_boxes and image_sizes must have the same length, got "
                         f"{n}, {len(alphas)}, {len(word_boxes)}, {len(image_sizes)}")
    total, count = 0.0, 0
    for i in range(n):
        ws = list(words[i])
        a = np.asarray(alphas[i], dtype=np.float64)
        if a.ndim != 3:
            raise ValueError(f"alphas[{i}] must have shape (T, h, w), got {a.shape}")
        if a.shape[0] != len(ws):
            raise ValueError(f"image {i}: {len(ws)} words but {a.shape[0]} attention maps")
        boxes_i = word_boxes[i]
        positions: dict[str, list[int]] = {}
        for t, word in enumerate(ws):
            if word in boxes_i:
                positions.setdefault(word, []).append(t)
        for word, ts in positions.items():
            cov = box_coverage(boxes_i[word], a.shape[1:], image_sizes[i])
            total += float(np.nan_to_num(_masses(a[ts], cov), nan=0.0).sum())  # a map with no mass: 0
            count += len(ts)
    return {"attention_correctness": total / count if count else float("nan"), "attention_words": count}
