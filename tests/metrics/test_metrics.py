"""coco-caption scores: identical to calling pycocoevalcap directly; tokenizers; input validation.

Java is started as few times as possible (a PTB tokenizer run takes ~0.4 s, a METEOR run ~9 s):
the pycocoevalcap reference scores and the library's Java scores are computed once per module.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
from fixtures import HAS_JAVA, needs_java

from captioning.metrics import (
    PUNCTUATIONS,
    VALID_METRICS,
    CaptionScores,
    java_ptb_tokenize,
    ptb_tokenize,
    score_captions,
)
from captioning.metrics import java as java_tools

# ------------------------------------------------------------------------------------------------
# A small, realistic evaluation set: 30 images, 5 references each, candidates with mixed casing and
# punctuation, one empty candidate and one made only of punctuation (both tokenize to nothing).
# ------------------------------------------------------------------------------------------------
DATA: list[tuple[str, list[str]]] = [
    ("A man riding a wave on top of a surfboard.",
     ["A man riding a wave on top of a surfboard.", "A surfer rides a large wave in the ocean.",
      "a person on a surf board riding a wave", "The surfer is catching a wave!",
      "A man surfing on a big, blue wave."]),
    ("a young boy in a t-shirt holding a Frisbee",
     ["A young boy holding a frisbee in a park.", "A boy in a red T-shirt holds a Frisbee.",
      "a little boy is playing with a frisbee", "A child with a frisbee standing on the grass.",
      "Young boy, wearing a t-shirt, holding a white frisbee."]),
    ("Two giraffes standing next to each other in a field",
     ["Two giraffes standing next to each other in a field.", "A pair of giraffes in a grassy field.",
      "two giraffes are standing near some trees", "Giraffes (two of them) stand in the grass.",
      "TWO GIRAFFES IN AN OPEN FIELD."]),
    ("A woman's hand holding a cell phone.",
     ["A woman is holding a cell phone in her hand.", "A hand holding a smart phone.",
      "Someone's hand holding a black cellphone.", "a person holding a phone with both hands",
      "A close-up of a woman's hand with a phone."]),
    ("a plate of food with broccoli , carrots and rice",
     ["A plate of food with broccoli, carrots and rice.", "Rice, broccoli and carrots on a white plate.",
      "A healthy meal: rice & vegetables.", "a plate topped with rice and vegetables",
      "A dinner plate with chicken, rice, and broccoli."]),
    ("The cat is laying on the laptop's keyboard.",
     ["A cat laying on the keyboard of a laptop.", "The cat is sleeping on a laptop.",
      "a cat lying on top of an open laptop computer", "A grey cat rests on the laptop's keys.",
      "Cat on a laptop keyboard... again!"]),
    ('A red stop sign that says "STOP" on a pole.',
     ['A stop sign on a pole next to a street.', 'A red "STOP" sign at an intersection.',
      "a stop sign with graffiti on it", "The stop sign is red and white.", "A street corner with a stop sign."]),
    ("A kitchen with stainless steel appliances & granite counters",
     ["A kitchen with stainless steel appliances and granite counter tops.", "A modern kitchen with a stove & fridge.",
      "an empty kitchen with wooden cabinets", "The kitchen has a refrigerator, a stove, and a microwave.",
      "A clean kitchen w/ stainless appliances."]),
    ("a bus driving down a city street",
     ["A bus (number 42) driving down a street.", "A city bus on a busy street.",
      "a red double-decker bus driving down the road", "The bus is driving past some buildings.",
      "A public transit bus stopped at a bus stop."]),
    ("People walking through an outdoor market...",
     ["People walking through an outdoor market.", "A crowd of people at a farmers' market.",
      "shoppers browsing fruit stands at a market", "Many people shopping at an open-air market...",
      "A busy street market with lots of people."]),
    ("A man in a suit and tie posing for a picture",
     ["A man in a suit and tie posing for a picture.", "A businessman wearing a black suit & red tie.",
      "a man dressed in a suit smiling", "Mr. Smith poses in his suit.", "A well-dressed man stands in a hallway."]),
    ("A herd of sheep grazing on a lush green hillside",
     ["A herd of sheep grazing on a lush green hillside.", "Sheep graze in a field on a hill.",
      "a flock of sheep eating grass", "Several sheep (white) on a green hill side.", "Sheep in a pasture."]),
    ("a pizza with pepperoni , mushrooms , and olives .",
     ["A pizza with pepperoni, mushrooms, and olives.", "A large pizza topped with lots of toppings.",
      "a pepperoni pizza sitting on a table", "Pizza with mushrooms & black olives on a pan.",
      "A pizza that's been cut into 8 slices."]),
    ("A tennis player is about to hit the ball.",
     ["A tennis player is about to hit the ball.", "A woman swinging a tennis racket at a ball.",
      "a man playing tennis on a clay court", "The tennis player hits a forehand!", "A player on a tennis court."]),
    ("a teddy bear sitting on top of a bed",
     ["A teddy bear sitting on top of a bed.", "A brown teddy bear on a bed's pillow.",
      "a stuffed animal laying on a bed", "The teddy-bear is on the bed.", "A toy bear sits on the white sheets."]),
    ("A clock tower that reads 3:45 p.m.",
     ["A clock tower in the middle of a city.", "The clock tower reads 3:45.", "a tall tower with a clock on it",
      "A large clock on the side of a building.", "An old clock tower against a blue sky."]),
    ("",
     ["A yellow school bus parked in a lot.", "A school bus parked on the side of the road.",
      "a yellow bus in a parking lot", "The school bus is empty.", "A big yellow bus."]),
    ("...",
     ["Several boats docked in a harbor at sunset.", "Boats in the water at a marina.", "a harbor full of boats",
      "Sailboats docked at a pier.", "Many boats (sail and motor) at the dock."]),
    ("A horse-drawn carriage on a cobblestone street.",
     ["A horse-drawn carriage on a cobblestone street.", "A horse pulling a carriage down the road.",
      "a carriage pulled by two horses", "Horses and a buggy in an old town.", "A white horse & carriage."]),
    ("A baseball player swinging a bat at a ball",
     ["A baseball player swinging a bat at a ball.", "A batter swings at the pitch.",
      "a man playing baseball in a stadium", "The hitter is at bat during a game.",
      "Baseball player hitting the ball!"]),
    ("an elephant walking through a grassy field",
     ["An elephant walking through a grassy field.", "A large elephant in the grass.",
      "an elephant standing near some trees", "The elephant is walking alone.", "A big grey elephant in the wild."]),
    ("A bathroom w/ a toilet , sink & mirror .",
     ["A bathroom with a toilet, sink and mirror.", "A small bathroom with white tiles.", "a toilet next to a sink",
      "The bathroom has a shower & a toilet.", "A clean, white bathroom."]),
    ("A man is skiing down a snowy slope!",
     ["A man is skiing down a snowy slope.", "A skier going down a mountain.", "a person on skis in the snow",
      "Skier (in red) racing downhill.", "A man skis down the hill..."]),
    ("A vase with flowers in it on a table",
     ["A vase with flowers in it on a table.", "Flowers in a glass vase.", "a vase full of red roses",
      "The table has a vase of flowers on it.", "A bouquet of flowers in a vase."]),
    ("A boy and his dog playing with a Frisbee in the park",
     ["A boy and his dog playing with a frisbee in the park.", "A dog catching a frisbee.",
      "a kid throwing a frisbee to his dog", "The dog's jumping for the Frisbee!", "Boy & dog play in a park."]),
    ("Two zebras grazing in the grass at the zoo.",
     ["Two zebras grazing in the grass at the zoo.", "Zebras eating grass in an enclosure.",
      "two zebras standing together", "A pair of zebras in a field.", "The zebras are grazing."]),
    ("a fire hydrant on the side of a street",
     ["A fire hydrant on the side of a street.", "A red fire hydrant near the curb.",
      "a yellow hydrant on a sidewalk", "The fire-hydrant is painted red.", "A hydrant next to the road."]),
    ("A computer monitor, keyboard, and mouse on a desk",
     ["A computer monitor, keyboard, and mouse on a desk.", "A desk with a computer on it.",
      "a desktop computer setup in an office", "A cluttered desk with a computer, lamp, etc.",
      "The monitor is on; the keyboard's in front."]),
    ("A train going past some buildings in a city.",
     ["A train going past some buildings in a city.", "A green and white train on the tracks.",
      "a passenger train traveling through town", "The train is pulling into the station.",
      "A train (commuter) passes by."]),
    ("Pizza slices on a cutting board",
     ["Pizza slices on a cutting board.", "Slices of pizza on a wooden board.", "a cut pizza on a table",
      "Two slices of cheese pizza.", "A pizza that's been sliced up."]),
]
CANDIDATES = {100 + i: cand for i, (cand, _) in enumerate(DATA)}
REFERENCES = {100 + i: refs for i, (_, refs) in enumerate(DATA)}
EMPTY_IDS = [100 + i for i, (cand, _) in enumerate(DATA) if cand in ("", "...")]
BLEU = VALID_METRICS["bleu"]


def _pycocoevalcap_scores(candidates: dict, references: dict) -> tuple[dict, dict]:
    """The reference numbers: pycocoevalcap called directly, the way COCOEvalCap.evaluate does."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    gts = {k: [{"caption": c} for c in references[k]] for k in candidates}
    res = {k: [{"caption": candidates[k]}] for k in candidates}
    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize(gts)
    res = tokenizer.tokenize(res)
    overall: dict[str, float] = {}
    per_image: dict = {k: {} for k in gts}
    meteor = Meteor()
    try:
        scorers = [(Bleu(4), list(BLEU)), (meteor, "METEOR"), (Rouge(), "ROUGE_L"), (Cider(), "CIDEr")]
        for scorer, method in scorers:
            score, scores = scorer.compute_score(gts, res)
            if isinstance(method, list):
                for sc, scs, m in zip(score, scores, method):
                    overall[m] = sc
                    for k, s in zip(gts.keys(), scs):
                        per_image[k][m] = s
            else:
                overall[method] = score
                for k, s in zip(gts.keys(), scores):
                    per_image[k][method] = s
    finally:
        meteor.__del__()
    return overall, per_image


