"""Your own data in a plain table: one row per caption, in a CSV or JSON Lines file, read into `ImageRecord`s.

Columns (CSV: a header row; JSON Lines: the keys of each line's object; other columns are ignored):
- `image`: the image's path, relative to `image_root` (by default the table's folder); absolute paths, `..` and
  symlinks that lead out of the root are refused (readers/paths.py), so every image stays under the root;
- `caption`: the caption as written (rows of one image give its captions, in row order);
- `split` (optional): train, val or test (`restval` counts as train); images of another split name (`unassigned`)
  are skipped and counted in one warning line, but a name close to train/val/test (`trian`) is refused as a typo;
- `image_id` (optional): an integer; without it the images are numbered 1, 2, ... in order of first appearance.

A split file (`split_file`: columns `image` and `split`, CSV or JSON Lines, e.g. Flickr8k's official split written as
a table) gives each image its split instead, by the same rules; images of the caption table it does not list are
skipped and counted. Split rule with neither: the distinct images, sorted by path, are shuffled with
`random.Random(seed)`; the first `val_size` go to val, the next `test_size` to test, the rest to train (so the split
does not depend on row order). The defaults, 1000 and 1000, are those of Karpathy's Flickr8k and Flickr30k splits.

Bad input (a missing column, an empty image or caption, a misspelt split, a non-integer id, one image with two ids
or two splits, one id for two images, a line that is not a JSON object, a file that is not UTF-8) is refused with
a ValueError naming the file, the line (CSV: the row's first physical line, the header being line 1) and the field.
Captions that tokenise to nothing are skipped and counted in a warning; so are images left with no caption.
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

from captioning.base.constraints import Count, File, choose_one, constrained, did_you_mean
from captioning.base.jsonio import is_id
from captioning.data.readers.paths import ImageRoot, relative_problem
from captioning.data.readers.records import SPLITS, ImageRecord, describe
from captioning.data.readers.table_files import REQUIRED, table_rows
from captioning.data.tokenizers import DEFAULT_TOKENIZER, words_of

logger = logging.getLogger(__name__)
SPLIT_VALUES = {"train": "train", "restval": "train", "val": "val", "test": "test"}
_INTEGER = re.compile(r"[+-]?\d+")


@dataclass
class _Image:
    """One distinct image of the table and what its rows say about it."""

    line: int  # its first row
    image_id: int  # given by the rows, or 1, 2, ... by first appearance
    split: str | None
    captions: list[tuple[list[str], str]] = field(default_factory=list)  # (tokens, raw) in row order


def split_value(value: Any) -> tuple[str, str | None]:
    """A split cell: train, val or test (restval: train); another word is kept as it is, and its images are skipped
    (`unassigned`); one close to a split's name is a typo, refused (the problem, second)."""
    if not isinstance(value, str) or not value.strip():
        return "", f"must be a split name, got {describe(value)}"
    word = value.strip()
    if word in SPLIT_VALUES:
        return SPLIT_VALUES[word], None
    if did_you_mean(word, list(SPLIT_VALUES)):
        return word, (f"is {word!r:.40}: {choose_one(word, list(SPLIT_VALUES))}; a split of another name "
                      f"(e.g. unassigned) is skipped")
    return word, None


def _parse(values: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, str] | None]:
    """The checked fields of one row, or the first (field, problem) found."""
    out: dict[str, Any] = {}
    for name in REQUIRED:
        value = values.get(name)
        if not isinstance(value, str) or not value.strip():
            what = "is missing" if name not in values else ("is empty" if isinstance(value, str)
                                                            else f"must be a string, got {describe(value)}")
            return out, (name, what)
        out[name] = value.strip()
    if problem := relative_problem(out["image"]):
        return out, ("image", problem)
    out["image"] = PurePosixPath(out["image"])
    split = values.get("split")
    if split is not None:
        value, problem = split_value(split)
        if problem:
            return out, ("split", problem)
        out["split"] = value
    image_id = values.get("image_id")
    if image_id is not None:
        if isinstance(image_id, str) and _INTEGER.fullmatch(image_id.strip()):
            image_id = int(image_id)
        if not is_id(image_id):
            return out, ("image_id", f"must be an integer, got {describe(image_id)}")
        out["image_id"] = image_id
    return out, None


