"""Raw COCO caption annotations (captions_train2014.json / captions_val2014.json), read through pycocotools.

Split rule (documented in conf/dataset/reader/coco.yaml):
- with a Karpathy split file (`split_file`, e.g. dataset_coco.json), each image takes the split that file
  gives its COCO id (`restval` counts as train); images the file does not list are left out;
- without one, every train2014 image is `train`, and the val2014 images, sorted by id, give the first
  `num_val` to `val`, the next `num_test` to `test` and the rest to `train` (Karpathy's "restval").

Bad input: a file that is not UTF-8 or not valid JSON, lacks the `images`/`annotations` lists, has an image
without an integer `id`/`file_name`, a `file_name` that leaves its image folder (absolute, `..`, or a symlink out
of it: captioning/data/readers/paths.py), a duplicate image id, an annotation without an integer `id`/`image_id` or a
string `caption`, a duplicate annotation id, or an annotation for an image id the file does not list is refused
with a ValueError naming the file, the entry (index and id) and the field, before pycocotools sees the file. Empty
captions (nothing left after tokenising) are skipped and counted in a warning; so are images left with no caption.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any

from pycocotools.coco import COCO

from captioning.base.constraints import Count, File, constrained
from captioning.base.jsonio import is_id, load_json
from captioning.data.readers.paths import ImageRoot, relative_problem
from captioning.data.readers.records import SPLITS, ImageRecord
from captioning.data.tokenizers import DEFAULT_TOKENIZER, words_of

logger = logging.getLogger(__name__)


def _check_images(images: list[Any], path: Path, folder: ImageRoot | None) -> set[int]:
    """The image ids of `images`, after checking each entry's fields and, with the image `folder`, that its file
    stays under it (captioning/data/readers/paths.py); a ValueError names the entry and field."""
    ids: dict[int, int] = {}
    for n, img in enumerate(images):
        if not isinstance(img, dict) or not is_id(img.get("id")) or not isinstance(img.get("file_name"), str):
            raise ValueError(f"{path}: images[{n}] is malformed (needs an integer 'id' and a 'file_name'), got "
                             f"{img!r:.120}")
        problem = relative_problem(img["file_name"]) if folder is None else folder.problem(img["file_name"])
        if problem:
            raise ValueError(f"{path}: images[{n}] (id {img['id']}): 'file_name' {problem}")
        if img["id"] in ids:
            raise ValueError(f"{path}: images[{n}] (id {img['id']}): 'id' repeats image id {img['id']} of "
                             f"images[{ids[img['id']]}]")
        sized = all(is_id(img.get(k)) and img[k] > 0 for k in ("height", "width"))
        if ("height" in img or "width" in img) and not sized:
            raise ValueError(f"{path}: images[{n}] (id {img['id']}): 'height' and 'width' must be positive integers, "
                             f"got {img.get('height')!r:.20} x {img.get('width')!r:.20}")
        ids[img["id"]] = n
    return set(ids)


def _check_structure(data: Any, path: Path, folder: ImageRoot | None = None) -> None:
    """Refuse a captions file pycocotools would crash on (or silently misread), or whose images leave `folder`,
    naming the bad entry and field."""
    if not isinstance(data, dict) or not isinstance(data.get("images"), list) \
            or not isinstance(data.get("annotations"), list):
        raise ValueError(f"{path}: expected COCO caption annotations with top-level 'images' and 'annotations' lists")
    ids = _check_images(data["images"], path, folder)
    ann_ids: dict[int, int] = {}
    unknown = []
    for n, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict) or not is_id(ann.get("image_id")) or not isinstance(ann.get("caption"), str):
            raise ValueError(f"{path}: annotations[{n}] is malformed (needs an integer 'image_id' and a string "
                             f"'caption'), got {ann!r:.120}")
        if not is_id(ann.get("id")):  # pycocotools indexes annotations by it (KeyError without it)
            raise ValueError(f"{path}: annotations[{n}] (image id {ann['image_id']}): 'id' must be an integer "
                             f"annotation id, got {ann.get('id')!r:.40}" + ("" if "id" in ann else " (missing)"))
        if ann["id"] in ann_ids:  # pycocotools would keep only one of the two captions
            raise ValueError(f"{path}: annotations[{n}] (image id {ann['image_id']}): 'id' repeats annotation id "
                             f"{ann['id']} of annotations[{ann_ids[ann['id']]}]")
        ann_ids[ann["id"]] = n
        if ann["image_id"] not in ids:
            unknown.append(ann["image_id"])
    if unknown:
        raise ValueError(f"{path}: {len(unknown)} annotations refer to image ids not in its 'images' list "
                         f"(e.g. {sorted(set(unknown))[:5]}); is the file truncated or from another set?")


def load_coco(path: str | os.PathLike, image_folder: str | os.PathLike | None = None) -> COCO:
    """A pycocotools COCO index of a captions file, after checking its structure (and, with the folder its images
    are in, that each `file_name` stays under it)."""
    path = Path(path)
    data = load_json(path)
    _check_structure(data, path, None if image_folder is None else ImageRoot(image_folder))
    data.setdefault("info", {})  # pycocotools' info() and loadRes expect it; caption files may leave it out
    return coco_index(data)


def coco_index(data: dict[str, Any]) -> COCO:
    """A pycocotools COCO index of an already checked annotation dict (built without pycocotools' printing)."""
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        coco.createIndex()
    return coco


def _records(coco: COCO, image_ids: Iterable[int], folder: Path, source: Path,
             tokenizer: str = DEFAULT_TOKENIZER) -> list[ImageRecord]:
    """Image records of the given ids with captions tokenised by `tokenizer`; empty captions and caption-less images
    skipped."""
    tokenize = words_of(tokenizer)
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
                                   [r for _, r in keep], size=size, tokenizer=tokenizer))
    if empty or bare:
        logger.warning("%s: skipped %d empty captions and %d images without a caption", source, empty, bare)
    return records