@pytest.fixture(scope="module")
def reference_scores() -> tuple[dict, dict]:
    if not HAS_JAVA:
        pytest.skip("needs Java")
    return _pycocoevalcap_scores(CANDIDATES, REFERENCES)


@pytest.fixture(scope="module")
def java_scores() -> CaptionScores:
    if not HAS_JAVA:
        pytest.skip("needs Java")
    return score_captions(CANDIDATES, REFERENCES, tokenizer="ptb-java")


# ------------------------------------------------------------------------------------------------
# Identical to pycocoevalcap
# ------------------------------------------------------------------------------------------------
@pytest.mark.integration
@needs_java
def test_overall_scores_identical_to_pycocoevalcap(java_scores: CaptionScores, reference_scores) -> None:
    overall, _ = reference_scores
    assert java_scores.tokenizer == "ptb-java"
    assert java_scores.skipped == {}
    assert set(java_scores.overall) == {*BLEU, "METEOR", "ROUGE_L", "CIDEr"}
    for name in (*BLEU, "ROUGE_L", "CIDEr"):
        assert java_scores.overall[name] == pytest.approx(float(overall[name]), rel=0, abs=1e-12), name
    assert java_scores.overall["METEOR"] == pytest.approx(overall["METEOR"], rel=0, abs=1e-6)
    # plausible magnitudes for a good captioner on its own references
    assert 0.5 < java_scores.overall["Bleu_1"] < 1.0
    assert 0.0 < java_scores.overall["Bleu_4"] < java_scores.overall["Bleu_1"]
    assert java_scores.overall["CIDEr"] > 1.0