def _images(rows: Iterator[tuple[int, dict[str, Any]]], path: Path,
            words: Callable[[str], list[str]]) -> dict[PurePosixPath, _Image]:
    """The table's images by path, in order of first appearance, with their captions split by `words`; conflicts
    refused."""
    images: dict[PurePosixPath, _Image] = {}
    by_id: dict[int, PurePosixPath] = {}
    given: dict[str, int] = {}  # optional column -> the first line that gives it
    lacking: dict[str, int] = {}  # optional column -> the first line that does not

    def bad(line: int, name: str, problem: str) -> ValueError:
        return ValueError(f"{path}: line {line}: '{name}' {problem}")

    for line, values in rows:
        row, problem = _parse(values)
        if problem:
            raise bad(line, *problem)
        for name in ("split", "image_id"):
            (given if name in row else lacking).setdefault(name, line)
            if name in given and name in lacking:
                raise bad(lacking[name], name, f"is missing (line {given[name]} gives one): give every row "
                          f"a {name} or none")
        image = images.setdefault(row["image"], _Image(line, row.get("image_id", len(images) + 1), row.get("split")))
        if "image_id" in row and image.image_id != row["image_id"]:
            raise bad(line, "image_id", f"{row['image_id']} differs from the id {image.image_id} that line "
                      f"{image.line} gives {str(row['image'])!r}; one image has one id")
        if image.split != row.get("split"):
            raise bad(line, "split", f"{row['split']!r} differs from the split {image.split!r} that line "
                      f"{image.line} gives {str(row['image'])!r}; all rows of an image give one split")
        if "image_id" in row and by_id.setdefault(image.image_id, row["image"]) != row["image"]:
            other = by_id[image.image_id]
            raise bad(line, "image_id", f"{image.image_id} is already the id of {str(other)!r} (line "
                      f"{images[other].line}); each image needs its own id")
        image.captions.append((words(row["caption"]), row["caption"]))
    return images


def _under_root(images: dict[PurePosixPath, _Image], root: ImageRoot, path: Path) -> dict[PurePosixPath, _Image]:
    """The images, after checking that none resolves outside the image root through a symlink."""
    for name, image in images.items():
        joined = os.path.join(root.root, name)
        if (real := root.escape(joined)) is not None:
            raise ValueError(f"{path}: line {image.line}: 'image' {root.describe(joined, real)}")
    return images


def _drop_empty(images: dict[PurePosixPath, _Image], path: Path) -> dict[PurePosixPath, _Image]:
    """The images with their non-empty captions; empty captions and images left with none are counted, skipped."""
    kept: dict[PurePosixPath, _Image] = {}
    empty = 0
    for name, image in images.items():
        captions = [(t, w) for t, w in image.captions if t]
        empty += len(image.captions) - len(captions)
        if captions:
            kept[name] = _Image(image.line, image.image_id, image.split, captions)
    if empty:
        logger.warning("%s: skipped %d captions with no words", path, empty)
    if len(kept) < len(images):
        bare = next(str(n) for n in images if n not in kept)
        logger.warning("%s: skipped %d images with no caption left (e.g. %s)", path, len(images) - len(kept), bare)
    return kept


def _seeded_split(names: Sequence[PurePosixPath], val_size: int, test_size: int, seed: int) -> dict[PurePosixPath, str]:
    """Image -> split: sorted by path, shuffled with `seed`; `val_size` to val, the next `test_size` to test, the
    rest to train."""
    order = sorted(names, key=str)
    random.Random(seed).shuffle(order)
    return {n: "val" if k < val_size else "test" if k < val_size + test_size else "train" for k, n in enumerate(order)}


