"""Built-in synthetic captioning data set ``shapes``: coloured shapes on a textured background.

Generated deterministically from a seed (no download) in the Karpathy split JSON format. Each image
also records its objects' boxes and, per object-naming word, the boxes that word refers to, so
attention maps can be scored against ground truth.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image, ImageDraw

from captioning.data.karpathy import write_json_atomic

logger = logging.getLogger(__name__)

SHAPES = ("circle", "square", "triangle", "cross")
COLOURS = ("red", "green", "blue", "yellow")
SIZES = ("small", "large")
SPLITS = ("train", "val", "test")
COLOUR_RGB = {"red": (215, 35, 35), "green": (35, 170, 55), "blue": (40, 70, 215), "yellow": (235, 205, 30)}
# Relation word in a caption -> which side the first-named object is on ("left" = smaller x).
RELATION_WORDS = {"left": "left", "right": "right", "above": "above", "below": "below", "under": "below"}
GENERATOR_VERSION = 2
JSON_NAME = "dataset_shapes.json"
META_NAME = "meta.json"
MAX_CAPTION_TOKENS = 16

_SIZE_FRACTION = {"small": 0.20, "large": 0.32}
_MARGIN = 3  # free pixels kept around every object, so boxes never touch each other or the border
_NOISE_STD = 7.0
_COUNT_WORDS = {2: "two", 3: "three"}
_REL_PHRASES = {
    "left": ("to the left of", "on the left of", "left of"),
    "right": ("to the right of", "on the right of", "right of"),
    "above": ("above",),
    "below": ("below", "under"),
}
_PICTURE_PREFIXES = ("a picture of", "an image of", "a drawing of")


@dataclass(frozen=True)
class ShapeObject:
    """One drawn object; ``box`` is (x0, y0, x1, y1) in pixels, x1/y1 exclusive."""

    shape: str
    colour: str
    size: str
    box: tuple[int, int, int, int]

    @property
    def centre(self) -> tuple[float, float]:
        """Centre of the box in pixel coordinates."""
        return ((self.box[0] + self.box[2]) / 2, (self.box[1] + self.box[3]) / 2)

    def to_json(self) -> dict[str, Any]:
        """JSON-serialisable form used in the data set file."""
        return {"shape": self.shape, "colour": self.colour, "size": self.size, "box": list(self.box)}


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
        out += np.asarray(small.resize((size, size), Image.BILINEAR), dtype=np.float32) - offset
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
        objects.append(ShapeObject(shape, colour, size, tuple(int(v) for v in mask.getbbox())))
    canvas += rng.normal(0.0, _NOISE_STD, size=canvas.shape).astype(np.float32)
    return Image.fromarray(np.clip(canvas + 0.5, 0, 255).astype(np.uint8), "RGB"), objects


# --------------------------------------------------------------------------------------- captions
def spatial_relation(a: ShapeObject, b: ShapeObject) -> str:
    """Where `a` is relative to `b` along the dominant axis of their centre offset."""
    dx, dy = a.centre[0] - b.centre[0], a.centre[1] - b.centre[1]
    if abs(dx) >= abs(dy):
        return "left" if dx < 0 else "right"
    return "above" if dy < 0 else "below"


def _np(obj: ShapeObject, style: str, det: str = "a") -> str:
    """Noun phrase; adjectives always precede the noun in the order size, colour."""
    adjectives = {"full": [obj.size, obj.colour], "colour": [obj.colour], "size": [obj.size], "bare": []}[style]
    return " ".join([det, *adjectives, obj.shape])


def _rel(rng: np.random.Generator, a: ShapeObject, b: ShapeObject) -> str:
    phrases = _REL_PHRASES[spatial_relation(a, b)]
    return phrases[int(rng.integers(len(phrases)))]


def _listing(rng: np.random.Generator, objs: Sequence[ShapeObject]) -> str:
    # Three objects get the short noun phrases so the caption stays within MAX_CAPTION_TOKENS.
    styles = ("full", "colour") if len(objs) == 2 else ("colour", "size")
    return " and ".join(_np(o, styles[int(rng.integers(2))]) for o in objs)


def reading_order(objects: Sequence[ShapeObject]) -> list[ShapeObject]:
    """Objects in the order captions name them: left to right; a vertical pair top to bottom.

    A fixed naming order, as people tend to have, makes *where* the next object is part of the caption,
    so a captioner has to look at the right place to continue it.
    """
    if len(objects) == 2 and spatial_relation(objects[0], objects[1]) in ("above", "below"):
        return sorted(objects, key=lambda o: o.centre[1])
    return sorted(objects, key=lambda o: o.centre[0])


def _pick(rng: np.random.Generator, objects: Sequence[ShapeObject], n: int) -> list[ShapeObject]:
    chosen = [objects[int(i)] for i in rng.permutation(len(objects))[:n]]
    return reading_order(chosen)


_Template = Callable[[np.random.Generator, Sequence[ShapeObject]], str]


def _t_rel_full(rng: np.random.Generator, objs: Sequence[ShapeObject]) -> str:
    a, b = _pick(rng, objs, 2)
    return f"{_np(a, 'full')} {_rel(rng, a, b)} {_np(b, 'full')}"


def _t_there_is(rng: np.random.Generator, objs: Sequence[ShapeObject]) -> str:
    a, b = _pick(rng, objs, 2)
    return f"there is {_np(a, 'colour')} {_rel(rng, a, b)} {_np(b, 'colour')}"


def _t_the_is(rng: np.random.Generator, objs: Sequence[ShapeObject]) -> str:
    a, b = _pick(rng, objs, 2)
    return f"{_np(a, 'colour', 'the')} is {_rel(rng, a, b)} {_np(b, 'full', 'the')}"


def _t_rel_size(rng: np.random.Generator, objs: Sequence[ShapeObject]) -> str:
    a, b = _pick(rng, objs, 2)
    return f"{_np(a, 'size')} {_rel(rng, a, b)} {_np(b, 'size')}"


def _t_sits(rng: np.random.Generator, objs: Sequence[ShapeObject]) -> str:
    a, b = _pick(rng, objs, 2)
    return f"{_np(a, 'colour')} sits {_rel(rng, a, b)} {_np(b, 'size')}"


def _t_bare_rel(rng: np.random.Generator, objs: Sequence[ShapeObject]) -> str:
    a, b = _pick(rng, objs, 2)
    return f"{_np(a, 'bare')} {_rel(rng, a, b)} {_np(b, 'full')}"


def _t_pair(rng: np.random.Generator, objs: Sequence[ShapeObject]) -> str:
    return _listing(rng, _pick(rng, objs, 2))


def _t_count(rng: np.random.Generator, objs: Sequence[ShapeObject]) -> str:
    shown = _pick(rng, objs, int(rng.integers(2, len(objs) + 1)))
    return f"{_COUNT_WORDS[len(objs)]} shapes including {_listing(rng, shown)}"


def _t_picture(rng: np.random.Generator, objs: Sequence[ShapeObject]) -> str:
    prefix = _PICTURE_PREFIXES[int(rng.integers(len(_PICTURE_PREFIXES)))]
    return f"{prefix} {_listing(rng, _pick(rng, objs, len(objs)))}"


def _t_background(rng: np.random.Generator, objs: Sequence[ShapeObject]) -> str:
    a, b = _pick(rng, objs, 2)
    return f"{_np(a, 'colour')} and {_np(b, 'colour')} on a noisy background"


TEMPLATES: tuple[_Template, ...] = (
    _t_rel_full, _t_there_is, _t_the_is, _t_rel_size, _t_sits,
    _t_bare_rel, _t_pair, _t_count, _t_picture, _t_background,
)
# Some phrasings are more common than others, as in real caption data (drawn without replacement).
_TEMPLATE_WEIGHTS = np.array([6, 4, 1, 1, 1, 1, 4, 1, 2, 1], dtype=float) / 22


def make_captions(rng: np.random.Generator, objects: Sequence[ShapeObject], count: int = 5) -> list[str]:
    """`count` distinct truthful captions, cycling through the templates in a random order."""
    order = rng.choice(len(TEMPLATES), size=len(TEMPLATES), replace=False, p=_TEMPLATE_WEIGHTS)
    captions: list[str] = []
    for attempt in range(100 * count):
        caption = TEMPLATES[order[attempt % len(order)]](rng, objects)
        if caption not in captions and len(caption.split()) <= MAX_CAPTION_TOKENS:
            captions.append(caption)
            if len(captions) == count:
                return captions
    raise RuntimeError(f"could not make {count} distinct captions for {objects}")


def word_boxes(objects: Sequence[ShapeObject]) -> dict[str, list[list[int]]]:
    """Boxes named by each shape noun and colour word present, in canonical (SHAPES, COLOURS) order."""
    boxes: dict[str, list[list[int]]] = {}
    for word in (*SHAPES, *COLOURS):
        named = [list(o.box) for o in objects if word in (o.shape, o.colour)]
        if named:
            boxes[word] = named
    return boxes


# ---------------------------------------------------------------------------------------- on disk
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
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


def build_shapes(root: str | os.PathLike, *, seed: int = 0, num_train: int = 4000, num_val: int = 250,
                 num_test: int = 250, image_size: int = 96, captions_per_image: int = 5,
                 object_scale: float = 1.0) -> Path:
    """Generate the shapes data set under `root` (idempotent) and return the path of its JSON file.

    `object_scale` multiplies the object sizes (small: 0.20, large: 0.32 of the image side).
    """
    root = Path(root)
    json_path = root / JSON_NAME
    counts = {"train": num_train, "val": num_val, "test": num_test}
    params = {"seed": seed, "num_train": num_train, "num_val": num_val, "num_test": num_test,
              "image_size": image_size, "captions_per_image": captions_per_image, "object_scale": object_scale}
    meta = {"generator": __name__, "version": GENERATOR_VERSION, "params": params}
    if json_path.exists() and _read_json(root / META_NAME) == meta:
        logger.debug("shapes data set already present at %s", json_path)
        return json_path
    if min(counts.values()) < 0 or image_size < 32 or not 1 <= captions_per_image <= 20 or not 0.5 <= object_scale <= 1.5:
        raise ValueError(f"invalid shapes parameters: {params}")

    start = time.perf_counter()
    image_dir = root / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    # Drop the old JSON first so that an interrupted regeneration can never look complete.
    json_path.unlink(missing_ok=True)
    images: list[dict[str, Any]] = []
    for split_code, split in enumerate(SPLITS):
        for index in range(counts[split]):
            # Per-image generators keyed by (seed, split, index): one split's size does not shift another's images.
            image, objects = render_image(np.random.default_rng([seed, split_code, index, 0]), image_size, object_scale)
            captions = make_captions(np.random.default_rng([seed, split_code, index, 1]), objects, captions_per_image)
            filename = f"{split}_{index:05d}.png"
            image.save(image_dir / filename, format="PNG")
            images.append(_image_entry(len(images), split, filename, image_size, objects, captions,
                                       len(images) * captions_per_image))
    keep = {entry["filename"] for entry in images}
    for stale in sorted(image_dir.glob("*_[0-9][0-9][0-9][0-9][0-9].png")):
        if stale.name not in keep and stale.name.split("_")[0] in SPLITS:
            stale.unlink()
    write_json_atomic(root / META_NAME, meta)
    write_json_atomic(json_path, {"dataset": "shapes", "images": images})
    logger.info("generated %d shapes images in %.1f s: %s", len(images), time.perf_counter() - start, json_path)
    return json_path


def main(argv: Sequence[str] | None = None) -> Path:
    """Command-line entry point: ``python -m captioning.data.shapes --root DIR``."""
    parser = argparse.ArgumentParser(description="Generate the synthetic 'shapes' captioning data set.")
    parser.add_argument("--root", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-train", type=int, default=4000)
    parser.add_argument("--num-val", type=int, default=250)
    parser.add_argument("--num-test", type=int, default=250)
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--captions-per-image", type=int, default=5)
    parser.add_argument("--object-scale", type=float, default=1.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path = build_shapes(args.root, seed=args.seed, num_train=args.num_train, num_val=args.num_val,
                        num_test=args.num_test, image_size=args.image_size,
                        captions_per_image=args.captions_per_image, object_scale=args.object_scale)
    logger.info("shapes data set ready: %s", path)
    return path


if __name__ == "__main__":
    main()
