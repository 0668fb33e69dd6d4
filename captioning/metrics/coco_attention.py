"""Attention correctness on COCO: how much of a word's attention falls on the instance masks of the category it names.

For every generated word that names a COCO category (table in :mod:`captioning.metrics.coco_words`),
the share of that word's attention map inside the union of the image's instance masks of that
category (``pycocotools``), averaged over all such words of all images.

Words.  :func:`category_mentions` scans a caption left to right and matches two-word names ('traffic
light', 'hot dog') before single words.  A two-word name counts once, at its last word (its head:
'light' of 'traffic light'), because that is the word whose attention map is produced when the
category has been named.  A word whose category has no instance in that image (a hallucinated or
unannotated object) has no mask to score against: it is skipped and counted in
``attention_correctness_skipped_words``.  Crowd annotations (``iscrowd=1``) are regions of the
category too and are part of the mask.

Geometry.  The (h, w) attention grid covers the encoder's view of the image, i.e. what is left after
its resize and centre crop.  A :data:`ViewGeometry` maps an image's (height, width) to the rectangle
of the original image that the view shows (:class:`View`; it extends past the image where a crop
pads).  Each grid cell is a rectangle of that view, so it is also a rectangle of the original image,
and its mask coverage is the exact area average of the mask over it (pixel (i, j) is the unit square
[j, j+1) x [i, i+1); padding counts as background).  This scores the mask at its own resolution
instead of resampling it.  The word's share is ``sum_cells alpha * coverage / sum_cells alpha``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pycocotools import mask as mask_utils

from captioning.base.jsonio import load_json
from captioning.base.transforms import flat_steps
from captioning.data.readers.coco_captions import coco_index
from captioning.metrics.chair_coco import objects_of
from captioning.metrics.coco_words import CATEGORY_WORDS, COCO_CATEGORY_IDS

__all__ = ["WORD_CATEGORIES", "category_mentions", "View", "ViewGeometry", "full_image", "resize_center_crop",
           "view_geometry", "mask_coverage", "CocoInstances", "coco_attention_correctness"]

CATEGORY_NAMES: dict[int, str] = {i: name for name, i in COCO_CATEGORY_IDS.items()}
# word or two-word phrase -> COCO category id
WORD_CATEGORIES: dict[str, int] = {w: COCO_CATEGORY_IDS[name] for name, words in CATEGORY_WORDS.items() for w in words}


def category_mentions(words: Sequence[str]) -> list[tuple[int, int]]:
    """(word index, COCO category id) for every category a caption names; a two-word name counts at its last word."""
    out: list[tuple[int, int]] = []
    ws = [w.lower() for w in words]
    t = 0
    while t < len(ws):
        pair = f"{ws[t]} {ws[t + 1]}" if t + 1 < len(ws) else None
        if pair is not None and pair in WORD_CATEGORIES:
            out.append((t + 1, WORD_CATEGORIES[pair]))
            t += 2
            continue
        if ws[t] in WORD_CATEGORIES:
            out.append((t, WORD_CATEGORIES[ws[t]]))
        t += 1
    return out


# ------------------------------------------------------------------------------------------------
# View geometry: which part of the original image the attention grid covers
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class View:
    """The rectangle [x0, x1) x [y0, y1) of the original image, in its pixels, that the encoder's input shows."""

    x0: float
    y0: float
    x1: float
    y1: float


ViewGeometry = Callable[[int, int], View]  # (height, width) of the original image -> the region the encoder sees


def full_image(height: int, width: int) -> View:
    """The geometry of an encoder that sees the whole image (no crop), e.g. the `shapes` CNN."""
    return View(0.0, 0.0, float(width), float(height))


def _resized(size: tuple[int, int], target: int | Sequence[int], max_size: int | None) -> tuple[int, int]:
    """(height, width) after torchvision's Resize(target, max_size) of an image of (height, width) `size`."""
    h, w = size
    if isinstance(target, int) or len(target) == 1:
        s = target if isinstance(target, int) else int(target[0])
        short, long = (w, h) if w <= h else (h, w)
        new_short, new_long = s, int(s * long / short)  # torchvision truncates the long side
        if max_size is not None and new_long > max_size:
            new_short, new_long = int(max_size * new_short / new_long), max_size
        return (new_long, new_short) if w <= h else (new_short, new_long)
    return int(target[0]), int(target[1])