@pytest.mark.integration
@needs_java
def test_per_image_scores_identical_to_pycocoevalcap(java_scores: CaptionScores, reference_scores) -> None:
    _, per_image = reference_scores
    assert list(java_scores.per_image) == list(CANDIDATES)  # keyed and ordered like the candidates
    for key, scores in java_scores.per_image.items():
        for name in (*BLEU, "ROUGE_L", "CIDEr"):
            assert scores[name] == pytest.approx(float(per_image[key][name]), rel=0, abs=1e-12), (key, name)
        assert scores["METEOR"] == pytest.approx(per_image[key]["METEOR"], rel=0, abs=1e-6), key


@pytest.mark.integration
@needs_java
def test_empty_candidates_score_zero(java_scores: CaptionScores) -> None:
    # "" and "..." tokenize to nothing; pycocoevalcap scores them 0 on every metric (no special rule)
    assert len(EMPTY_IDS) == 2
    for key in EMPTY_IDS:
        assert java_scores.per_image[key] == {name: 0.0 for name in java_scores.overall}


def _meteor_children() -> list[str]:
    """Command lines of this process's child processes running the METEOR jar."""
    me, found = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[1]) == me and "meteor" in cmdline.lower():
            found.append(cmdline)
    return found


@pytest.mark.integration
@needs_java
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_no_meteor_process_left_behind(java_scores: CaptionScores) -> None:
    assert "METEOR" in java_scores.overall
    assert _meteor_children() == []


