"""CHAIR on COCO: which caption words name which COCO object, and each image's objects, as Rohrbach et al. count them.

The counting itself (CHAIR_i, CHAIR_s) is `captioning.metrics.chair.chair_scores`; this module gives it COCO's
mentions and objects, following the paper's released code (LisaAnne/Hallucination, utils/chair.py, BSD 2-clause):

* **Words.** A caption is lower-cased and split into words by NLTK's word tokenizer (sentence by sentence), each
  word is made singular, and two-word phrases are joined before anything is looked up (`DOUBLE_WORDS`):
  "hot dog" is a hot dog and never a dog, "teddy bear" never a bear, "baby bird" and "adult bird" are birds (not
  a person: "baby" and "adult" alone name people), "passenger train" is a train, "bow tie" a tie, "train track"
  and "home plate" name nothing. A caption that has both "toilet" and "seat" loses its "seat"s ("the seat of
  the toilet" is no chair). Every remaining word in `SYNONYMS` is a mention of its category; repeats count.
* **Objects.** An image's objects are the categories of its instance annotations (instances_*.json) together with
  the categories its reference captions mention (read as above): both, as the paper has it.
* **Synonyms.** `SYNONYMS` is the paper's synonym list (data/synonyms.txt of the release), each category's words
  in the singular with repeats removed. Its "iPhone" never matches a lower-cased caption and is left out; its
  "stove top oven" is three words, which the two-word joining never forms, and is left out too.

Two steps differ from the release in how, not in what they are for:
* the release splits sentences with NLTK's punkt model (a download); here a sentence ends at ".", "!" or "?"
  followed by a space, which is where captions end theirs;
* the release makes words singular with pattern.en's `singularize` (a package that no longer installs); here a
  word becomes singular only towards a word this module knows (a synonym, or a word of a two-word phrase): the
  irregular plurals of those words ("men", "geese", "mice", "policemen") and the regular endings (-s, -es, -ies,
  -ves). So "dogs" is "dog" and "buses" "bus", and words that name no object are left as they are. The
  release's "wine glas" rule undoes a quirk of pattern.en ("glass" -> "glas") that this does not have.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from captioning.base.jsonio import load_json
from captioning.metrics.chair import ChairScores, Mention, chair_scores

__all__ = ["SYNONYMS", "DOUBLE_WORDS", "caption_words", "coco_mentions", "caption_objects", "instance_objects",
           "coco_objects", "chair_on_coco"]

#: COCO category (as instances files name it) -> the words naming it in captions, singular (Rohrbach et al.'s list).
SYNONYMS: dict[str, tuple[str, ...]] = {
    "person": ("person", "girl", "boy", "man", "woman", "kid", "child", "chef", "baker", "people", "adult", "rider",
               "children", "baby", "worker", "passenger", "sister", "biker", "policeman", "cop", "officer", "lady",
               "cowboy", "bride", "groom", "male", "female", "guy", "traveler", "mother", "father", "gentleman",
               "pitcher", "player", "skier", "snowboarder", "skater", "skateboarder", "foreigner", "caller",
               "offender", "coworker", "trespasser", "patient", "politician", "soldier", "grandchild", "serviceman",
               "walker", "drinker", "doctor", "bicyclist", "thief", "buyer", "teenager", "student", "camper",
               "driver", "solider", "hunter", "shopper", "villager"),
    "bicycle": ("bicycle", "bike", "unicycle", "minibike", "trike"),
    "car": ("car", "automobile", "van", "minivan", "sedan", "suv", "hatchback", "cab", "jeep", "coupe", "taxicab",
            "limo", "taxi"),
    "motorcycle": ("motorcycle", "scooter", "motor bike", "motor cycle", "motorbike", "moped"),
    "airplane": ("airplane", "jetliner", "plane", "air plane", "monoplane", "aircraft", "jet", "airbus", "biplane",
                 "seaplane"),
    "bus": ("bus", "minibus", "trolley"),
    "train": ("train", "locomotive", "tramway", "caboose"),
    "truck": ("truck", "pickup", "lorry", "hauler", "firetruck"),
    "boat": ("boat", "ship", "liner", "sailboat", "motorboat", "dinghy", "powerboat", "speedboat", "canoe", "skiff",
             "yacht", "kayak", "catamaran", "pontoon", "houseboat", "vessel", "rowboat", "trawler", "ferryboat",
             "watercraft", "tugboat", "schooner", "barge", "ferry", "sailboard", "paddleboat", "lifeboat",
             "freighter", "steamboat", "riverboat", "battleship", "steamship"),
    "traffic light": ("traffic light", "street light", "traffic signal", "stop light", "streetlight", "stoplight"),
    "fire hydrant": ("fire hydrant", "hydrant"),
    "stop sign": ("stop sign",),
    "parking meter": ("parking meter",),
    "bench": ("bench", "pew"),
    "bird": ("bird", "ostrich", "owl", "seagull", "goose", "duck", "parakeet", "falcon", "robin", "pelican",
             "waterfowl", "heron", "hummingbird", "mallard", "finch", "pigeon", "sparrow", "seabird", "osprey",
             "blackbird", "fowl", "shorebird", "woodpecker", "egret", "chickadee", "quail", "bluebird", "kingfisher",
             "buzzard", "willet", "gull", "swan", "bluejay", "flamingo", "cormorant", "parrot", "loon", "gosling",
             "waterbird", "pheasant", "rooster", "sandpiper", "crow", "raven", "turkey", "oriole", "cowbird",
             "warbler", "magpie", "peacock", "cockatiel", "lorikeet", "puffin", "vulture", "condor", "macaw",
             "peafowl", "cockatoo", "songbird"),
    "cat": ("cat", "kitten", "feline", "tabby"),
    "dog": ("dog", "puppy", "beagle", "pup", "chihuahua", "schnauzer", "dachshund", "rottweiler", "canine", "pitbull",
            "collie", "pug", "terrier", "poodle", "labrador", "doggie", "doberman", "mutt", "doggy", "spaniel",
            "bulldog", "sheepdog", "weimaraner", "corgi", "cocker", "greyhound", "retriever", "brindle", "hound",
            "whippet", "husky"),
    "horse": ("horse", "colt", "pony", "racehorse", "stallion", "equine", "mare", "foal", "palomino", "mustang",
              "clydesdale", "bronc", "bronco"),
    "sheep": ("sheep", "lamb", "ram", "goat", "ewe"),
    "cow": ("cow", "cattle", "oxen", "ox", "calf", "holstein", "heifer", "buffalo", "bull", "zebu", "bison"),
    "elephant": ("elephant",),
    "bear": ("bear", "panda"),
    "zebra": ("zebra",),
    "giraffe": ("giraffe",),
    "backpack": ("backpack", "knapsack"),
    "umbrella": ("umbrella",),
    "handbag": ("handbag", "wallet", "purse", "briefcase"),
    "tie": ("tie", "bow", "bow tie"),
    "suitcase": ("suitcase", "suit case", "luggage"),
    "frisbee": ("frisbee",),
    "skis": ("skis", "ski"),
    "snowboard": ("snowboard",),
    "sports ball": ("sports ball", "ball"),
    "kite": ("kite",),
    "baseball bat": ("baseball bat",),
    "baseball glove": ("baseball glove",),
    "skateboard": ("skateboard",),
    "surfboard": ("surfboard", "longboard", "skimboard", "shortboard", "wakeboard"),
    "tennis racket": ("tennis racket", "racket"),
    "bottle": ("bottle",),
    "wine glass": ("wine glass",),
    "cup": ("cup",),
    "fork": ("fork",),
    "knife": ("knife", "pocketknife", "knive"),
    "spoon": ("spoon",),
    "bowl": ("bowl", "container"),
    "banana": ("banana",),
    "apple": ("apple",),
    "sandwich": ("sandwich", "burger", "sub", "cheeseburger", "hamburger"),
    "orange": ("orange",),
    "broccoli": ("broccoli",),
    "carrot": ("carrot",),
    "hot dog": ("hot dog",),
    "pizza": ("pizza",),
    "donut": ("donut", "doughnut", "bagel"),
    "cake": ("cake", "cheesecake", "cupcake", "shortcake", "coffeecake", "pancake"),
    "chair": ("chair", "seat", "stool"),
    "couch": ("couch", "sofa", "recliner", "futon", "loveseat", "settee", "chesterfield"),
    "potted plant": ("potted plant", "houseplant"),
    "bed": ("bed",),
    "dining table": ("dining table", "table", "desk"),
    "toilet": ("toilet", "urinal", "commode", "lavatory", "potty"),
    "tv": ("tv", "monitor", "televison", "television"),
    "laptop": ("laptop", "computer", "notebook", "netbook", "lenovo", "macbook", "laptop computer"),
    "mouse": ("mouse",),
    "remote": ("remote",),
    "keyboard": ("keyboard",),
    "cell phone": ("cell phone", "mobile phone", "phone", "cellphone", "telephone", "phon", "smartphone"),
    "microwave": ("microwave",),
    "oven": ("oven", "stovetop", "stove"),
    "toaster": ("toaster",),
    "sink": ("sink",),
    "refrigerator": ("refrigerator", "fridge", "freezer"),
    "book": ("book",),
    "clock": ("clock",),
    "vase": ("vase",),
    "scissors": ("scissors",),
    "teddy bear": ("teddy bear", "teddybear"),
    "hair drier": ("hair drier", "hairdryer"),
    "toothbrush": ("toothbrush",),
}

_JOINED = ("motor bike", "motor cycle", "air plane", "traffic light", "street light", "traffic signal", "stop light",
           "fire hydrant", "stop sign", "parking meter", "suit case", "sports ball", "baseball bat", "baseball glove",
           "tennis racket", "wine glass", "hot dog", "cell phone", "mobile phone", "teddy bear", "hair drier",
           "potted plant", "laptop computer", "home plate", "train track")
_ANIMALS = ("bird", "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "animal", "cub")

#: Two words (singular) read as one -> the word they count as (itself where the phrase is one word of the list).
DOUBLE_WORDS: dict[str, str] = {
    **{phrase: phrase for phrase in _JOINED},
    **{f"{age} {animal}": animal for animal in _ANIMALS for age in ("baby", "adult")},  # not a person
    **{f"passenger {vehicle}": vehicle for vehicle in ("jet", "train")},
    "bow tie": "tie", "toilet seat": "toilet",
}

CATEGORY_OF: dict[str, str] = {word: name for name, words in SYNONYMS.items() for word in words}
# every word a caption word may be made singular towards: the synonyms and the words of the two-word phrases
_KNOWN: frozenset[str] = frozenset(w for phrase in (*CATEGORY_OF, *DOUBLE_WORDS) for w in phrase.split())
_IRREGULAR = {"men": "man", "women": "woman", "policemen": "policeman", "gentlemen": "gentleman",
              "servicemen": "serviceman", "grandchildren": "grandchild", "mice": "mouse", "geese": "goose"}
_ENDINGS = (("ies", "y"), ("ies", "ie"), ("ves", "f"), ("ves", "fe"), ("es", ""), ("s", ""))
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def singular(word: str) -> str:
    """`word` made singular where that gives a word CHAIR knows (a synonym or a word of a two-word phrase);
    anything else as it is."""
    if word in _KNOWN:
        return word
    if _IRREGULAR.get(word) in _KNOWN:
        return _IRREGULAR[word]
    for ending, instead in _ENDINGS:
        if word.endswith(ending) and word[: -len(ending)] + instead in _KNOWN:
            return word[: -len(ending)] + instead
    return word


@cache
def _tokenizer() -> Any:
    from nltk.tokenize import NLTKWordTokenizer  # the tokenizer of nltk.word_tokenize, without punkt's download

    return NLTKWordTokenizer()


def caption_words(caption: str) -> list[str]:
    """A caption's words as CHAIR reads them: lower case, NLTK's word tokenizer sentence by sentence."""
    tokenize = _tokenizer().tokenize
    return [w for sentence in _SENTENCE_END.split(caption.lower().strip()) for w in tokenize(sentence)]


def coco_mentions(caption: str | Sequence[str]) -> list[Mention]:
    """The COCO objects a caption names: (the words as written, category name) in caption order, repeats kept.
    `caption` is text, or its words (already tokenized, as decoding gives them)."""
    words = caption_words(caption) if isinstance(caption, str) else [w.lower() for w in caption]
    units: list[tuple[str, str]] = []  # (as written, the word it counts as)
    t = 0
    while t < len(words):
        pair = f"{singular(words[t])} {singular(words[t + 1])}" if t + 1 < len(words) else ""
        if pair in DOUBLE_WORDS:
            units.append((f"{words[t]} {words[t + 1]}", DOUBLE_WORDS[pair]))
            t += 2
        else:
            units.append((words[t], singular(words[t])))
            t += 1
    if any(unit == "toilet" for _, unit in units) and any(unit == "seat" for _, unit in units):
        units = [(w, unit) for w, unit in units if unit != "seat"]  # the seat of a toilet is no chair
    return [(written, CATEGORY_OF[unit]) for written, unit in units if unit in CATEGORY_OF]


def caption_objects(references: Iterable[str]) -> set[str]:
    """The COCO categories an image's reference captions name."""
    return {name for ref in references for _, name in coco_mentions(ref)}


