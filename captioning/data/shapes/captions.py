"""The captions of the `shapes` data set: its objects, their spatial relations and the phrasings that describe them.

Every caption is true of its image: it names objects by shape, colour and/or size, in reading order (left to right;
a vertical pair top to bottom), with their relation. Which phrasings an image gets depends on its scene
(`template_weights`), so the most likely caption differs from image to image.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SHAPES = ("circle", "square", "triangle", "cross")
COLOURS = ("red", "green", "blue", "yellow")
SIZES = ("small", "large")
# Relation word in a caption -> which side the first-named object is on ("left" = smaller x).
RELATION_WORDS = {"left": "left", "right": "right", "above": "above", "below": "below", "under": "below"}
MAX_CAPTION_TOKENS = 16

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


def template_weights(objects: Sequence[ShapeObject]) -> np.ndarray:
    """How likely each template is for this scene (drawn without replacement, so every image still gets several
    phrasings). As people do, the scene decides the phrasing most often used: three objects are counted or listed,
    a side-by-side pair is "there is a ... left of ...", a stacked pair "the ... is above ...", a small and a large
    object are told apart by size. A captioner must look at the image to pick the opening, and captions vary."""
    w = dict.fromkeys(TEMPLATES, 1.0)
    if len(objects) == 3:
        w.update({_t_count: 8.0, _t_picture: 5.0, _t_pair: 4.0})
    else:
        a, b = reading_order(objects)
        if spatial_relation(a, b) in ("left", "right"):
            w.update({_t_there_is: 8.0, _t_rel_full: 5.0})
        else:
            w.update({_t_the_is: 8.0, _t_sits: 4.0})
        if a.size != b.size:
            w[_t_rel_size] += 4.0
    weights = np.array([w[t] for t in TEMPLATES])
    return weights / weights.sum()


def make_captions(rng: np.random.Generator, objects: Sequence[ShapeObject], count: int = 5) -> list[str]:
    """`count` distinct truthful captions, cycling through the templates in a random, scene-weighted order."""
    order = rng.choice(len(TEMPLATES), size=len(TEMPLATES), replace=False, p=template_weights(objects))
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
