"""CHAIR, object hallucination in captions (Rohrbach, Hendricks et al., EMNLP 2018).

Each object word of a generated caption is a *mention* (the words as written and the object they name); a mention is
hallucinated when its object is not among the image's objects. As the paper defines them and its code counts:

    CHAIR_i = hallucinated mentions / all mentions, over every caption (each mention counts, repeats too)
    CHAIR_s = captions with at least one hallucinated mention / captions

and per caption CHAIR_i over its own mentions (0 without any) and CHAIR_s 0 or 1. Lower is better.

On `shapes` an object word is a shape noun (singular or plural) and the object it names is that shape, with its
colour where the word just before it is a colour ("a red circle": a red circle; "the circle is red": a circle of
any colour). The image's objects come from its annotation's `word_boxes`: each box of a shape noun is one object,
whose colour is the colour word listing the same box. On COCO the mentions and objects are
`captioning.metrics.chair_coco`'s (Rohrbach et al.'s synonym list and double-word rules).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from captioning.data.shapes.captions import COLOURS, SHAPES

Mention = tuple[str, str]  # (the words as written, the object they name)

PLURALS = {f"{s}es" if s.endswith("s") else f"{s}s": s for s in SHAPES}  # crosses, circles, squares, triangles


@dataclass(frozen=True)
class ChairScores:
    """Corpus CHAIR_i, CHAIR_s and the number of mentions (`chair_mentions`); per image its CHAIR_i, CHAIR_s and
    `hallucinated`, the hallucinated mentions as written, in caption order."""

    overall: dict[str, float]
    per_image: dict[Any, dict[str, Any]] = field(default_factory=dict)


def chair_scores(mentions: Mapping[Any, Sequence[Mention]], present: Mapping[Any, Collection[str]]) -> ChairScores:
    """CHAIR over captions given as their mentions (image -> mentions), against each image's objects.

    CHAIR_i is NaN (not a number: undefined) when no caption mentions any object. An image without an entry in
    `present` is refused: it would count every mention as hallucinated."""
    missing = [image for image in mentions if image not in present]
    if missing:
        raise ValueError(f"CHAIR: no object list for {len(missing)} captioned image(s), e.g. image {missing[0]}")
    per_image: dict[Any, dict[str, Any]] = {}
    total = wrong = bad_captions = 0
    for image, found in mentions.items():
        hallucinated = [words for words, obj in found if obj not in present[image]]
        total, wrong, bad_captions = total + len(found), wrong + len(hallucinated), bad_captions + bool(hallucinated)
        per_image[image] = {"CHAIR_i": len(hallucinated) / len(found) if found else 0.0,
                            "CHAIR_s": float(bool(hallucinated)), "hallucinated": hallucinated}
    overall = {"CHAIR_i": wrong / total if total else math.nan,
               "CHAIR_s": bad_captions / len(mentions) if mentions else math.nan, "chair_mentions": total}
    return ChairScores(overall, per_image)


def shapes_mentions(words: Sequence[str]) -> list[Mention]:
    """The object words of a `shapes` caption (tokens): each shape noun, with the colour word just before it."""
    out: list[Mention] = []
    for k, word in enumerate(words):
        shape = word if word in SHAPES else PLURALS.get(word)
        if shape is None:
            continue
        colour = words[k - 1] if k > 0 and words[k - 1] in COLOURS else None
        out.append((f"{colour} {word}", f"{colour} {shape}") if colour else (word, shape))
    return out


def shapes_objects(word_boxes: Mapping[str, Sequence[Sequence[float]]]) -> set[str]:
    """An image's objects from its `shapes` annotation: each shape it holds, alone and with its colour."""
    out: set[str] = set()
    for shape in SHAPES:
        for box in word_boxes.get(shape, []):
            out.add(shape)
            out.update(f"{c} {shape}" for c in COLOURS if list(box) in [list(b) for b in word_boxes.get(c, [])])
    return out


def chair_on_shapes(words: Mapping[Any, Sequence[str]], word_boxes: Mapping[Any, Mapping[str, Any]]) -> ChairScores:
    """CHAIR of `shapes` captions (image -> tokens) against each image's objects in its annotation's word boxes."""
    return chair_scores({i: shapes_mentions(w) for i, w in words.items()},
                        {i: shapes_objects(b) for i, b in word_boxes.items()})


def is_shapes_annotation(word_boxes: Mapping[str, Any]) -> bool:
    """Whether an image's word boxes are `shapes`' (shape nouns and colour words only, at least one shape)."""
    return bool(word_boxes) and set(word_boxes) <= {*SHAPES, *COLOURS} and any(s in word_boxes for s in SHAPES)
