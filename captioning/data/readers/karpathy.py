"""The Karpathy split format (dataset_coco.json, dataset_flickr8k.json, dataset_flickr30k.json, shapes): reader.

`read_karpathy` checks every entry (types, one entry per image id and per file, an image path that stays under the
image root: paths.py), whatever its split, and returns the requested split's `ImageRecord`s; a bad
entry is a ValueError naming the file, the entry, its id and the field.
`read_karpathy_splits` is the same for several splits: the `dataset.reader` of conf/dataset/reader/karpathy.yaml.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

from captioning.base.constraints import File
from captioning.base.jsonio import is_id, load_json
from captioning.data.readers.paths import ImageRoot, relative_problem
from captioning.data.readers.records import SPLITS, ImageRecord, describe
from captioning.data.tokenizers import DEFAULT_TOKENIZER, words_of

logger = logging.getLogger(__name__)


@dataclass
class _Entry:
    """One parsed entry of a Karpathy file, whatever its split."""

    split: str
    record: ImageRecord  # its `captions` are filled in for the entries of the split read
    tokens: list[list[str] | None]  # each sentence's tokens, or None: tokenise its raw text
    id_key: str  # the field the image id came from


def _parse_entry(img: Any, n: int, json_path: Path, root: ImageRoot) -> _Entry:
    """Check one `images[n]` entry's fields and types, and that its image stays under the root; a ValueError names
    the file, entry, id and field."""
    id_key = next((k for k in ("cocoid", "id", "imgid") if isinstance(img, dict) and k in img), None)
    image_id = img[id_key] if id_key else n

    def bad(field: str, problem: str) -> ValueError:
        where = f"images[{n}]" + (f" (id {image_id!r:.40})" if id_key else "")
        return ValueError(f"{json_path}: {where}: '{field}' {problem}")

    if not isinstance(img, dict):
        raise ValueError(f"{json_path}: images[{n}] must be an object, got {describe(img)}")
    if not is_id(image_id):
        raise bad(id_key or "id", f"must be an integer image id, got {describe(image_id)}")
    for key in ("split", "filename"):
        if not isinstance(img.get(key), str) or not img[key]:
            raise bad(key, f"must be a non-empty string, got {describe(img.get(key))}" if key in img else "is missing")
    if not isinstance(img.get("filepath", ""), str):
        raise bad("filepath", f"must be a string, got {describe(img['filepath'])}")
    for key in ("filepath", "filename"):
        if problem := relative_problem(img.get(key, ""), folder=key == "filepath"):
            raise bad(key, problem)
    sentences = img.get("sentences")
    if not isinstance(sentences, list):
        raise bad("sentences", f"must be a list of {{'raw': ..., 'tokens': [...]}}, got {describe(sentences)}"
                  if "sentences" in img else "is missing")
    raw, toks = [], []
    for k, s in enumerate(sentences):
        if not isinstance(s, dict):
            raise bad(f"sentences[{k}]", f"must be an object with 'raw' and/or 'tokens', got {describe(s)}")
        tokens = s.get("tokens", [])
        checked = type(tokens) is _Tokens  # by _SharedTokens, as the file was decoded
        if not checked and (not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens)):
            raise bad(f"sentences[{k}].tokens", f"must be a list of strings, got {describe(tokens)}")
        text = s.get("raw", " ".join(tokens))
        if not isinstance(text, str):
            raise bad(f"sentences[{k}].raw", f"must be a string, got {describe(text)}")
        raw.append(text)
        toks.append((tokens if checked else [t.lower() for t in tokens]) or None)
    size = None
    if "height" in img and "width" in img:
        if not all(is_id(img[k]) and img[k] > 0 for k in ("height", "width")):
            raise bad("height/width", f"must be positive integers, got {img['height']!r:.20} x {img['width']!r:.20}")
        size = (img["height"], img["width"])
    boxes = img.get("word_boxes", {})
    if not isinstance(boxes, dict):
        raise bad("word_boxes", f"must be an object (word -> boxes), got {describe(boxes)}")
    joined = os.path.join(root.root, img.get("filepath", ""), img["filename"])  # one join: 123k of them for COCO
    if (real := root.escape(joined)) is not None:
        folder = os.path.realpath(os.path.join(root.root, img.get("filepath", "")))
        raise bad("filename" if root.inside(folder) else "filepath", root.describe(joined, real))
    path = Path(joined)
    return _Entry(img["split"], ImageRecord(image_id, path, [], raw, dict(boxes), size), toks, id_key or "index")


def _check_unique(entries: Sequence[_Entry], json_path: Path) -> None:
    """Refuse two entries with one image id, or two entries naming one file: scores and caches key on both."""
    for what, key in (("image id", lambda e: e.record.image_id), ("image file", lambda e: e.record.path)):
        counts = Counter(key(e) for e in entries)
        repeated = [v for v, c in counts.items() if c > 1]
        if repeated:
            first = [n for n, e in enumerate(entries) if key(e) == repeated[0]]
            field_name = entries[first[1]].id_key if what == "image id" else "filepath/filename"
            raise ValueError(f"{json_path}: images[{first[1]}] (id {entries[first[1]].record.image_id}): "
                             f"'{field_name}' repeats the {what} {repeated[0]} of images[{first[0]}] "
                             f"({len(repeated)} {what}s appear more than once); each image must be listed once")


class _Tokens(list):
    """A sentence's tokens that `_SharedTokens` found to be strings and lower-cased (not checked again)."""