def instance_objects(path: str | Path, image_ids: Iterable[int]) -> dict[int, set[str]]:
    """Each image's categories in a COCO instances file (instances_val2014.json: only its 'images', 'annotations'
    and 'categories' are read, no masks); an image of `image_ids` missing from the file, or a category that is
    not one of COCO's 80, is refused naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"instances file not found: {path}")
    data = load_json(path)
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("images", "annotations",
                                                                                        "categories")):
        raise ValueError(f"{path} is not a COCO instances file: it needs the lists 'annotations', 'categories' and "
                         "'images'")
    try:
        names = {c["id"]: c["name"] for c in data["categories"]}
        files = {im["id"] for im in data["images"]}
        found = [(ann["image_id"], ann["category_id"]) for ann in data["annotations"]]
    except (KeyError, TypeError) as err:
        raise ValueError(f"{path}: an entry lacks its 'id', 'name', 'image_id' or 'category_id' ({err!r})") from err
    return objects_of(names, files, found, image_ids, path)


def objects_of(names: Mapping[int, str], files: Iterable[int], found: Iterable[tuple[int, int]],
               image_ids: Iterable[int], where: str | Path) -> dict[int, set[str]]:
    """Each wanted image's category names from an instances file's categories (id -> name), images and (image id,
    category id) pairs; an image not in `files`, or a category that is not one of COCO's 80, is refused."""
    unknown = sorted({str(name) for name in names.values()} - set(SYNONYMS))
    if unknown:
        raise ValueError(f"{where}: categories {unknown[:5]} are not COCO's 80 (CHAIR's synonym list has none of "
                         "them); give COCO's instances file")
    wanted, known = list(image_ids), set(files)
    missing = [i for i in wanted if i not in known]
    if missing:
        raise ValueError(f"{len(missing)} image ids are not in {where} (e.g. {missing[:5]}); give the instances file "
                         "of the captioned images (instances_val2014.json for the Karpathy val/test splits)")
    out: dict[int, set[str]] = {i: set() for i in wanted}
    for image, category in found:
        if image in out:
            if category not in names:
                raise ValueError(f"{where}: an annotation of image {image} has category id {category}, which is "
                                 "not in its 'categories'")
            out[image].add(names[category])
    return out


def coco_objects(instances: Mapping[int, set[str]], references: Mapping[int, Sequence[str]]) -> dict[int, set[str]]:
    """Each image's objects as CHAIR has them: its instance annotations' categories and its references' mentions."""
    return {i: set(instances[i]) | caption_objects(references.get(i, ())) for i in instances}


def chair_on_coco(captions: Mapping[int, str | Sequence[str]], instances: Mapping[int, set[str]],
                  references: Mapping[int, Sequence[str]]) -> ChairScores:
    """CHAIR of captions (image -> text or its words) against each image's instance categories and the objects its
    references name."""
    return chair_scores({i: coco_mentions(c) for i, c in captions.items()}, coco_objects(instances, references))