def _crop_offset(size: int, crop: int) -> int:
    """Where torchvision's CenterCrop starts along one axis (negative: it pads by that much first)."""
    return -((crop - size) // 2) if crop > size else int(round((size - crop) / 2.0))


def _apply_steps(steps: Sequence[tuple[str, Any]], height: int, width: int) -> View:
    x0, y0, x1, y1 = 0.0, 0.0, float(width), float(height)
    h, w = height, width  # current pixel size of the transformed image
    for kind, arg in steps:
        if kind == "resize":
            h, w = _resized((h, w), *arg)
        else:  # "crop": arg = (crop height, crop width)
            ch, cw = arg
            top, left = _crop_offset(h, ch), _crop_offset(w, cw)
            sy, sx = (y1 - y0) / h, (x1 - x0) / w  # original pixels per current pixel
            x0, y0, x1, y1 = x0 + left * sx, y0 + top * sy, x0 + (left + cw) * sx, y0 + (top + ch) * sy
            h, w = ch, cw
    return View(x0, y0, x1, y1)


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    return (int(size[0]), int(size[0])) if len(size) == 1 else (int(size[0]), int(size[1]))


def resize_center_crop(resize: int | Sequence[int], crop: int | Sequence[int]) -> ViewGeometry:
    """The geometry of torchvision's ``Compose([Resize(resize), CenterCrop(crop)])`` (the ImageNet encoders' view)."""
    steps = [("resize", (resize, None)), ("crop", _pair(crop))]
    return lambda height, width: _apply_steps(steps, height, width)


_NON_GEOMETRIC = {"ToTensor", "PILToTensor", "Normalize", "ConvertImageDtype", "ColorJitter", "Grayscale"}


def view_geometry(transform: Any) -> ViewGeometry:
    """The geometry of a torchvision transform built from Compose, Resize and CenterCrop (plus colour/tensor steps).

    Pass an encoder's ``transform()``; raises ValueError on a step whose geometry is unknown.
    """
    steps: list[tuple[str, Any]] = []
    for t in flat_steps(transform):
        name = type(t).__name__
        if name == "Resize":
            steps.append(("resize", (t.size, t.max_size)))
        elif name == "CenterCrop":
            steps.append(("crop", _pair(t.size)))
        elif name not in _NON_GEOMETRIC:
            raise ValueError(f"cannot tell which part of the image the encoder sees after a {name} transform; "
                             f"build the geometry explicitly (full_image, resize_center_crop or a function "
                             f"(height, width) -> View)")
    return lambda height, width: _apply_steps(steps, height, width)


def interval_overlaps(lo: np.ndarray, hi: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """(n, cells): the length of each interval [lo_i, hi_i) that lies in each cell [edges_k, edges_k+1)."""
    return np.clip(np.minimum(hi[:, None], edges[None, 1:]) - np.maximum(lo[:, None], edges[None, :-1]), 0.0, None)


def _axis_weights(lo: float, hi: float, cells: int, pixels: int) -> np.ndarray:
    """(cells, pixels): the length of each cell of [lo, hi) that lies in each unit pixel [i, i+1)."""
    edges = lo + (hi - lo) * np.arange(cells + 1) / cells
    return interval_overlaps(edges[:-1], edges[1:], np.arange(pixels + 1, dtype=np.float64))


def mask_coverage(mask: np.ndarray, view: View, grid: tuple[int, int]) -> np.ndarray:
    """(h, w): the area fraction of each attention cell (a rectangle of `view`) covered by the (H, W) binary mask."""
    m = np.asarray(mask, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"mask must be an (H, W) array, got shape {m.shape}")
    h, w = int(grid[0]), int(grid[1])
    if h < 1 or w < 1 or not (view.x1 > view.x0 and view.y1 > view.y0):
        raise ValueError(f"need a non-empty grid and view, got grid {grid} and {view}")
    wy = _axis_weights(view.y0, view.y1, h, m.shape[0])  # (h, H)
    wx = _axis_weights(view.x0, view.x1, w, m.shape[1])  # (w, W)
    cell_area = (view.y1 - view.y0) / h * (view.x1 - view.x0) / w
    return wy @ m @ wx.T / cell_area  # (h, w)


# ------------------------------------------------------------------------------------------------
# Instance masks
# ------------------------------------------------------------------------------------------------
class CocoInstances:
    """A COCO instances file (e.g. instances_val2014.json): per image, the union mask of each category's instances."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        data = self._read()
        known = {c["id"]: c["name"] for c in data["categories"]}
        for cid, name in known.items():
            if name in COCO_CATEGORY_IDS and COCO_CATEGORY_IDS[name] != cid:
                raise ValueError(f"{self.path}: category {name!r} has id {cid}, but COCO's is "
                                 f"{COCO_CATEGORY_IDS[name]}; use the official instances file")
        images = {im["id"] for im in data["images"]}
        for ann in data["annotations"]:
            if ann["image_id"] not in images:
                raise ValueError(f"{self.path}: annotation {ann.get('id')} refers to image id {ann['image_id']}, "
                                 f"which is not in its 'images'")
        self._coco = coco_index(data)

    def _read(self) -> dict[str, Any]:
        if not self.path.is_file():
            raise FileNotFoundError(f"instances file not found: {self.path}")
        data = load_json(self.path)
        need = {"images": ("id", "height", "width"), "annotations": ("image_id", "category_id", "segmentation"),
                "categories": ("id", "name")}
        if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in need):
            raise ValueError(f"{self.path} is not a COCO instances file: it needs the lists {sorted(need)}")
        for key, fields in need.items():
            for i, item in enumerate(data[key]):
                missing = [f for f in fields if not isinstance(item, dict) or f not in item]
                if missing:
                    raise ValueError(f"{self.path}: {key}[{i}] lacks {missing}")
        return data

    def image_size(self, image_id: int) -> tuple[int, int]:
        """(height, width) of an image, as the instances file records it."""
        im = self._coco.imgs[image_id]
        return int(im["height"]), int(im["width"])

    def check_image_ids(self, image_ids: Sequence[int]) -> None:
        """Raise ValueError naming the file if any image id is not in it."""
        missing = [i for i in image_ids if i not in self._coco.imgs]
        if missing:
            raise ValueError(f"{len(missing)} image ids are not in {self.path} (e.g. {missing[:5]}); "
                             f"give the instances file of the split's images (instances_val2014.json for the "
                             f"Karpathy val/test splits)")

    def categories(self, image_ids: Sequence[int]) -> dict[int, set[str]]:
        """Each image's category names, every instance counted (crowd ones too): the objects CHAIR checks against."""
        names = {int(c["id"]): str(c["name"]) for c in self._coco.cats.values()}
        found = [(a["image_id"], a["category_id"]) for i in image_ids for a in self._coco.imgToAnns.get(i, [])]
        return objects_of(names, self._coco.imgs, found, image_ids, self.path)

    def category_masks(self, image_id: int, category_ids: set[int]) -> dict[int, np.ndarray]:
        """{category id: (H, W) uint8 union of its instance masks} for the given categories present in the image."""
        height, width = self.image_size(image_id)
        rles: dict[int, list[Any]] = {}
        for ann in self._coco.imgToAnns.get(image_id, []):
            if ann["category_id"] in category_ids:
                try:
                    rle = self._coco.annToRLE(ann)
                except Exception as err:  # pycocotools raises bare TypeErrors/IndexErrors on bad segmentations
                    raise ValueError(f"{self.path}: annotation {ann.get('id')} of image {image_id} has a malformed "
                                     f"segmentation ({type(err).__name__}: {err})") from err
                if list(rle["size"]) != [height, width]:
                    raise ValueError(f"{self.path}: annotation {ann.get('id')} has an RLE of size {rle['size']} "
                                     f"but image {image_id} is {height}x{width}")
                rles.setdefault(ann["category_id"], []).append(rle)
        return {c: mask_utils.decode(mask_utils.merge(r, intersect=False)) for c, r in rles.items()}


def coco_attention_correctness(words: Sequence[Sequence[str]], alphas: Sequence[np.ndarray], image_ids: Sequence[int],
                               instances: CocoInstances, geometry: ViewGeometry = full_image) -> dict[str, Any]:
    """Mean share of attention inside the named category's instance masks, over every word naming a COCO category.

    `words[i]` and `alphas[i]` (T_i, h, w) are image `image_ids[i]`'s generated words and their attention
    maps over the encoder's view, whose place in the image `geometry` gives; a map with no mass counts 0.  Returns
    ``attention_correctness`` (nan when no word counts), ``attention_correctness_words`` (words scored),
    ``attention_correctness_skipped_words`` (category words with no instance in their image) and
    ``attention_correctness_per_category`` ({category name: mean share}).
    """
    if not (len(words) == len(alphas) == len(image_ids)):
        raise ValueError(f"words, alphas and image_ids must have the same length, got "
                         f"{len(words)}, {len(alphas)}, {len(image_ids)}")
    instances.check_image_ids(image_ids)
    per_category: dict[int, list[float]] = {}
    skipped = 0
    for ws, alpha, image_id in zip(words, alphas, image_ids):
        a = np.asarray(alpha, dtype=np.float64)
        if a.ndim != 3 or a.shape[0] != len(ws):
            raise ValueError(f"image {image_id}: alphas must have shape (T, h, w) with T = {len(ws)} words, "
                             f"got {a.shape}")
        positions: dict[int, list[int]] = {}
        for t, cid in category_mentions(ws):
            positions.setdefault(cid, []).append(t)
        if not positions:
            continue
        masks = instances.category_masks(image_id, set(positions))  # each mask decoded once per image
        view = geometry(*instances.image_size(image_id))
        for cid, ts in positions.items():
            if cid not in masks:
                skipped += len(ts)
                continue
            cov = mask_coverage(masks[cid], view, a.shape[1:])  # (h, w)
            total = a[ts].sum(axis=(1, 2))
            has_mass = total > 0  # a map with no mass (monotonic attention attending to nothing) counts 0
            inside = np.einsum("thw,hw->t", a[ts], cov)
            per_category.setdefault(cid, []).extend(np.where(has_mass, inside / np.where(has_mass, total, 1.0), 0.0))
    shares = [s for v in per_category.values() for s in v]
    return {
        "attention_correctness": float(np.mean(shares)) if shares else float("nan"),
        "attention_correctness_words": len(shares),
        "attention_correctness_skipped_words": skipped,
        "attention_correctness_per_category": dict(sorted((CATEGORY_NAMES[c], float(np.mean(v)))
                                                          for c, v in per_category.items())),
    }