def _karpathy_splits(split_file: Path) -> dict[int, str]:
    """COCO id -> split ('restval' becomes 'train') from a Karpathy dataset_coco.json."""
    data = load_json(split_file)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise ValueError(f"{split_file}: expected a Karpathy split file with a top-level 'images' list")
    splits: dict[int, str] = {}
    for n, img in enumerate(data["images"]):
        if not isinstance(img, dict) or not is_id(img.get("cocoid")) or not isinstance(img.get("split"), str):
            raise ValueError(f"{split_file}: images[{n}] needs an integer 'cocoid' and a string 'split' to split raw "
                             f"COCO captions, got {img!r:.120}")
        if img["cocoid"] in splits:
            raise ValueError(f"{split_file}: images[{n}] (cocoid {img['cocoid']}): 'cocoid' appears more than once")
        splits[img["cocoid"]] = "train" if img["split"] == "restval" else img["split"]
    return splits


@constrained
def read_coco_captions(train_captions: Annotated[str | os.PathLike, File()],
                       val_captions: Annotated[str | os.PathLike, File()], splits: Sequence[str],
                       image_root: str | os.PathLike, train_images: str = "train2014", val_images: str = "val2014",
                       split_file: Annotated[str | os.PathLike | None, File()] = None,
                       num_val: Count = 5000,
                       num_test: Count = 5000,
                       tokenizer: str = DEFAULT_TOKENIZER) -> dict[str, list[ImageRecord]]:
    """Records of the requested splits from raw COCO caption files, split by the rule in the module docstring, their
    captions split into words by `tokenizer` (dataset.tokenizer: captioning/data/tokenizers.py).

    Images are looked up under image_root/train_images/file_name and image_root/val_images/file_name.
    The `dataset.reader` of conf/dataset/reader/coco.yaml.
    """
    for s in splits:
        if s not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {s!r}")
    words_of(tokenizer)  # an unknown one is refused before the files are read
    root = Path(image_root)
    sources = [(Path(train_captions), root / train_images), (Path(val_captions), root / val_images)]
    cocos = [load_coco(path, folder) for path, folder in sources]
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
                  for r in _records(c, sorted(i for i, sp in a.items() if sp == s), folder, path, tokenizer)]
        if not out[s]:
            raise ValueError(f"raw COCO captions {sources[0][0]} + {sources[1][0]}: split {s!r} has no images "
                             "(check dataset.reader.num_val / num_test or the split file)")
    return out
