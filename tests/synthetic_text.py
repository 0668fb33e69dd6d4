"""Realistic COCO-like caption text, generated deterministically, for metric parity tests and benchmarks.

`realistic_corpus` describes random scenes (subject, action, object, place) several ways each, as crowd workers
write COCO captions: mixed casing and final punctuation, apostrophes, hyphens, numbers, "&", parentheses, quotes,
a few non-ASCII words (café, jalapeño, São Paulo) and lengths from a few words to twenty. Each image gets
`refs_per_image` references and one candidate caption that overlaps them partially: mostly the same scene with
one or two parts changed, sometimes an unrelated scene, rarely an empty caption. This is the text that
tests/metrics/test_metrics_parity.py scores against pycocoevalcap and experiments/bench_scoring.py times; it exercises
the tokenizer and the n-gram scorers, it is not a data set to train on (a test helper, not part of the package:
experiments/ put tests/ on their path to import it).
"""

from __future__ import annotations

import random
from typing import Any

_SUBJECTS = [
    ("a man", "A guy", "a young man", "The man"), ("a woman", "A lady", "an older woman", "The woman's friend"),
    ("two dogs", "2 dogs", "a pair of dogs", "Two puppies"), ("a little girl", "a 10-year-old girl", "A child"),
    ("a cat", "The kitty", "a grey cat", "someone's cat"), ("a group of people", "several people", "Many people"),
    ("a baseball player", "A batter", "the player"), ("a surfer", "A man on a surfboard", "a surf-boarder"),
    ("a chef", "The cook", "a chef in a white hat"), ("three giraffes", "3 giraffes", "a few giraffes"),
    ("a skier", "A person on skis", "the skier"), ("an elephant", "A big elephant", "the baby elephant"),
]
_ACTIONS = [
    ("riding", "rides"), ("holding", "holds"), ("looking at", "watches"), ("standing next to", "stands by"),
    ("sitting on", "sits on"), ("eating", "eats"), ("playing with", "plays with"), ("carrying", "carries"),
    ("walking toward", "walks to"), ("throwing", "throws"),
]
_OBJECTS = [
    ("a frisbee", "a Frisbee", "a red frisbee"), ("a skateboard", "a skate-board", "a black skateboard"),
    ("a slice of pizza", "some pizza", "a pepperoni pizza"), ("a cell phone", "a cellphone", "a smart phone"),
    ("a surfboard", "a surf board", "a long surfboard"), ("an umbrella", "a blue umbrella", "a big umbrella"),
    ("a plate of food", "a plate with broccoli & rice", "some jalapeño nachos"), ("a teddy bear", "a stuffed bear"),
    ("a kite", "a colorful kite", "two kites"), ("a laptop", "a laptop computer", "an open laptop"),
    ("a crème brûlée", "a dessert", "a small cake"), ("a bicycle", "a bike", "an old-fashioned bicycle"),
]
_PLACES = [
    ("on a beach", "near the ocean", "by the sea"), ("in a park", "in the park", "on the grass"),
    ("in a kitchen", "in the kitchen", "at a counter"), ("on a city street", "downtown", "on the sidewalk"),
    ("in a field", "in a grassy field", "out in the field"), ("at a café", "inside a café", "in a naïve art café"),
    ("in the snow", "on a snowy hill", "on a ski slope"), ("at the zoo", "in an enclosure", "at a wildlife park"),
    ("in São Paulo", "in a busy plaza", "at the market"), ("in a living room", "on a couch", "at home"),
]
_EXTRAS = [
    "", "", "", " while it's raining", " at 5 p.m.", " on a sunny day", " with a black-and-white dog",
    " in front of a building", " wearing a t-shirt", " during a game", " (in the background)",
    " next to a 3-story house", " with his friends", " at night", " that isn't moving", " on Dec. 25, 2014",
    " -- again", ' near a "no parking" sign',
]
_ENDINGS = [".", ".", ".", "", "", "!", "...", " .", "?"]


def _styled(text: str, rng: random.Random) -> str:
    """Mixed casing and final punctuation as in crowd-sourced captions."""
    text = text.strip()
    style = rng.random()
    if style < 0.55:
        text = text[0].upper() + text[1:]
    elif style < 0.6:
        text = text.upper()
    elif style < 0.65:
        text = text.title()
    if rng.random() < 0.15:
        text = text.replace(" and ", " & ").replace(" with ", ", with ")
    return text + rng.choice(_ENDINGS)


