"""Built-in synthetic captioning data set ``shapes``: coloured shapes on a textured background.

Generated deterministically from a seed (no download) in the Karpathy split JSON format. Each image
also records its objects' boxes and, per object-naming word, the boxes that word refers to, so
attention maps can be scored against ground truth.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, cast

import numpy as np
from PIL import Image, ImageDraw

from captioning.base.constraints import MAX_IMAGE_SIDE, Count, Range, constrained
from captioning.base.files import TMP_SUFFIX, atomic_file
from captioning.base.jsonio import load_json, write_json_atomic
from captioning.base.lock import LOCK_NAME, FolderLock
from captioning.data.shapes.captions import COLOURS, SHAPES, SIZES, ShapeObject, make_captions, word_boxes

logger = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
COLOUR_RGB = {"red": (215, 35, 35), "green": (35, 170, 55), "blue": (40, 70, 215), "yellow": (235, 205, 30)}
GENERATOR_VERSION = 3  # 3: scene-dependent phrasings (captions.template_weights)
# Stored in meta.json to mark a folder as this generator's: the module's name before it moved, kept so that data
# sets generated then are still recognised (not regenerated, not refused).
GENERATOR = "captioning.data.shapes"
JSON_NAME = "dataset_shapes.json"
META_NAME = "meta.json"

_SIZE_FRACTION = {"small": 0.20, "large": 0.32}
MAX_SPLIT = 200_000  # images in one split at most (COCO's largest split has 113,287)
SplitSize = Annotated[int, Range(ge=1, le=MAX_SPLIT)]
_MARGIN = 3  # free pixels kept around every object, so boxes never touch each other or the border
_NOISE_STD = 7.0


# ----------------------------------------------------------------------------------------- images
def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """Muted low-frequency gradient plus mid-frequency blotches, float32 (size, size, 3)."""
    base = rng.uniform(85, 165) + rng.uniform(-12, 12, size=3)
    # Variation is mostly shared across channels so the background stays grayish, never a shape colour.
    coarse = rng.uniform(-30, 30, size=(4, 4, 1)) + rng.uniform(-8, 8, size=(4, 4, 3))
    fine = rng.uniform(-10, 10, size=(12, 12, 1))
    out = np.empty((size, size, 3), dtype=np.float32)
    out[:] = base
    for grid, offset in ((coarse, 64.0), (fine, 16.0)):
        small = Image.fromarray(np.clip(grid + offset, 0, 255).astype(np.uint8).repeat(3 // grid.shape[2], 2))
        out += np.asarray(small.resize((size, size), Image.Resampling.BILINEAR), dtype=np.float32) - offset
    return out


def _draw_mask(shape: str, x: int, y: int, d: int, image_size: int) -> Image.Image:
    """Binary ('L') mask of one shape whose bounding square starts at (x, y) with side d."""
    mask = Image.new("L", (image_size, image_size), 0)
    draw = ImageDraw.Draw(mask)
    x1, y1 = x + d - 1, y + d - 1  # PIL coordinates are inclusive
    if shape == "circle":
        draw.ellipse([x, y, x1, y1], fill=255)
    elif shape == "square":
        draw.rectangle([x, y, x1, y1], fill=255)
    elif shape == "triangle":
        draw.polygon([(x + (d - 1) / 2, y), (x, y1), (x1, y1)], fill=255)
    elif shape == "cross":
        t = max(3, round(d / 3))
        o = (d - t) // 2
        draw.rectangle([x + o, y, x + o + t - 1, y1], fill=255)
        draw.rectangle([x, y + o, x1, y + o + t - 1], fill=255)
    else:
        raise ValueError(f"unknown shape {shape!r}")
    return mask


def _overlaps(a: Sequence[int], b: Sequence[int], margin: int) -> bool:
    """Whether two (x0, y0, x1, y1) boxes come closer than `margin` pixels."""
    return not (a[2] + margin <= b[0] or b[2] + margin <= a[0] or a[3] + margin <= b[1] or b[3] + margin <= a[1])


def _sample_layout(rng: np.random.Generator, image_size: int,
                   object_scale: float = 1.0) -> list[tuple[str, str, str, int, int, int]]:
    """(shape, colour, size, x, y, side) for 2-3 non-overlapping objects with distinct shapes."""
    while True:  # restart the whole layout in the rare case an object does not fit
        n = int(rng.integers(2, 4))
        layout: list[tuple[str, str, str, int, int, int]] = []
        for k in rng.choice(len(SHAPES), size=n, replace=False):
            size = SIZES[int(rng.integers(len(SIZES)))]
            d = max(5, round(_SIZE_FRACTION[size] * object_scale * image_size * rng.uniform(0.92, 1.08)))
            for _ in range(100):
                x, y = (int(v) for v in rng.integers(_MARGIN, image_size - d - _MARGIN + 1, size=2))
                if not any(_overlaps((x, y, x + d, y + d), (ox, oy, ox + od, oy + od), _MARGIN)
                           for *_, ox, oy, od in layout):
                    layout.append((SHAPES[k], COLOURS[int(rng.integers(len(COLOURS)))], size, x, y, d))
                    break
            else:
                break
        if len(layout) == n:
            return layout


def render_image(rng: np.random.Generator, image_size: int = 96,
                 object_scale: float = 1.0) -> tuple[Image.Image, list[ShapeObject]]:
    """Draw one random image and return it with its objects (tight boxes taken from the drawn masks)."""
    canvas = _background(rng, image_size)
    objects = []
    for shape, colour, size, x, y, d in _sample_layout(rng, image_size, object_scale):
        mask = _draw_mask(shape, x, y, d, image_size)
        colour_rgb = np.asarray(COLOUR_RGB[colour], dtype=np.float32) + rng.uniform(-12, 12, size=3)
        canvas[np.asarray(mask) > 0] = colour_rgb
        x0, y0, x1, y1 = cast(tuple[int, int, int, int], mask.getbbox())  # the mask is never empty
        objects.append(ShapeObject(shape, colour, size, (int(x0), int(y0), int(x1), int(y1))))
    canvas += rng.normal(0.0, _NOISE_STD, size=canvas.shape).astype(np.float32)
    return Image.fromarray(np.clip(canvas + 0.5, 0, 255).astype(np.uint8), "RGB"), objects


# ---------------------------------------------------------------------------------------- on disk
def _read_json(path: Path) -> Any:
    """The file's JSON, or None when it is missing or unreadable (the data set is then generated again)."""
    try:
        return load_json(path)
    except (OSError, ValueError):
        return None