def test_meteor_closed_even_after_a_failure() -> None:
    """close_meteor releases the lock a failed compute_score left held, then runs the shutdown."""

    class FakeMeteor:
        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.closed = 0

        def __del__(self) -> None:  # pycocoevalcap 1.2's shutdown path: acquires the lock
            if self.lock.acquire(timeout=5):
                self.closed += 1
                self.lock.release()

    fake = FakeMeteor()
    fake.lock.acquire()  # as if compute_score raised half-way
    java_tools.close_meteor(fake)
    assert fake.closed == 1
    assert not fake.lock.locked()


# ------------------------------------------------------------------------------------------------
# Python tokenizer
# ------------------------------------------------------------------------------------------------
@pytest.mark.integration
@needs_java
def test_python_tokenizer_gives_the_same_scores(java_scores: CaptionScores) -> None:
    py = score_captions(CANDIDATES, REFERENCES, metrics=("bleu", "rouge", "cider"), tokenizer="python")
    assert py.tokenizer == "python"
    for name in (*BLEU, "ROUGE_L", "CIDEr"):
        assert py.overall[name] == java_scores.overall[name], name
        for key in CANDIDATES:
            assert py.per_image[key][name] == java_scores.per_image[key][name], (key, name)


# ~150 realistic captions covering apostrophes, hyphens, numbers, quotes, parentheses, trailing and
# inner periods, runs of spaces, non-ASCII letters, ellipses, slashes, ampersands and abbreviations.
TOKENIZER_CAPTIONS = [
    "A man's dog.", "Don't walk sign at an intersection.", "There's a cat sleeping on the couch.",
    "It's a sunny day at the park.", "Dogs' toys scattered on the floor.", "I think this is a man's bathroom.",
    "The kids are playing soccer at St. Mary's school.", "A truck that's carrying a load of hay.",
    "A zebra that's standing next to a zebra that is eating.", "They'll be riding the bus, won't they?",
    "We're looking at a cat; it isn't moving.", "You've got a dog who's wearing a hat",
    "A young boy in a t-shirt holding a Frisbee", "A red double-decker bus on a city street.",
    "A 2-year-old child playing with toys.", "A close-up of a donut with sprinkles.",
    "Half-eaten pizza on a plate.", "A man who is about to eat a hot-dog.", "A horse-drawn carriage - in the city.",
    "A bicycle leaning against a wall -- in the city.", "A person in a wet-suit riding a surf board.",
    "A Boeing 777-200 airplane on the runway.", "A bottle of wine costs $25.99 at the store.",
    "A pile of 2.5 inch bolts.", "The bus is number 3,000 in the fleet?", "There are 4 cows in the field.",
    "An old-fashioned clock that reads 10:30.", "The clock tower reads 3:45 p.m.", "A 1950's style car.",
    "People waiting on the platform for the 5:15 train.", "A player in a #23 jersey about to throw the ball",
    "About 50% of the pizza is gone.", "A recipe calls for 1/2 cup of sugar and 1 1/2 cups of flour.",
    'A sign that says "STOP" on a pole.', 'The word "LOVE" painted on a wall.',
    "A man holding a sign that reads 'free hugs'.", 'A sign that reads: "Welcome to the U.S."',
    '"A man standing on a tennis court holding a racquet."', "a man with a 'frisbee' in his hand",
    "“Smart quotes” around a ‘word’ and a man’s hat.", "a bus (number 42) driving down a street",
    "Three men playing video games (Wii) in a living room.", "a little girl holding a ( pink ) umbrella",
    "Two surfers (one in red) waiting for a wave.", "A box [empty] and a {brace}.",
    "A man riding a wave on top of a surfboard.", "a little girl eating a slice of pizza .",
    "A parking meter on a city sidewalk.They are blue.", "A dog.A cat. A bird", "the letter a. is on the sign",
    "A street sign for 5th Ave. and W. 23rd St.", "Mr. Smith sits at his desk.", "Dr. Who and the TARDIS.",
    "A cluttered desk with a computer, lamp, etc.", "A desk, a lamp, etc. The room is dark.",
    "A flag of the U.S. on a pole.", "The U.S. flag. The end", "e.g. a cat, i.e. a pet", "at 5 a.m. today",
    "The dog's face   looking at the camera.", "  A man  on a horse", "The cat is laying in a suitcase ",
    "An orange cat laying on top of a  white blanket.", "A\ttab separated caption",
    "A café with tables and chairs outside.", "A naïve painting of a cow on a wall.", "Crème brûlée on a plate.",
    "A street in Zürich with a tram.", "A façade of an old building in São Paulo.",
    "People walking through an outdoor market...", "A plate of spaghetti and meatballs.... yum",
    "Two kids playing with toy trucks in the dirt...", "Wait... is that a dog?", "A cake … with candles",
    "A birthday cake with candles on it...", "A boy . . . and a dog", "Two people on a motorcycle/scooter.",
    "a toilet that is in a stall / bathroom", "Cows graze in a field w/ trees in the background.",
    "A bowl of soup w/ a spoon and/or a fork", "A speed limit of 30 km/h.",
    "A kitchen with stainless steel appliances & granite counters.", "A bathroom w/ a toilet, sink & mirror.",
    "Salt&pepper shakers on a table", "An AT&T store on the corner.", "A sign for R&B music &amp; more",
    "A snowboarder jumps over a hill!!", "Is that a cat or a dog?!", "What a nice kitchen?",
    "The motorcycle is parked by the curb, near a stop sign!", "A bowl of fruit: apples, bananas and oranges.",
    "A laptop on a desk; next to it is a mouse.", "a plane is flying over a city ; it is large",
    "a plate with food that includes a hamburger,fries and a drink", "A CAT SITTING ON TOP OF A CAR.",
    "A man cannot find his keys.", "They're gonna eat the pizza.", "I wanna go to the beach.",
    "A sign reading \"No Parking 7am-9am Mon-Fri\"", "A Jack-o'-lantern on a porch at 8 o'clock.",
    "Rock'n'roll band on stage.", "A dog in the '90s.", "A man (age 30-40) with a dog.",
    "A pizza, 12\" wide.", "A TV that's on.", "A man with a sign: #1 dad!", "The score is 3-2.",
    "A 10-year-old boy and his 5-year-old sister.", "A cat :) on a mat", "A sign for www.example.com",
    "An e-mail address contact@example.org on a truck", "A £5 note and a €10 bill", "A kitchen with a 3D TV.",
    "A street with a No. 5 bus.", "No. I don't think so.", "A building on St. Louis Ave.",
    "A group of people standing around a table with food on it.", "A baseball player swinging a bat at a ball.",
    "Two zebras grazing in the grass at the zoo.", "A woman is holding an umbrella in the rain.",
    "The train is pulling into the station.", "A man and a woman sitting on a bench.",
    "A close up of a sandwich on a plate", "a giraffe that is standing in the dirt",
    "A large jetliner flying through a blue sky.", "An elephant walking through a grassy field",
    "A herd of sheep grazing on a lush green hillside.", "A man is skiing down a snowy slope.",
    "The skateboarder is doing a trick on a ramp.", "A teddy bear sitting on top of a bed.",
    "a person holding a hot dog with ketchup & mustard", "Some people are flying kites at the beach.",
    "A vase with flowers in it on a table.", "A tennis player is about to hit the ball.",
    "A kitchen that has a refrigerator, stove, and microwave in it.",
    "A stop sign with graffiti on it that says \"eat\".", "A cat is sitting in a bathroom sink",
    "Two horses pulling a cart down a dirt road.", "An airplane at the airport gate, ready for boarding.",
    "A yellow school bus parked in a lot.", "Several boats docked in a harbor at sunset.",
    "A person is cutting a cake with a knife.", "A computer monitor, keyboard, and mouse on a desk.",
    "A living room filled with furniture and a TV.", "A small dog is wearing a Santa hat.",
    "A bunch of bananas hanging from a hook.", "The dog is catching a frisbee in mid-air.",
    "The woman is holding a wii remote and smiling .", "Two cats laying on a bed next to each other .",
    "A cake that says Happy Birthday Sam!", "A traffic light that is red.", "",
]


