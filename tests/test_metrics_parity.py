"""`score_captions` equals pycocoevalcap run as COCOEvalCap runs it, on hundreds of realistic captions.

The captions are generated deterministically (:func:`realistic_corpus`, also used by
``experiments/bench_scoring.py``): scenes described five ways with mixed casing, punctuation,
apostrophes, hyphens, numbers, a few non-ASCII words and varied lengths, and candidates that overlap
their references partially (some empty, some unrelated).
"""

from __future__ import annotations

import random
import shutil

import pytest

from captioning.metrics import VALID_METRICS, score_captions

HAS_JAVA = shutil.which("java") is not None
needs_java = pytest.mark.skipif(not HAS_JAVA, reason="needs Java (the coco-caption PTB tokenizer and METEOR)")
BLEU = VALID_METRICS["bleu"]
NUM_IMAGES = 400

# ------------------------------------------------------------------------------------------------
# A deterministic generator of COCO-like captions
# ------------------------------------------------------------------------------------------------
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
    " in front of a building", " wearing a t-shirt", " during a game", " (in the background)", " next to a 3-story house",
    " with his friends", " at night", " that isn't moving", " on Dec. 25, 2014", " -- again", ' near a "no parking" sign',
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


# ------------------------------------------------------------------------------------------------
# The reference: pycocoevalcap exactly as COCOEvalCap.evaluate runs it
# ------------------------------------------------------------------------------------------------
def coco_eval_scores(candidates: dict, references: dict, meteor: bool) -> tuple[dict, dict]:
    """(overall, per image) from pycocoevalcap's PTBTokenizer + Bleu(4), Meteor(), Rouge(), Cider()."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({k: [{"caption": c} for c in references[k]] for k in candidates})
    res = tokenizer.tokenize({k: [{"caption": candidates[k]}] for k in candidates})
    scorers: list = [(Bleu(4), list(BLEU)), (Rouge(), "ROUGE_L"), (Cider(), "CIDEr")]
    if meteor:
        scorers.insert(1, (Meteor(), "METEOR"))
    overall: dict = {}
    per_image: dict = {k: {} for k in gts}
    try:
        for scorer, method in scorers:
            score, scores = scorer.compute_score(gts, res)
            for name, sc, scs in (zip(method, score, scores) if isinstance(method, list) else [(method, score, scores)]):
                overall[name] = sc
                for k, s in zip(gts.keys(), scs):
                    per_image[k][name] = s
    finally:
        for scorer, _ in scorers:
            if isinstance(scorer, Meteor):
                scorer.__del__()  # pycocoevalcap 1.2 shuts the METEOR process down here
    return overall, per_image


def _assert_close(ours, overall: dict, per_image: dict, names: list[str], tol: float) -> None:
    for name in names:
        assert abs(ours.overall[name] - overall[name]) <= tol, (name, ours.overall[name], overall[name])
        worst = max(abs(ours.per_image[k][name] - per_image[k][name]) for k in per_image)
        assert worst <= tol, (name, worst)
    assert list(ours.per_image) == list(per_image)


@pytest.fixture(scope="module")
def corpus() -> tuple[dict[int, str], dict[int, list[str]]]:
    candidates, references = realistic_corpus(NUM_IMAGES, seed=0)
    references[999_999] = ["An image without a candidate is ignored."]  # as coco-caption ignores it
    return candidates, references


@pytest.fixture(scope="module")
def reference(corpus) -> tuple[dict, dict]:
    if not HAS_JAVA:
        pytest.skip("needs Java")
    return coco_eval_scores(*corpus, meteor=False)


def test_corpus_is_realistic(corpus) -> None:
    """The generated text has what the parity claim is about: casing, punctuation, non-ASCII, overlap."""
    candidates, references = corpus
    text = " ".join(c for refs in references.values() for c in refs)
    for needle in ("'s", "n't", "-", ",", "!", "...", "&", "(", '"', "é", "ñ", "2014", "10-year-old", "P.M."):
        assert needle in text, needle
    assert sum(c == c.lower() for c in candidates.values()) > NUM_IMAGES // 4
    lengths = [len(c.split()) for refs in references.values() for c in refs]
    assert min(lengths) <= 6 and max(lengths) >= 18
    assert 3 <= sum(c in ("", "...") for c in candidates.values()) <= 20
    assert realistic_corpus(20, seed=0) == realistic_corpus(20, seed=0)  # deterministic


@needs_java
def test_java_path_equals_pycocoevalcap(corpus, reference) -> None:
    ours = score_captions(*corpus, metrics=("bleu", "rouge", "cider"), tokenizer="ptb-java")
    assert ours.tokenizer == "ptb-java"
    _assert_close(ours, *reference, [*BLEU, "ROUGE_L", "CIDEr"], tol=1e-9)
    assert 0.3 < reference[0]["Bleu_4"] < 0.6 and 1.0 < reference[0]["CIDEr"] < 2.5  # a plausible regime


@needs_java
def test_java_free_path_equals_pycocoevalcap(corpus, reference, monkeypatch: pytest.MonkeyPatch) -> None:
    from captioning.metrics import coco

    monkeypatch.setattr(coco.shutil, "which", lambda name: None)  # as on a machine without Java
    ours = score_captions(*corpus, metrics=("bleu", "meteor", "rouge", "cider"))
    assert ours.tokenizer == "python"
    assert set(ours.skipped) == {"METEOR"} and "Java" in ours.skipped["METEOR"]
    _assert_close(ours, *reference, [*BLEU, "ROUGE_L", "CIDEr"], tol=1e-9)


@pytest.mark.slow
@needs_java
def test_all_metrics_with_meteor_equal_pycocoevalcap(corpus) -> None:
    """METEOR included (two METEOR 1.5 runs over 400 images: 1-3 minutes on one busy core)."""
    overall, per_image = coco_eval_scores(*corpus, meteor=True)
    ours = score_captions(*corpus, metrics=("bleu", "meteor", "rouge", "cider"), tokenizer="ptb-java")
    assert ours.skipped == {}
    _assert_close(ours, overall, per_image, [*BLEU, "ROUGE_L", "CIDEr"], tol=1e-9)
    _assert_close(ours, overall, per_image, ["METEOR"], tol=1e-6)