def _image_entry(imgid: int, split: str, filename: str, image_size: int, objects: list[ShapeObject],
                 captions: list[str], first_sentid: int) -> dict[str, Any]:
    sentids = list(range(first_sentid, first_sentid + len(captions)))
    return {
        "filepath": "images", "filename": filename, "imgid": imgid, "id": imgid, "split": split,
        "width": image_size, "height": image_size, "sentids": sentids,
        "sentences": [{"raw": c, "tokens": c.split(), "imgid": imgid, "sentid": s} for c, s in zip(captions, sentids)],
        "objects": [o.to_json() for o in objects],
        "word_boxes": word_boxes(objects),
    }


def _check_root(root: Path, writable: bool) -> None:
    """Refuse to generate at `root` when the caller may not, or it is not a folder (before its lock is made)."""
    if not writable:
        raise ValueError(f"the shapes data set in {root} is missing or was made with other settings, and this "
                         "command may not generate it there")
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        raise ValueError(f"{root} is not a folder; choose a new or empty folder for the shapes data set")


def _check_folder(root: Path) -> None:
    """Refuse to write into `root` unless it is new, empty or a shapes data set folder (its meta.json says so)."""
    made_here = isinstance(found := _read_json(root / META_NAME), dict) and found.get("generator") == GENERATOR
    if root.is_dir() and not made_here and any(p.name != LOCK_NAME for p in root.iterdir()):
        raise ValueError(f"{root} holds other files and no meta.json of a shapes data set; refusing to write "
                         "images there (choose a new or empty folder for the shapes data set)")


def _present(root: Path, meta: dict[str, Any]) -> bool:
    """Whether `root` holds the complete data set that `meta` describes."""
    return (root / JSON_NAME).exists() and _read_json(root / META_NAME) == meta