@pytest.mark.integration
@needs_java
def test_python_tokenizer_matches_the_java_tokenizer() -> None:
    """Same tokens as pycocoevalcap's own PTBTokenizer (Java) on realistic captions.

    No caption is excluded: the known differences listed in captioning/metrics/tokenizer.py concern
    text that does not occur in captions.
    """
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    assert len(TOKENIZER_CAPTIONS) >= 100
    # one image per caption, and also all captions of one image: the Java tool scans the file as one
    # stream, so a caption's tokens can depend on the next caption's first characters
    per_caption = {i: [c] for i, c in enumerate(TOKENIZER_CAPTIONS)}
    java = PTBTokenizer().tokenize({i: [{"caption": c} for c in caps] for i, caps in per_caption.items()})
    python = ptb_tokenize(per_caption)
    mismatches = [(TOKENIZER_CAPTIONS[i], java[i][0], python[i][0]) for i in per_caption if java[i] != python[i]]
    assert mismatches == []


# Java-independent check: outputs of stanford-corenlp-3.4.1.jar (after coco-caption's punctuation
# removal) recorded with pycocoevalcap's PTBTokenizer.
KNOWN_TOKENIZATIONS = [
    ("A man's dog.", "a man 's dog"),
    ("I don't know, can't say; won't go!", "i do n't know ca n't say wo n't go"),
    ("A young boy in a T-shirt holding a Frisbee.", "a young boy in a t-shirt holding a frisbee"),
    ("It costs $5 or 5% or 2.5 dollars or 3,000 yen at 10:30 pm.",
     "it costs $ 5 or 5 % or 2.5 dollars or 3,000 yen at 10:30 pm"),
    ("He said \"hello\" and 'bye' to them.", "he said hello and bye to them"),
    ("A dog (brown) [big] {nice}", "a dog -lrb- brown -rrb- -lsb- big -rsb- -lcb- nice -rcb-"),
    ("A man.  A dog.   Many   spaces", "a man a dog many spaces"),
    ("Café naïve Zürich", "café naïve zürich"),
    ("Wait... what.... ok …", "wait what ok"),
    ("and/or w/ km/h", "and/or w / km/h"),
    ("Salt & pepper &amp; AT&T at&t", "salt & pepper & at&t at & t"),
    ("cannot gonna wanna 'tis", "can not gon na wan na 't is"),
    ("Mr. Smith on St. Mary's St. in the U.S. The end", "mr. smith on st. mary 's st. in the u.s. the end"),
    ("the letter a. and b.", "the letter a. and b."),
    ("No. 5 and No. x", "no. 5 and no x"),
    ("It's the dogs' bone at 5 o'clock, rock'n'roll", "it 's the dogs bone at 5 o'clock rock 'n' roll"),
    ("a 10-year-old boy in the 1990's and '90s", "a 10-year-old boy in the 1990 's and '90s"),
    ("“Smart quotes” ‘single’ – en — em", "smart quotes single en em"),
    ("½ cup and 1 1/2 cups", "1/2 cup and 1\xa01/2 cups"),
    (":) ;-) :(", ":-rrb- ;--rrb- :-lrb-"),
    ("Hi!!! What?? Yes?!", "hi !!! what ?? yes ?!"),
    ("A cluttered desk with a computer, lamp, etc.", "a cluttered desk with a computer lamp etc."),
    ("A man.a dog sign.The end", "a man.a dog sign.the end"),
    ("The year 2014 2015 2016 was good", "the year 2014\xa02015\xa02016 was good"),
    ("e-mail e.g. i.e. a.m. p.m.", "e-mail e.g. i.e. a.m. p.m."),
    ("£5 €10 ¢", "# 5 $ 10 cents"),
    ("c++ and C# code", "c++ and c# code"),
    ("#hashtag @user www.example.com", "#hashtag @user www.example.com"),
    ("image.jpg x.y", "image.jpg x.y"),
]


