"""Attention over region features drawn on the image: each region's weight spread evenly over its box.

A region set's maps are (T, 1, L_i): one weight per region, no grid. Where the region source knows each region's box
(x0, y0, x1, y1 in the image's pixels) and the image's size, the weights are painted on a REGION_GRID x REGION_GRID
grid of cells covering the whole image: a cell gets the sum, over the regions, of the region's weight times the share
of the region's box area that falls in the cell. The painted map keeps the weights' sum (a box is clipped to the
image first; one with no area left puts its weight in the cell holding it), so the figures, the report page and
attention correctness (the `shapes` boxes, COCO's instance masks) read it as they read a grid over the full image.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from captioning.data.dataset import CaptionDataset
from captioning.metrics.coco_attention import interval_overlaps
from captioning.reporting.items import Prediction

logger = logging.getLogger(__name__)
REGION_GRID = 16  # cells per side of a painted map (256 cells, about a 14 x 14 grid's storage)


def _axis_shares(lo: np.ndarray, hi: np.ndarray, length: float, cells: int) -> np.ndarray:
    """(n, cells): the share of each interval [lo, hi) (clipped to [0, length]) in each of `cells` equal cells."""
    lo, hi = np.clip(lo, 0, length), np.clip(hi, 0, length)
    overlap = interval_overlaps(lo, hi, np.linspace(0, length, cells + 1))
    width = hi - lo
    shares = overlap / np.where(width > 0, width, 1)[:, None]
    empty = width <= 0  # no extent left: the cell holding the point
    if empty.any():
        at = np.minimum((lo[empty] / length * cells).astype(int), cells - 1)
        shares[empty] = np.eye(cells)[at]
    return shares


def box_cells(boxes: np.ndarray, size: tuple[int, int], cells: int = REGION_GRID) -> np.ndarray:
    """(n, cells, cells): each box's share of its area in each cell of a grid over an image of (height, width)."""
    height, width = size
    boxes = np.asarray(boxes, dtype=np.float64)
    rows = _axis_shares(boxes[:, 1], boxes[:, 3], height, cells)  # (n, cells)
    cols = _axis_shares(boxes[:, 0], boxes[:, 2], width, cells)
    return rows[:, :, None] * cols[:, None, :]


def paint(alphas: torch.Tensor, boxes: np.ndarray, size: tuple[int, int], cells: int = REGION_GRID) -> torch.Tensor:
    """Region weights (T, 1, n) or (T, n) -> maps (T, cells, cells) over the whole image (see the module)."""
    weights = alphas.reshape(alphas.shape[0], alphas.shape[-1]).double()  # (T, n); an empty caption: T = 0
    if weights.shape[1] != len(boxes):
        raise ValueError(f"{weights.shape[1]} region weights but {len(boxes)} boxes")
    spread = torch.from_numpy(box_cells(boxes, size, cells))  # (n, cells, cells)
    return torch.einsum("tn,nyx->tyx", weights, spread).to(alphas.dtype)


def image_size(dataset: CaptionDataset, index: int) -> tuple[int, int] | None:
    """An image's (height, width): its region source's, its record's, or its file's header; None if unknown."""
    record = dataset.records[index]
    size = getattr(dataset.features, "size", lambda image_id: None)(record.image_id) or record.size
    if size is None and record.path is not None:
        try:
            with Image.open(record.path) as image:
                return image.height, image.width
        except OSError:
            return None
    return None if size is None else (int(size[0]), int(size[1]))


def paint_predictions(preds: Sequence[Prediction], dataset: CaptionDataset) -> bool:
    """Replace every prediction's region maps by its painted map; False (nothing changed) where the region source
    has no boxes or an image's size is unknown."""
    boxes_of = getattr(dataset.features, "boxes", None)
    if boxes_of is None or not preds:
        return False
    painted: list[torch.Tensor] = []
    for p in preds:
        boxes: Any = boxes_of(p.image_id)
        size = image_size(dataset, p.index)
        if boxes is None or size is None:
            logger.info("region maps are not drawn: image %s has no %s", p.image_id, "boxes" if boxes is None else
                        "known size")
            return False
        painted.append(paint(p.alphas, boxes, size))
    for p, maps in zip(preds, painted):
        p.alphas = maps
    return True


def painted(preds: Sequence[Prediction]) -> bool:
    """Whether the predictions' maps are painted region maps (or grids), not one weight per region."""
    return bool(preds) and all(tuple(p.alphas.shape[1:]) == (REGION_GRID, REGION_GRID) for p in preds)