def _describe(scene: tuple[int, int, int, int], rng: random.Random) -> str:
    subject = rng.choice(_SUBJECTS[scene[0]])
    gerund, verb = _ACTIONS[scene[1]]
    obj = rng.choice(_OBJECTS[scene[2]])
    place = rng.choice(_PLACES[scene[3]])
    extra = rng.choice(_EXTRAS)
    form = rng.randrange(5)
    if form == 0:
        text = f"{subject} {gerund} {obj} {place}{extra}"
    elif form == 1:
        text = f"{subject} {verb} {obj} {place}"
    elif form == 2:
        text = f"there is {subject} {gerund} {obj}{extra}"
    elif form == 3:
        text = f"{place}, {subject} is {gerund} {obj}"
    else:
        text = f"{subject} {gerund} {obj}"
    return _styled(text, rng)


def realistic_corpus(num_images: int, seed: int = 0, refs_per_image: int = 5
                     ) -> tuple[dict[int, str], dict[int, list[str]]]:
    """(candidates, references): COCO-like raw captions for `num_images` images, deterministic in `seed`."""
    rng = random.Random(seed)
    candidates: dict[int, str] = {}
    references: dict[int, list[str]] = {}
    for n in range(num_images):
        image_id = 100_000 + 7 * n
        scene = (rng.randrange(len(_SUBJECTS)), rng.randrange(len(_ACTIONS)), rng.randrange(len(_OBJECTS)),
                 rng.randrange(len(_PLACES)))
        references[image_id] = [_describe(scene, rng) for _ in range(refs_per_image)]
        kind = rng.random()
        if kind < 0.02:
            candidates[image_id] = rng.choice(["", "..."])  # decodes to nothing after tokenization
        elif kind < 0.1:  # an unrelated scene
            other = (rng.randrange(len(_SUBJECTS)), rng.randrange(len(_ACTIONS)), rng.randrange(len(_OBJECTS)),
                     rng.randrange(len(_PLACES)))
            candidates[image_id] = _describe(other, rng)
        else:  # the same scene with one or two parts changed: partial overlap
            changed = list(scene)
            for part in rng.sample(range(4), rng.randrange(3)):
                changed[part] = rng.randrange(len((_SUBJECTS, _ACTIONS, _OBJECTS, _PLACES)[part]))
            text = _describe(tuple(changed), rng)  # type: ignore[arg-type]
            candidates[image_id] = text.lower() if rng.random() < 0.5 else text
    return candidates, references


# Karpathy's split sizes of COCO: 82,783 train + 30,504 restval / 5,000 val / 5,000 test.
COCO_SPLITS = {"train": 82_783, "restval": 30_504, "val": 5_000, "test": 5_000}


def karpathy_file(splits: dict[str, int] | None = None, seed: int = 0, refs_per_image: int = 5,
                  rare_words: int = 20_000) -> dict:
    """A Karpathy split file (as dataset_coco.json: filepath, filename, cocoid, split, sentences with raw and
    tokens) of COCO-like captions; `splits` gives the images per split (default COCO's sizes).

    One caption in three also names a rare word drawn from a Zipf-like pool of `rare_words` made-up words, so the
    file has a vocabulary of COCO's order (about 10k words seen at least five times).
    """
    from captioning.data.vocab import tokenize

    rng = random.Random(seed)
    images: list[dict[str, Any]] = []
    sentid = 0
    for split, count in (splits or COCO_SPLITS).items():
        folder = "val2014" if split in ("val", "test", "restval") else "train2014"
        for _ in range(count):
            n = len(images)
            scene = (rng.randrange(len(_SUBJECTS)), rng.randrange(len(_ACTIONS)), rng.randrange(len(_OBJECTS)),
                     rng.randrange(len(_PLACES)))
            sentences = []
            for _ in range(refs_per_image):
                raw = _describe(scene, rng)
                if rng.random() < 1 / 3:
                    raw = f"{raw.rstrip('.!? ')} near the w{int(rare_words ** rng.random())}"
                sentences.append({"tokens": tokenize(raw), "raw": raw, "imgid": n, "sentid": sentid})
                sentid += 1
            images.append({"filepath": folder, "sentids": [s["sentid"] for s in sentences],
                           "filename": f"COCO_{folder}_{100_000 + 7 * n:012d}.jpg", "imgid": n, "split": split,
                           "sentences": sentences, "cocoid": 100_000 + 7 * n})
    return {"images": images, "dataset": "coco"}