class _SharedTokens:
    """A json object hook that lower-cases each sentence's tokens and keeps one string per distinct word.

    json makes a new string for every token it reads (about 7 million for COCO); sharing them as they are decoded
    keeps the parsed file at a fraction of that. Tokens that are not all strings are left for `_parse_entry`.
    """

    def __init__(self) -> None:
        self.words: dict[str, str] = {}

    def __call__(self, obj: dict[str, Any]) -> dict[str, Any]:
        tokens = obj.get("tokens")
        if type(tokens) is list:
            words = self.words
            try:  # a token that is not a string has no .lower(): the list is left as it is
                obj["tokens"] = _Tokens([words.get(t) or words.setdefault(t, t.lower()) for t in tokens])
            except (AttributeError, TypeError):
                pass
        return obj


def read_entries(json_path: str | os.PathLike, image_root: str | os.PathLike | None = None) -> list[_Entry]:
    """Parse and check every entry of a Karpathy split file once (types, one entry per image id and per file)."""
    json_path = Path(json_path)
    root = ImageRoot(image_root if image_root is not None else json_path.parent)
    data = load_json(json_path, object_hook=_SharedTokens())
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise ValueError(f"{json_path}: expected a Karpathy split file with a top-level 'images' list")
    entries = [_parse_entry(img, n, json_path, root) for n, img in enumerate(data["images"])]
    _check_unique(entries, json_path)
    return entries


def split_records(entries: Sequence[_Entry], split: str, json_path: str | os.PathLike,
                  train_includes_restval: bool = True, tokenizer: str = DEFAULT_TOKENIZER) -> list[ImageRecord]:
    """The records of one split of parsed entries, with tokenised captions; empty captions are skipped, counted.

    With the `ptb` tokenizer a sentence's own `tokens` are kept and only sentences without them are tokenised; any
    other tokenizer splits every raw sentence (the file's tokens are another language's rule, or none)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    tokenize, own_tokens = words_of(tokenizer), tokenizer == "ptb"
    wanted = {split, "restval"} if split == "train" and train_includes_restval else {split}
    records, empty = [], 0
    words: dict[str, str] = {}  # one string per distinct word of the captions tokenised here

    def shared(tokens: list[str]) -> list[str]:
        return [words.get(w) or words.setdefault(w, w) for w in tokens]

    for entry in entries:
        if entry.split not in wanted:
            continue
        r = entry.record
        captions = [t if t is not None and own_tokens else shared(tokenize(raw)) for t, raw in zip(entry.tokens, r.raw)]
        keep = [(t, w) for t, w in zip(captions, r.raw) if t]
        empty += len(captions) - len(keep)
        if not keep:
            logger.warning("%s: image %s has no non-empty caption; skipped", json_path, r.image_id)
            continue
        records.append(replace(r, captions=[t for t, _ in keep], raw=[w for _, w in keep], tokenizer=tokenizer))
    if empty:
        logger.warning("%s: skipped %d empty captions in split %s", json_path, empty, split)
    if not records:
        raise ValueError(f"{json_path}: split {split!r} has no images")
    return records


def read_karpathy(json_path: str | os.PathLike, split: str, image_root: str | os.PathLike | None = None,
                  train_includes_restval: bool = True) -> list[ImageRecord]:
    """Read one split of a Karpathy-format file; images are looked up under image_root/filepath/filename.

    Every entry is checked (types, one entry per image id and per file), whatever its split.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split_records(read_entries(json_path, image_root), split, json_path, train_includes_restval)


def read_karpathy_splits(splits: Sequence[str], annotations: Annotated[str | os.PathLike, File()],
                         image_root: str | os.PathLike | None = None,
                         tokenizer: str = DEFAULT_TOKENIZER) -> dict[str, list[ImageRecord]]:
    """The requested splits of a Karpathy split file, by split (`train` includes `restval`); the file is read once.
    Captions are split into words by `tokenizer` (dataset.tokenizer: captioning/data/tokenizers.py)."""
    for s in splits:
        if s not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {s!r}")
    words_of(tokenizer)  # an unknown one is refused before the file is read
    entries = read_entries(annotations, image_root)
    return {s: split_records(entries, s, annotations, tokenizer=tokenizer) for s in splits}