@constrained
def build_shapes(root: str | os.PathLike, *, seed: Count = 0,
                 num_train: SplitSize = 4000, num_val: SplitSize = 250,
                 num_test: SplitSize = 250, image_size: Annotated[int, Range(ge=32, le=MAX_IMAGE_SIDE)] = 64,
                 captions_per_image: Annotated[int, Range(ge=1, le=20)] = 5,
                 object_scale: Annotated[float, Range(ge=0.5, le=1.5)] = 1.25, writable: bool = True) -> Path:
    """Generate the shapes data set under `root` (idempotent) and return the path of its JSON file.

    `object_scale` multiplies the object sizes (small: 0.20, large: 0.32 of the image side). Sizes are bounded
    (a split at most MAX_SPLIT images, sides at most MAX_IMAGE_SIDE pixels), and images are only written into a
    new or empty folder or one this function made (its meta.json says so): a data set section from someone else's
    checkpoint cannot fill a disk or overwrite another folder's files. With `writable=False` (set by the caller,
    never by a config: registry.BUILDER_ARGS) the data set must already be there, made with these settings.

    Generation holds the folder's lock (captioning/base/lock.py): processes started together on an empty folder
    (a parallel sweep's first jobs) wait for the first one, log one line saying so, and then find the data set.
    """
    root = Path(root)
    params = {"seed": seed, "num_train": num_train, "num_val": num_val, "num_test": num_test,
              "image_size": image_size, "captions_per_image": captions_per_image, "object_scale": object_scale}
    meta = {"generator": GENERATOR, "version": GENERATOR_VERSION, "params": params}
    if _present(root, meta):
        logger.debug("shapes data set already present at %s", root / JSON_NAME)
        return root / JSON_NAME
    _check_root(root, writable)
    with FolderLock(root, "shapes generation", wait=True):
        if _present(root, meta):  # another process generated it while this one waited
            logger.info("shapes data set generated by another process: %s", root / JSON_NAME)
        else:
            _check_folder(root)  # what is in it, once no other generator writes there
            _generate(root, meta)
    return root / JSON_NAME


def _generate(root: Path, meta: dict[str, Any]) -> None:
    """Draw every image of the data set `meta` describes into root/images, then write its JSON (under the lock)."""
    params = meta["params"]
    seed, image_size, captions_per_image = params["seed"], params["image_size"], params["captions_per_image"]
    start = time.perf_counter()
    json_path, image_dir = root / JSON_NAME, root / "images"
    # Drop the old JSON first so that an interrupted regeneration can never look complete; the meta.json of an
    # unfinished generation marks the folder as this function's (so it may continue) but never matches `meta`.
    json_path.unlink(missing_ok=True)
    write_json_atomic(root / META_NAME, {**meta, "complete": False})
    image_dir.mkdir(parents=True, exist_ok=True)
    images: list[dict[str, Any]] = []
    for split_code, split in enumerate(SPLITS):
        for index in range(params[f"num_{split}"]):
            # Per-image generators keyed by (seed, split, index): one split's size does not shift another's images.
            image, objects = render_image(np.random.default_rng([seed, split_code, index, 0]), image_size,
                                          params["object_scale"])
            captions = make_captions(np.random.default_rng([seed, split_code, index, 1]), objects, captions_per_image)
            filename = f"{split}_{index:05d}.png"
            # atomic (a killed run never leaves half a PNG), but without an fsync per image: thousands of them would
            # cost more than drawing them, and only a power loss at this moment could then leave an image empty
            with atomic_file(image_dir / filename, fsync=False) as f:
                image.save(f, format="PNG")
            images.append(_image_entry(len(images), split, filename, image_size, objects, captions,
                                       len(images) * captions_per_image))
    keep = {entry["filename"] for entry in images}
    for stale in sorted(image_dir.glob("*_[0-9][0-9][0-9][0-9][0-9].png")):
        if stale.name not in keep and stale.name.split("_")[0] in SPLITS:
            stale.unlink()
    for stale in image_dir.glob(f".*{TMP_SUFFIX}"):  # an image a killed run was writing (the lock is ours)
        stale.unlink(missing_ok=True)
    write_json_atomic(root / META_NAME, meta)
    write_json_atomic(json_path, {"dataset": "shapes", "images": images})
    logger.info("generated %d shapes images in %.1f s: %s", len(images), time.perf_counter() - start, json_path)
