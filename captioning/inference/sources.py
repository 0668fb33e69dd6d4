"""The images a captioning command is given: files, folders, text files of paths, or a data set's split.

Every source is an `ImageSource` (its path and, where known, its image id). Folders are searched recursively for
the `--glob` patterns (default: the usual image suffixes, any letter case), in sorted order, so two runs over a
folder see the same list. Image ids, which a COCO results file needs, come from the annotation file of a split,
from a stated mapping, or from the digits that end a file's stem (COCO_val2014_000000391895.jpg -> 391895).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from captioning.base.jsonio import is_id, load_json
from captioning.data.readers.references import load_annotations

IMAGE_PATTERNS = ("*.jpg", "*.jpeg", "*.png", "*.bmp", "*.gif", "*.webp", "*.tif", "*.tiff")
_TRAILING_DIGITS = re.compile(r"(\d+)$")


@dataclass(frozen=True)
class ImageSource:
    """One image to caption: its path and its image id (None until one is assigned)."""

    path: Path
    image_id: int | None = None

    @property
    def key(self) -> str:
        """How the image is named in output files (and recognised when a run is resumed)."""
        return str(self.path)


def _folder_images(folder: Path, patterns: Sequence[str]) -> list[Path]:
    """Files under folder (recursive, symlinked folders not followed) whose name matches a pattern (any case)."""
    lowered = [p.lower() for p in patterns]
    found = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        found += [Path(root) / f for f in sorted(files) if any(fnmatch.fnmatch(f.lower(), p) for p in lowered)]
    return found


def _listed(list_file: Path) -> list[Path]:
    """The paths of a text file, one per line (blank lines and lines starting with # skipped), relative to its
    folder unless absolute."""
    try:
        lines = list_file.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise FileNotFoundError(f"list of images not found: {list_file}") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{list_file} is not UTF-8 text (byte {err.start}); a list of images is one path "
                         "a line") from None
    paths = [line.strip() for line in lines]
    return [Path(p) if os.path.isabs(p) else list_file.parent / p for p in paths if p and not p.startswith("#")]


def collect_images(inputs: Sequence[str | os.PathLike] = (), list_files: Sequence[str | os.PathLike] = (),
                   patterns: Sequence[str] = ()) -> list[ImageSource]:
    """The images named by files and folders (searched for `patterns`), then by list files; each once, in order.

    A named or listed file is taken whatever its suffix (it is read, and skipped and counted if it is missing or not
    an image); a folder with no matching file, or no image at all, is an error before any work.
    """
    patterns = tuple(patterns) or IMAGE_PATTERNS
    paths: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            found = _folder_images(item, patterns)
            if not found:
                raise ValueError(f"no image in the folder {item} matches {', '.join(patterns)} (see --glob)")
            paths += found
        else:  # a file, or a missing one: reading it says why it is skipped
            paths.append(item)
    for list_file in map(Path, list_files):
        paths += _listed(list_file)
    seen: set[Path] = set()
    unique = []
    for p in paths:
        resolved = p.resolve()
        if resolved not in seen:
            seen.add(resolved)
            unique.append(ImageSource(p))
    if not unique:
        raise ValueError("no images given: name image files, folders, --list files or --annotations")
    return unique


def split_images(annotations: str | os.PathLike, split: str = "test",
                 image_root: str | os.PathLike | None = None) -> list[ImageSource]:
    """The images of a data set's split with their ids (a Karpathy split file, or a COCO caption file with
    image_root), in the file's order: captions of them are scorable against that file as they are."""
    _, paths = load_annotations(Path(annotations), split, None if image_root is None else Path(image_root))
    if not paths:
        hint = "" if image_root else " (a COCO caption file needs --image-root: the folder of its images)"
        raise ValueError(f"{annotations}: no images in split {split!r}{hint}")
    return [ImageSource(path, image_id) for image_id, path in paths.items()]


def _mapped_ids(mapping_file: Path) -> dict[str, int]:
    data = load_json(mapping_file)
    if not isinstance(data, dict) or not all(is_id(v) for v in data.values()):
        raise ValueError(f"{mapping_file}: an image-id mapping is a JSON object of file name (or path) -> integer id")
    return data


def assign_ids(sources: Iterable[ImageSource], mapping: str | os.PathLike | None = None) -> list[ImageSource]:
    """Give every source without an id one: from the mapping (keyed by the path as given, or by the file name),
    else from the digits that end its stem. A source with neither, or two images with one id, is an error."""
    table = _mapped_ids(Path(mapping)) if mapping is not None else {}
    out: list[ImageSource] = []
    owner: dict[int, Path] = {}
    for src in sources:
        image_id = src.image_id
        if image_id is None:
            image_id = table.get(src.key, table.get(src.path.name))
        if image_id is None:
            digits = _TRAILING_DIGITS.search(src.path.stem)
            if digits is None:
                where = f"in {mapping} or " if mapping is not None else ""
                raise ValueError(f"{src.path}: no image id {where}at the end of its file name (e.g. COCO_val2014_"
                                 "000000391895.jpg); a results file needs one: give --id-map FILE.json")
            image_id = int(digits.group(1))
        if image_id in owner:
            raise ValueError(f"image id {image_id} is given to both {owner[image_id]} and {src.path}; "
                             "give distinct ids with --id-map FILE.json")
        owner[image_id] = src.path
        out.append(replace(src, image_id=image_id))
    return out
