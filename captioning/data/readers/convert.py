"""Image records to a Karpathy split file (dataset_*.json), the format `read_karpathy_splits` and other tools read.

`to_karpathy` builds the file's dict: one entry per image with its split, `filepath` (the image's folder relative
to `image_root`, "" directly under it), `filename`, `cocoid` (the record's image id), `imgid` (its index), and its
sentences (`raw`, `tokens`, `imgid`, `sentid`). Reading it back with the same `image_root` gives the same records.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from captioning.base.jsonio import write_json_atomic
from captioning.data.readers.records import SPLITS, ImageRecord


def _under(path: Path, root: Path, image_id: int) -> tuple[str, str]:
    """(filepath, filename) of `path` relative to `root`; a path outside the root is refused."""
    try:
        rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(root))
    except ValueError:
        raise ValueError(f"image {image_id}: {path} is not under the image root {root}; a Karpathy file names images "
                         "relative to it (pass the folder that holds them all)") from None
    if not rel.parts:
        raise ValueError(f"image {image_id}: its path {path} is the image root itself, not a file under it")
    folder = rel.parent.as_posix()
    return ("" if folder == "." else folder), rel.name


def to_karpathy(records: Mapping[str, Sequence[ImageRecord]], image_root: str | os.PathLike,
                dataset: str = "custom") -> dict[str, Any]:
    """The Karpathy split-file dict of records by split, with image paths relative to image_root."""
    root = Path(image_root)
    images: list[dict[str, Any]] = []
    seen: dict[int, str] = {}  # image id -> its split
    files: dict[tuple[str, str], int] = {}  # (filepath, filename) -> image id
    sentid = 0
    for split, split_records in records.items():
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        for r in split_records:
            if r.image_id in seen:
                raise ValueError(f"image {r.image_id} is in split {seen[r.image_id]!r} and in {split!r}; "
                                 "an image belongs to one split")
            if len(r.captions) != len(r.raw):
                raise ValueError(f"image {r.image_id}: {len(r.captions)} token lists for {len(r.raw)} raw captions")
            seen[r.image_id] = split
            filepath, filename = _under(r.path, root, r.image_id)
            if files.setdefault((filepath, filename), r.image_id) != r.image_id:
                raise ValueError(f"images {files[filepath, filename]} and {r.image_id} are both {r.path}; "
                                 "each image file must be listed once")
            n = len(images)
            sentences = [{"raw": raw, "tokens": list(tokens), "imgid": n, "sentid": sentid + k}
                         for k, (tokens, raw) in enumerate(zip(r.captions, r.raw))]
            images.append({"filepath": filepath, "filename": filename, "cocoid": r.image_id, "imgid": n,
                           "split": split, "sentences": sentences, "sentids": [s["sentid"] for s in sentences]})
            sentid += len(sentences)
    return {"images": images, "dataset": dataset}


def write_karpathy(records: Mapping[str, Sequence[ImageRecord]], image_root: str | os.PathLike,
                   out_path: str | os.PathLike, dataset: str = "custom") -> Path:
    """Write records by split as a Karpathy split file at out_path (atomically); returns the path."""
    out = Path(out_path)
    data = to_karpathy(records, image_root, dataset)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, data)
    return out