def _split_file(path: Path) -> dict[PurePosixPath, str]:
    """image -> split of a split file (columns image, split: CSV or JSON Lines); a bad or conflicting row refused."""
    out: dict[PurePosixPath, tuple[str, int]] = {}
    for line, values in table_rows(path, "a split file", ("image", "split"), ("image", "split")):
        image = values.get("image")
        if not isinstance(image, str) or not image.strip():
            raise ValueError(f"{path}: line {line}: 'image' is empty")
        if problem := relative_problem(image.strip()):
            raise ValueError(f"{path}: line {line}: 'image' {problem}")
        split, problem = split_value(values.get("split"))
        if problem:
            raise ValueError(f"{path}: line {line}: 'split' {problem}")
        name = PurePosixPath(image.strip())
        if name in out and out[name][0] != split:
            raise ValueError(f"{path}: line {line}: 'split' {split!r} differs from {out[name][0]!r} that line "
                             f"{out[name][1]} gives {str(name)!r}")
        out.setdefault(name, (split, line))
    return {name: split for name, (split, _) in out.items()}


def _assigned(images: dict[PurePosixPath, _Image], split_of: Mapping[PurePosixPath, str | None],
              path: Path) -> dict[PurePosixPath, _Image]:
    """The images whose split is train, val or test; the others (another split name, or none in a split file) are
    skipped and counted in one warning line."""
    kept = {n: image for n, image in images.items() if split_of.get(n) in SPLITS}
    if len(kept) < len(images):
        other = sorted({str(split_of.get(n)) for n in images if n not in kept})
        captions = sum(len(image.captions) for n, image in images.items() if n not in kept)
        logger.warning("%s: skipped %d images (%d captions) whose split is not train, val or test (%s)", path,
                       len(images) - len(kept), captions, ", ".join(o if o != "None" else "not in the split file"
                                                                     for o in other))
    return kept


@constrained
def read_table(splits: Sequence[str], annotations: Annotated[str | os.PathLike, File()],
               image_root: str | os.PathLike | None = None, val_size: Count = 1000,
               test_size: Count = 1000, seed: int = 0, tokenizer: str = DEFAULT_TOKENIZER,
               split_file: Annotated[str | os.PathLike | None, File()] = None) -> dict[str, list[ImageRecord]]:
    """The requested splits of a caption table (.csv, .jsonl, .ndjson), by split; see the module docstring.

    With a `split_file` (columns image and split) each image takes the split it gives there (a `split` column of the
    table is then ignored); with a `split` column each image takes the split its rows give; val_size, test_size and
    seed are then ignored. Images of another split (e.g. `unassigned`) or not in the split file are skipped and
    counted. Captions are split into words by `tokenizer` (dataset.tokenizer: captioning/data/tokenizers.py).
    The `dataset.reader` of conf/dataset/reader/table.yaml.
    """
    for s in splits:
        if s not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {s!r}")
    path = Path(annotations)
    rows = table_rows(path, "a caption table")
    root = Path(image_root) if image_root is not None else path.parent
    images = _drop_empty(_under_root(_images(rows, path, words_of(tokenizer)), ImageRoot(root), path), path)
    if split_file is not None:
        given = _split_file(Path(split_file))
        images = _assigned(images, given, Path(split_file))
        for image_name, image in images.items():
            image.split = given[image_name]
    elif any(image.split is not None for image in images.values()):
        images = _assigned(images, {n: image.split for n, image in images.items()}, path)
    has_split = any(image.split is not None for image in images.values())
    split_of = ({n: str(image.split) for n, image in images.items()} if has_split
                else _seeded_split(list(images), val_size, test_size, seed))
    out: dict[str, list[ImageRecord]] = {}
    for s in splits:
        out[s] = [ImageRecord(image.image_id, root / n, [t for t, _ in image.captions], [w for _, w in image.captions],
                              tokenizer=tokenizer) for n, image in images.items() if split_of[n] == s]
        if not out[s]:
            why = (f"the split file {split_file} gives it none" if split_file is not None
                   else _why_empty(split_of, has_split, val_size, test_size))
            raise ValueError(f"{path}: split {s!r} has no images ({why})")
    return out


def _why_empty(split_of: Mapping[PurePosixPath, str], has_split: bool, val_size: int, test_size: int) -> str:
    """Why a split came out empty, and what to set."""
    if has_split:
        return "its 'split' column gives it none"
    sizes = {s: sum(v == s for v in split_of.values()) for s in SPLITS}
    return (f"the seeded split of its {len(split_of)} images gives {sizes['train']} to train, {sizes['val']} to val "
            f"and {sizes['test']} to test with dataset.reader.val_size={val_size} and test_size={test_size}; "
            f"set those two, or give the table a 'split' column")
