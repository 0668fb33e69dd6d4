"""Captioning data in the Karpathy split format (dataset_coco.json, dataset_flickr8k.json, shapes).

An item is one image with all its captions; `collate` stacks images and flattens the captions, with
`image_index` telling which image each caption belongs to, so each image is encoded once per batch.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from captioning.data.vocab import Vocabulary, tokenize

if TYPE_CHECKING:
    from captioning.data.features import FeatureCache

logger = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


@dataclass
class ImageRecord:
    """One image of a split: where it is, its tokenised reference captions and optional object boxes."""

    image_id: int
    path: Path
    captions: list[list[str]]  # tokenised references
    raw: list[str]  # the references as written
    word_boxes: dict[str, list[list[float]]] = field(default_factory=dict)  # words naming objects -> boxes
    size: tuple[int, int] | None = None  # (height, width) if the annotation says


def load_json(path: Path) -> Any:
    """Parse a JSON annotation file; a missing or invalid file gives an error naming it."""
    if not path.is_file():
        raise FileNotFoundError(f"annotation file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from err


def write_json_atomic(path: Path, data: Any, indent: int | None = None) -> None:
    """Write JSON through a temporary file and an atomic rename, so an interrupted run never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=indent) + ("\n" if indent is not None else ""), encoding="utf-8")
    os.replace(tmp, path)


