"""Raw COCO caption annotations (captions_train2014.json / captions_val2014.json), read through pycocotools.

Split rule (documented in conf/dataset/coco.yaml):
- with a Karpathy split file (`split_file`, e.g. dataset_coco.json), each image takes the split that file
  gives its COCO id (`restval` counts as train); images the file does not list are left out;
- without one, every train2014 image is `train`, and the val2014 images, sorted by id, give the first
  `num_val` to `val`, the next `num_test` to `test` and the rest to `train` (Karpathy's "restval").

Bad input: a file that is not valid JSON, lacks the `images`/`annotations` lists, has an image without
`id`/`file_name`, a duplicate image id, an annotation without `image_id`/`caption`, or an annotation for an
image id the file does not list is refused with a ValueError naming the file and the entry. Empty captions
(nothing left after tokenising) are skipped and counted in a warning; so are images left with no caption.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pycocotools.coco import COCO

from captioning.data.karpathy import SPLITS, ImageRecord, load_json
from captioning.data.vocab import tokenize

logger = logging.getLogger(__name__)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true/false are not image ids


def _check_structure(data: Any, path: Path) -> None:
    """Refuse a captions file pycocotools would crash on (or silently misread), naming the bad entry."""
    if not isinstance(data, dict) or not isinstance(data.get("images"), list) \
            or not isinstance(data.get("annotations"), list):
        raise ValueError(f"{path}: expected COCO caption annotations with top-level 'images' and 'annotations' lists")
    ids: set[int] = set()
    for n, img in enumerate(data["images"]):
        if not isinstance(img, dict) or not _is_id(img.get("id")) or not isinstance(img.get("file_name"), str):
            raise ValueError(f"{path}: images[{n}] is malformed (needs an integer 'id' and a 'file_name')")
        if img["id"] in ids:
            raise ValueError(f"{path}: images[{n}] repeats image id {img['id']}")
        ids.add(img["id"])
    unknown = []
    for n, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict) or not _is_id(ann.get("image_id")) or not isinstance(ann.get("caption"), str):
            raise ValueError(f"{path}: annotations[{n}] is malformed (needs an integer 'image_id' and a string 'caption')")
        if ann["image_id"] not in ids:
            unknown.append(ann["image_id"])
    if unknown:
        raise ValueError(f"{path}: {len(unknown)} annotations refer to image ids not in its 'images' list "
                         f"(e.g. {sorted(set(unknown))[:5]}); is the file truncated or from another set?")


def load_coco(path: str | os.PathLike) -> COCO:
    """A pycocotools COCO index of a captions file, after checking its structure."""
    path = Path(path)
    data = load_json(path)
    _check_structure(data, path)
    data.setdefault("info", {})  # pycocotools' info() and loadRes expect it; caption files may leave it out
    return coco_index(data)


def coco_index(data: dict[str, Any]) -> COCO:
    """A pycocotools COCO index of an already checked annotation dict (built without pycocotools' printing)."""
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        coco.createIndex()
    return coco


def _records(coco: COCO, image_ids: Iterable[int], folder: Path, source: Path) -> list[ImageRecord]:
    """Image records of the given ids with tokenised captions; empty captions and caption-less images skipped."""
    records, empty, bare = [], 0, 0
    for img in coco.loadImgs(list(image_ids)):
        anns = coco.loadAnns(coco.getAnnIds(imgIds=img["id"]))
        caps = [(tokenize(a["caption"]), a["caption"].strip()) for a in sorted(anns, key=lambda a: a.get("id", 0))]
        keep = [(t, r) for t, r in caps if t]
        empty += len(caps) - len(keep)
        if not keep:
            bare += 1
            continue
        size = (int(img["height"]), int(img["width"])) if "height" in img and "width" in img else None
        records.append(ImageRecord(int(img["id"]), folder / img["file_name"], [t for t, _ in keep],
                                   [r for _, r in keep], size=size))
    if empty or bare:
        logger.warning("%s: skipped %d empty captions and %d images without a caption", source, empty, bare)
    return records


def _karpathy_splits(split_file: Path) -> dict[int, str]:
    """COCO id -> split ('restval' becomes 'train') from a Karpathy dataset_coco.json."""
    data = load_json(split_file)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise ValueError(f"{split_file}: expected a Karpathy split file with a top-level 'images' list")
    try:
        return {int(img["cocoid"]): ("train" if img["split"] == "restval" else img["split"]) for img in data["images"]}
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{split_file}: every image needs 'cocoid' and 'split' to split raw COCO captions ({err})") from err


def read_coco_captions(train_captions: str | os.PathLike, val_captions: str | os.PathLike, splits: Sequence[str],
                       image_root: str | os.PathLike, train_images: str = "train2014", val_images: str = "val2014",
                       split_file: str | os.PathLike | None = None, num_val: int = 5000,
                       num_test: int = 5000) -> dict[str, list[ImageRecord]]:
    """Records of the requested splits from raw COCO caption files, split by the rule in the module docstring.

    Images are looked up under image_root/train_images/file_name and image_root/val_images/file_name.
    """
    for s in splits:
        if s not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {s!r}")
    if num_val < 0 or num_test < 0:
        raise ValueError(f"num_val and num_test must be >= 0, got {num_val} and {num_test}")
    root = Path(image_root)
    sources = [(Path(train_captions), root / train_images), (Path(val_captions), root / val_images)]
    cocos = [load_coco(path) for path, _ in sources]
    if split_file is not None:
        given = _karpathy_splits(Path(split_file))
        assign = [{i: given[i] for i in c.getImgIds() if i in given} for c in cocos]
    else:
        val_ids = sorted(cocos[1].getImgIds())
        rule = ["val"] * min(num_val, len(val_ids)) + ["test"] * min(num_test, max(len(val_ids) - num_val, 0))
        assign = [{i: "train" for i in cocos[0].getImgIds()},
                  {i: rule[k] if k < len(rule) else "train" for k, i in enumerate(val_ids)}]
    out: dict[str, list[ImageRecord]] = {}
    for s in splits:
        out[s] = [r for c, a, (path, folder) in zip(cocos, assign, sources)
                  for r in _records(c, sorted(i for i, sp in a.items() if sp == s), folder, path)]
        if not out[s]:
            raise ValueError(f"raw COCO captions {sources[0][0]} + {sources[1][0]}: split {s!r} has no images "
                             "(check dataset.coco.num_val / num_test or the split file)")
    return out