def test_python_tokenizer_known_outputs() -> None:
    captions = {i: [c] for i, (c, _) in enumerate(KNOWN_TOKENIZATIONS)}
    out = ptb_tokenize(captions)
    assert [out[i][0] for i in range(len(KNOWN_TOKENIZATIONS))] == [t for _, t in KNOWN_TOKENIZATIONS]


def test_python_tokenizer_structure() -> None:
    out = ptb_tokenize({"a": ["A dog.", "", "..."], 7: []})
    assert out == {"a": ["a dog", "", ""], 7: []}
    assert "." in PUNCTUATIONS and "-LRB-" in PUNCTUATIONS
    with pytest.raises(TypeError):
        ptb_tokenize({1: "not a list"})  # type: ignore[dict-item]


@pytest.mark.integration
@needs_java
def test_java_wrapper_line_breaks_and_non_ascii() -> None:
    """Line breaks inside a caption become spaces (no misaligned captions); UTF-8 round-trips."""
    caps = {1: ["A dog\r\nrunning.", "x"], 2: ["b\u2028c", ""], 3: ["a\rb\x0bc\x0cd"],
            4: ["Crème brûlée “quoted” – naïve café"]}
    expected = {1: ["a dog running", "x"], 2: ["b c", ""], 3: ["a b c d"], 4: ["crème brûlée quoted naïve café"]}
    assert java_ptb_tokenize(caps) == expected
    assert ptb_tokenize(caps) == expected