def read_karpathy(json_path: str | os.PathLike, split: str, image_root: str | os.PathLike | None = None,
                  train_includes_restval: bool = True) -> list[ImageRecord]:
    """Read one split of a Karpathy-format file; images are looked up under image_root/filepath/filename."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    json_path = Path(json_path)
    root = Path(image_root) if image_root is not None else json_path.parent
    data = load_json(json_path)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise ValueError(f"{json_path}: expected a Karpathy split file with a top-level 'images' list")
    wanted = {split, "restval"} if split == "train" and train_includes_restval else {split}
    records, empty = [], 0
    for n, img in enumerate(data["images"]):
        try:
            if img["split"] not in wanted:
                continue
            sentences = img["sentences"]
            raw = [s.get("raw", " ".join(s.get("tokens", []))) for s in sentences]
            toks = [[t.lower() for t in s["tokens"]] if s.get("tokens") else tokenize(r) for s, r in zip(sentences, raw)]
            image_id = int(img.get("cocoid", img.get("id", img.get("imgid", n))))
            path = root / img.get("filepath", "") / img["filename"]
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{json_path}: image entry {n} is malformed ({type(err).__name__}: {err})") from err
        keep = [(t, r) for t, r in zip(toks, raw) if t]
        empty += len(toks) - len(keep)
        if not keep:
            logger.warning("%s: image %s has no non-empty caption; skipped", json_path, image_id)
            continue
        size = (int(img["height"]), int(img["width"])) if "height" in img and "width" in img else None
        records.append(ImageRecord(image_id, path, [t for t, _ in keep], [r for _, r in keep],
                                   dict(img.get("word_boxes", {})), size))
    if empty:
        logger.warning("%s: skipped %d empty captions in split %s", json_path, empty, split)
    if not records:
        raise ValueError(f"{json_path}: split {split!r} has no images")
    return records


class ImageError(OSError):
    """An image that cannot be used: missing, empty, corrupt, truncated or too large."""


# Larger images are refused (PIL's decompression-bomb guard): 16k x 16k pixels is far beyond any caption data set.
MAX_IMAGE_PIXELS = 16384 * 16384


def _to_rgb(im: Image.Image) -> Image.Image:
    """RGB from any mode; 16/32-bit grey is rescaled to 8 bits rather than clipped to white."""
    if im.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        arr = np.asarray(im, dtype=np.float64)
        top = 65535.0 if im.mode.startswith("I;16") else max(float(arr.max()), 1.0)
        im = Image.fromarray(np.clip(arr / top * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
    return im.convert("RGB")


def load_image(path: Path) -> Image.Image:
    """Open an image as RGB (grey, CMYK, RGBA, 16-bit all handled); an ImageError names the file otherwise."""
    try:
        if path.stat().st_size == 0:
            raise ImageError(f"empty (0-byte) image file: {path}")
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
            with Image.open(path) as im:
                im.load()  # decode now, so a truncated file fails here and not later
                return _to_rgb(im)
    except ImageError:
        raise
    except FileNotFoundError as err:
        raise ImageError(f"image file not found: {path}") from err
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombWarning, Image.DecompressionBombError) as err:
        raise ImageError(f"cannot read image {path}: {err}") from err


class CaptionDataset(Dataset):
    """Images of one split with their captions encoded as <start> w_1 .. w_n <end>.

    With `features` (a feature cache of a frozen encoder) an item holds the image's cached annotation
    grid a (L, D) instead of the transformed image; the captioner then skips its encoder.
    """

    def __init__(self, records: Sequence[ImageRecord], vocab: Vocabulary, transform: Callable, max_len: int = 20,
                 captions_per_image: int | None = None, features: FeatureCache | None = None):
        if captions_per_image is not None and captions_per_image < 1:
            raise ValueError(f"captions_per_image must be >= 1 or null (all), got {captions_per_image}")
        self.records, self.vocab, self.transform, self.max_len = list(records), vocab, transform, max_len
        self.captions_per_image, self.features = captions_per_image, features
        if features is not None:
            features.require(self.records)
        self.encoded = [
            [torch.tensor([vocab.start_id, *vocab.encode(c[:max_len]), vocab.end_id]) for c in r.captions]
            for r in self.records
        ]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        try:
            record = self.records[i]
            if self.features is not None:
                image = self.features[record.image_id]  # (L, D) cached annotation grid
            else:
                image = self.transform(load_image(record.path))  # (3, H, W)
        except ImageError as err:  # counted and reported by the caller, never a crash mid-epoch
            return {"image": None, "error": str(err), "index": i}
        captions = self.encoded[i]
        if self.captions_per_image is not None and len(captions) > self.captions_per_image:
            # A fresh random subset each time the image is drawn: every caption is seen over the epochs.
            captions = [captions[j] for j in torch.randperm(len(captions))[: self.captions_per_image].tolist()]
        return {"image": image, "captions": captions, "index": i}


@dataclass
class Batch:
    """B images and their N captions."""

    images: torch.Tensor  # (B, 3, H, W) images, or (B, L, D) cached annotation grids
    captions: torch.Tensor  # (N, T+2) <start> ... <end> <pad>...
    image_index: torch.Tensor  # (N,) image of each caption
    indices: list[int]  # dataset index of each image
    skipped: list[str] = field(default_factory=list)  # why each unreadable image of this batch was left out

    def to(self, device: torch.device | str) -> Batch:
        """Move tensors to a device."""
        return Batch(self.images.to(device), self.captions.to(device), self.image_index.to(device), self.indices,
                     self.skipped)


def collate(items: list[dict[str, Any]]) -> Batch:
    """Stack images and pad all captions of the batch into one (N, T) tensor; unreadable images are left out.

    A batch whose images were all unreadable has no images (`indices` empty); callers count `skipped`.
    """
    skipped = [it["error"] for it in items if it["image"] is None]
    items = [it for it in items if it["image"] is not None]
    if not items:
        return Batch(torch.empty(0), torch.empty(0, 0, dtype=torch.long), torch.empty(0, dtype=torch.long), [], skipped)
    caps = [c for it in items for c in it["captions"]]
    image_index = torch.tensor([i for i, it in enumerate(items) for _ in it["captions"]])
    captions = torch.nn.utils.rnn.pad_sequence(caps, batch_first=True, padding_value=Vocabulary.pad_id)
    return Batch(torch.stack([it["image"] for it in items]), captions, image_index, [it["index"] for it in items],
                 skipped)
