"""Reference captions and results files for scoring, without torch: what `captioning-score` and `captioning-html`
read.

Annotation files come in the two formats this project uses, told apart by their content:
- a COCO caption file: {"annotations": [{"image_id": int, "caption": str}, ...], "images": [...]};
- a Karpathy split file (dataset_coco.json, dataset_flickr8k.json, data/shapes/dataset_shapes.json):
  {"images": [{"split": ..., "sentences": [{"raw": ...}, ...], ...}]}, of which one split is read.
A results file is a list of {"image_id": int, "caption": str}: every image id must have references and appear
once. An empty caption is allowed and scores 0 on every metric (as coco-caption scores it).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from captioning.base.jsonio import is_id, load_json
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.readers.paths import ImageRoot
from captioning.data.readers.records import ImageRecord

FORMATS = ("coco", "karpathy")


def check_entry(entry: Any, where: str) -> None:
    """Refuse an entry that is not {"image_id": int, "caption": str}, naming it, its image id and the field."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where} needs an integer 'image_id' and a string 'caption', got {entry!r:.100}")
    if not is_id(entry.get("image_id")):
        got = f"{type(entry['image_id']).__name__} {entry['image_id']!r:.40}" if "image_id" in entry else "nothing"
        raise ValueError(f"{where} needs an integer 'image_id', got {got}")
    if not isinstance(entry.get("caption"), str):
        got = f"{type(entry['caption']).__name__} {entry['caption']!r:.40}" if "caption" in entry else "nothing"
        raise ValueError(f"{where} (image id {entry['image_id']}) needs a string 'caption', got {got}")


def annotation_format(data: Any, path: Path) -> str:
    """'coco' or 'karpathy' for parsed annotation JSON; a ValueError naming the file for anything else."""
    if isinstance(data, dict) and isinstance(data.get("annotations"), list):
        return "coco"
    if isinstance(data, dict) and isinstance(data.get("images"), list) and "annotations" not in data:
        return "karpathy"
    raise ValueError(f"{path}: expected a COCO caption annotation file (an 'annotations' list) or a Karpathy "
                     "split file (an 'images' list with 'sentences')")


@dataclass
class Annotations:
    """An annotation file's references and image paths by image id, and for a Karpathy file the split's records
    (their word boxes and image sizes; None for a COCO caption file)."""

    references: dict[int, list[str]]
    paths: dict[int, Path]
    records: list[ImageRecord] | None = None


def load_annotations(path: str | Path, split: str = "test",
                     image_root: str | Path | None = None) -> tuple[dict[int, list[str]], dict[int, Path]]:
    """References and image paths by image id, from a COCO caption file or a Karpathy split file (its `split`)."""
    found = read_annotations(path, split, image_root)
    return found.references, found.paths


def read_annotations(path: str | Path, split: str = "test", image_root: str | Path | None = None) -> Annotations:
    """A COCO caption file or a Karpathy split file (its `split`), read once.

    COCO files give image paths only with an image_root (image_root / images[].file_name); Karpathy files
    resolve them as training does (image_root or the file's folder, then filepath / filename).
    """
    path = Path(path)
    data = load_json(path)
    if annotation_format(data, path) == "karpathy":
        records = read_karpathy(path, split, image_root)  # checks every entry, names the bad one
        return Annotations({r.image_id: list(r.raw) for r in records}, {r.image_id: r.path for r in records},
                           records)
    refs: dict[int, list[str]] = defaultdict(list)
    for n, ann in enumerate(data["annotations"]):
        check_entry(ann, f"{path}: annotations[{n}]")
        refs[ann["image_id"]].append(ann["caption"])
    paths: dict[int, Path] = {}
    if image_root is not None:
        root = ImageRoot(image_root)  # every file_name must stay under it (captioning/data/readers/paths.py)
        for n, im in enumerate(data.get("images") or []):
            if isinstance(im, dict) and is_id(im.get("id")) and isinstance(im.get("file_name"), str):
                if problem := root.problem(im["file_name"]):
                    raise ValueError(f"{path}: images[{n}] (id {im['id']}): 'file_name' {problem}")
                paths[im["id"]] = Path(image_root) / im["file_name"]
    return Annotations(dict(refs), paths)


def load_references(path: str | Path, split: str = "test") -> dict[int, list[str]]:
    """image id -> reference captions, from a COCO caption file or a Karpathy split file (its `split`)."""
    return load_annotations(path, split)[0]


def load_results(path: str | Path, references: dict[int, list[str]]) -> dict[int, str]:
    """image id -> generated caption, from a COCO results file, validated against the references."""
    path = Path(path)
    data = load_json(path)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of {{\"image_id\": ..., \"caption\": ...}}")
    results: dict[int, str] = {}
    for n, res in enumerate(data):
        check_entry(res, f"{path}: entry {n}")
        image_id = res["image_id"]
        if image_id in results:
            raise ValueError(f"{path}: image id {image_id} appears more than once (entry {n}); "
                             "keep one caption per image")
        if image_id not in references:
            raise ValueError(f"{path}: image id {image_id} (entry {n}) has no reference captions in the annotation "
                             "file (for a Karpathy file: is it in the --split read?)")
        results[image_id] = res["caption"]
    if not results:
        raise ValueError(f"{path}: the results file is empty")
    return results