# ------------------------------------------------------------------------------------------------
# Behaviour and sanity values (python tokenizer: no Java needed, fast)
# ------------------------------------------------------------------------------------------------
def test_identical_candidate_scores_one() -> None:
    refs = {1: ["a man riding a horse on a beach"] * 5, 2: ["two dogs playing with a red ball in the park"] * 5}
    cands = {1: "A man riding a horse on a beach.", 2: "Two dogs playing with a red ball in the park"}
    s = score_captions(cands, refs, metrics=("bleu", "rouge"), tokenizer="python")
    assert s.overall["Bleu_4"] == pytest.approx(1.0, abs=1e-6)
    assert s.overall["Bleu_1"] == pytest.approx(1.0, abs=1e-6)
    assert s.overall["ROUGE_L"] == 1.0
    assert all(v["ROUGE_L"] == 1.0 for v in s.per_image.values())


def test_only_candidate_ids_are_scored() -> None:
    cands = {k: CANDIDATES[k] for k in list(CANDIDATES)[:10]}
    base = score_captions(cands, {k: REFERENCES[k] for k in cands}, metrics=("bleu", "cider"), tokenizer="python")
    more = score_captions(cands, REFERENCES, metrics=("bleu", "cider"), tokenizer="python")
    assert base.overall == more.overall
    assert list(more.per_image) == list(cands)


def test_empty_candidates_python_path() -> None:
    s = score_captions(CANDIDATES, REFERENCES, metrics=("bleu", "rouge", "cider"), tokenizer="python")
    for key in EMPTY_IDS:
        assert s.per_image[key] == {name: 0.0 for name in s.overall}


def test_metric_names_are_case_insensitive_and_deduplicated() -> None:
    s = score_captions({1: "a dog"}, {1: ["a dog runs"]}, metrics=("ROUGE", "rouge", "Cider"), tokenizer="python")
    assert list(s.overall) == ["ROUGE_L", "CIDEr"]


# ------------------------------------------------------------------------------------------------
# Errors and skipped metrics
# ------------------------------------------------------------------------------------------------
def test_unknown_metric_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="bleu, meteor, rouge, cider, spice"):
        score_captions({1: "a dog"}, {1: ["a dog"]}, metrics=("bleu", "wer"))


@pytest.mark.parametrize(
    ("candidates", "references", "message"),
    [
        ({1: "a dog", 2: "a cat"}, {1: ["a dog"]}, "have no references: 2"),
        ({1: "a dog"}, {1: []}, "empty reference list"),
        ({1: ["a", "dog"]}, {1: ["a dog"]}, "must be a str"),
        ({1: None}, {1: ["a dog"]}, "must be a str"),
        ({1: "a dog"}, {1: ["a dog", 3]}, "must be a str"),
        ({1: "a dog"}, {1: "a dog"}, "list of strings"),
        ({}, {1: ["a dog"]}, "no candidate"),
    ],
)
def test_invalid_inputs(candidates, references, message) -> None:
    with pytest.raises(ValueError, match=message):
        score_captions(candidates, references, tokenizer="python")


def test_unknown_tokenizer() -> None:
    with pytest.raises(ValueError, match="auto, ptb, ptb-java, python, whitespace, char"):
        score_captions({1: "a dog"}, {1: ["a dog"]}, tokenizer="spacy")


def test_without_java(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    s = score_captions(CANDIDATES, REFERENCES)  # tokenizer="auto", default metrics include METEOR
    assert s.tokenizer == "python"
    assert "METEOR" not in s.overall
    assert "Java" in s.skipped["METEOR"]
    assert set(s.overall) == {*BLEU, "ROUGE_L", "CIDEr"}
    assert all("METEOR" not in v for v in s.per_image.values())
    with pytest.raises(RuntimeError, match="needs Java"):
        score_captions(CANDIDATES, REFERENCES, tokenizer="ptb-java")


def test_spice_is_computed_or_skipped_with_instructions(monkeypatch: pytest.MonkeyPatch) -> None:
    if HAS_JAVA and java_tools.spice_models_present():
        pytest.skip("SPICE is installed here; running it takes minutes")
    s = score_captions({1: "a dog"}, {1: ["a dog runs"]}, metrics=("spice", "rouge"), tokenizer="python")
    assert "SPICE" not in s.overall and "ROUGE_L" in s.overall
    reason = s.skipped["SPICE"]
    assert "internet" in reason and "Java 8" in reason and "Spice()" in reason


def test_caption_diversity_counts_openings_and_words():
    from captioning.metrics import caption_diversity

    caps = [s.split() for s in ("there is a red circle", "there is a blue square", "the red circle is above",
                                "there is a red circle", "three shapes including a cross")]
    d = caption_diversity(caps)
    assert d == {"distinct_captions": 4 / 5, "top_caption_share": 2 / 5, "distinct_openings": 3,
                 "top_opening_share": 3 / 5, "vocabulary_used": len({w for c in caps for w in c})}
    assert caption_diversity([])["distinct_openings"] == 0


def test_a_caption_for_more_than_the_share_of_the_images_is_a_collapse():
    from captioning.metrics import collapse_note, collapsed_caption

    caps = [s.split() for s in ("a red circle", "a blue square", "a red circle", "a red circle")]
    assert collapsed_caption(caps, 0.5) == "a red circle"  # 3 of 4 > 0.5
    assert collapsed_caption(caps, 0.75) is None  # exactly the share is not more than it
    assert collapsed_caption(caps[:2], 0.4) == "a red circle"  # a tie: the first given (1 of 2 > 0.4)
    assert collapsed_caption(caps, 1.0) is None and collapsed_caption([], 0.0) is None
    line = collapse_note("a red circle", 0.75, 4, 0.5)
    assert line == ('one caption for 75% of the 4 images (over eval.collapse_share=0.5): "a red circle": the '
                    "model may have collapsed onto one caption")
    assert "\n" not in line and "collapse_share" not in collapse_note("a red circle", 0.75, 4)
