"""Data sets of images (or cached annotation grids) and their encoded captions, and how they are batched.

An item is one image with all its captions; `collate` stacks images and flattens the captions, with
`image_index` telling which image each caption belongs to, so each image is encoded once per batch.
`training_view` gives the training split per image (dataset.batch_unit=images) or per caption (captions).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import Dataset

from captioning.data.images import ImageError, load_image
from captioning.data.prepared.arrays import SplitView, caption_counts, caption_lengths
from captioning.data.readers.records import ImageRecord
from captioning.data.tokenizers import DEFAULT_TOKENIZER
from captioning.data.vocab import Vocabulary

logger = logging.getLogger(__name__)
BATCH_UNITS = ("images", "captions")  # dataset.batch_unit: what dataset.batch_size counts in training


class CachedGrids(Protocol):
    """What a data set reads cached annotation grids from: a feature cache (captioning/features/cache.py,
    `FeatureCache`, which sits above the models whose encoder made it)."""

    sets: bool  # True: each image holds its own number of regions (L_i, D), batched with padding and a mask

    def __getitem__(self, image_id: int) -> torch.Tensor:
        """The image's annotation grid a (L, D), float32."""

    def require(self, records: Sequence[ImageRecord]) -> None:
        """Refuse records whose images it does not hold."""


class CaptionDataset(Dataset):
    """Images of one split with their captions encoded as <start> w_1 .. w_n <end>.

    With `features` (a feature cache of a frozen encoder) an item holds the image's cached annotation
    grid a (L, D) instead of the transformed image; the captioner then skips its encoder.
    With `cache_images` each image is read and transformed once and then kept in memory (4 bytes per value of the
    transformed image: 48 kB per 64 px `shapes` image, 600 kB at 224 px), for small data sets read every epoch; the
    encoders' transforms are deterministic, so the items are the same. Unreadable images are not kept (read again,
    counted again). Each DataLoader worker keeps its own copy. `tokenizer` is the rule its records' captions were
    split by (dataset.tokenizer), which scoring and the SCST rewards split by too.
    """

    def __init__(self, records: Sequence[ImageRecord], vocab: Vocabulary, transform: Callable, max_len: int = 20,
                 captions_per_image: int | None = None, features: CachedGrids | None = None,
                 cache_images: bool = False):
        if captions_per_image is not None and captions_per_image < 1:
            raise ValueError(f"captions_per_image must be >= 1 or null (all), got {captions_per_image}")
        # one reader, one rule (a record made without one, e.g. by hand: the default's)
        self.tokenizer = getattr(records[0], "tokenizer", DEFAULT_TOKENIZER) if len(records) else DEFAULT_TOKENIZER
        if vocab.tokenizer is not None and vocab.tokenizer != self.tokenizer:
            raise ValueError(f"the vocabulary (a checkpoint's) was made with dataset.tokenizer={vocab.tokenizer}, this "
                             f"data set's captions with {self.tokenizer}: set dataset.tokenizer={vocab.tokenizer}")
        self.vocab, self.transform, self.max_len = vocab, transform, max_len
        self.captions_per_image, self.features = captions_per_image, features
        self.cached: dict[int, torch.Tensor] | None = {} if cache_images and features is None else None
        self.encoded: Sequence[list[torch.Tensor]]
        if isinstance(records, SplitView):  # prepared captions: records and captions built per item from the arrays
            self.records: Sequence[ImageRecord] = records
            self.encoded = records.encoded(vocab, max_len)
        else:
            self.records = list(records)
            self.encoded = [[torch.tensor([vocab.start_id, *vocab.encode(c[:max_len]), vocab.end_id])
                             for c in r.captions] for r in self.records]
        if features is not None:
            features.require(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        try:
            image_id, path = self.where(i)
            if self.features is not None:
                image = self.features[image_id]  # (L, D) cached annotation grid, or (L_i, D) region set
                if not len(image):
                    raise ImageError(f"image {image_id} has no regions in its feature set")
            elif self.cached is not None and i in self.cached:
                image = self.cached[i]
            else:
                image = self.transform(load_image(path))  # (3, H, W)
                if self.cached is not None:
                    self.cached[i] = image
        except ImageError as err:  # counted and reported by the caller, never a crash mid-epoch
            return {"image": None, "error": str(err), "index": i}
        captions = self.encoded[i]
        if self.captions_per_image is not None and len(captions) > self.captions_per_image:
            # A fresh random subset each time the image is drawn: every caption is seen over the epochs.
            captions = [captions[j] for j in torch.randperm(len(captions))[: self.captions_per_image].tolist()]
        item = {"image": image, "captions": captions, "index": i, "path": str(path)}
        if self.features is not None and self.features.sets:
            item["regions"] = True  # a set of regions: collate pads the batch's sets and gives their mask
        return item

    def where(self, i: int) -> tuple[int, str | Path]:
        """Image i's id and file (prepared captions give them without building the whole record)."""
        if isinstance(self.records, SplitView):
            return self.records.where(i)
        record = self.records[i]
        return record.image_id, record.path


@dataclass
class Batch:
    """B images and their N captions."""

    images: torch.Tensor  # (B, 3, H, W) images, or (B, L, D) cached annotation grids or padded region sets
    captions: torch.Tensor  # (N, T+2) <start> ... <end> <pad>...
    image_index: torch.Tensor  # (N,) image of each caption
    indices: list[int]  # dataset index of each image
    skipped: list[str] = field(default_factory=list)  # why each unreadable image of this batch was left out
    mask: torch.Tensor | None = None  # (B, L) true at real regions: region sets (None: grids, every region real)

    def to(self, device: torch.device | str) -> Batch:
        """Move tensors to a device."""
        return Batch(self.images.to(device), self.captions.to(device), self.image_index.to(device), self.indices,
                     self.skipped, None if self.mask is None else self.mask.to(device))


def _same_shape(items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Items whose image tensors share the batch's most common shape (ties: the larger one), and why others not.

    Only an encoder whose transform does not resize (SmallCNN without image_size) can give two shapes. Region sets
    (L_i, D) may differ in L_i: only their D must agree.
    """
    shapes = Counter(_shape(it) for it in items)
    if len(shapes) < 2:
        return items, []
    common = max(shapes, key=lambda s: (shapes[s], torch.Size(s).numel()))
    odd = [f"image {it.get('path', it['index'])} becomes a tensor of shape {tuple(it['image'].shape)}, not the "
           f"batch's {common}: the encoder's transform does not resize (give the encoder an image_size)"
           for it in items if _shape(it) != common]
    return [it for it in items if _shape(it) == common], odd


def _shape(item: dict[str, Any]) -> tuple[int, ...]:
    """What must agree across a batch: an image's or a grid's whole shape, a region set's D."""
    return tuple(item["image"].shape[-1:] if item.get("regions") else item["image"].shape)


def collate(items: list[dict[str, Any]]) -> Batch:
    """Stack images and pad all captions of the batch into one (N, T) tensor; unreadable images are left out.

    Region sets (items flagged `regions`: (L_i, D) each) are padded with zeros to the batch's largest L and get
    the mask (B, L), true at real regions, which every attention honours (padding gets exactly zero weight).
    A batch whose images were all unreadable has no images (`indices` empty); callers count `skipped`.
    """
    skipped = [it["error"] for it in items if it["image"] is None]
    items = [it for it in items if it["image"] is not None]
    items, odd = _same_shape(items)
    skipped += odd
    if not items:
        return Batch(torch.empty(0), torch.empty(0, 0, dtype=torch.long), torch.empty(0, dtype=torch.long), [], skipped)
    caps = [c for it in items for c in it["captions"]]
    image_index = torch.tensor([i for i, it in enumerate(items) for _ in it["captions"]])
    captions = torch.nn.utils.rnn.pad_sequence(caps, batch_first=True, padding_value=Vocabulary.pad_id)
    indices = [it["index"] for it in items]
    if items[0].get("regions"):
        images, mask = pad_regions([it["image"] for it in items])
        return Batch(images, captions, image_index, indices, skipped, mask)
    return Batch(torch.stack([it["image"] for it in items]), captions, image_index, indices, skipped)


def pad_regions(sets: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Region sets (L_i, D) -> (B, L, D) zero-padded to the largest L_i, and the mask (B, L) true at real regions."""
    counts = torch.tensor([len(s) for s in sets])
    padded = torch.nn.utils.rnn.pad_sequence(list(sets), batch_first=True)  # (B, L, D)
    return padded, torch.arange(padded.shape[1]).unsqueeze(0) < counts.unsqueeze(1)  # (B, L)


class CaptionPairs(Dataset):
    """Every (image, caption) pair of a data set as one item, so an epoch visits each caption once and a batch
    of B items holds B captions (the paper's minibatches of 64 captions); items look like CaptionDataset's."""

    def __init__(self, images: CaptionDataset):
        if images.captions_per_image is not None:
            raise ValueError("dataset.batch_unit=captions visits every caption once per epoch; "
                             "set dataset.captions_per_image=null")
        self.images = images
        counts = caption_counts(images.encoded)
        self.image_of = np.repeat(np.arange(len(counts)), counts)  # pair k -> image i
        self.caption_of = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)  # k -> caption j

    def __len__(self) -> int:
        return len(self.image_of)

    def __getitem__(self, k: int) -> dict[str, Any]:
        i, j = int(self.image_of[k]), int(self.caption_of[k])
        item = self.images[i]
        if item["image"] is not None:
            item["captions"] = [self.images.encoded[i][j]]
        return item


def collate_pairs(items: list[dict[str, Any]]) -> Batch:
    """`collate` after merging the items of one image, so each distinct image of the batch is encoded once."""
    merged: dict[int, dict[str, Any]] = {}
    for it in items:
        first = merged.get(it["index"])
        if first is None:
            merged[it["index"]] = dict(it)
        elif first["image"] is not None and it["image"] is not None:
            first["captions"] = first["captions"] + it["captions"]
    return collate(list(merged.values()))


def item_lengths(ds: CaptionDataset | CaptionPairs) -> np.ndarray:
    """(items,) the caption length of each training item: a pair's caption, or the mean of an image's captions
    (what dataset.length_buckets sorts by)."""
    images = ds.images if isinstance(ds, CaptionPairs) else ds
    lengths = caption_lengths(images.encoded).astype(np.float64)  # (C,)
    if isinstance(ds, CaptionPairs):
        return lengths
    counts = caption_counts(images.encoded)  # (N,)
    sums = np.bincount(np.repeat(np.arange(len(counts)), counts), weights=lengths, minlength=len(counts))
    return sums / np.maximum(counts, 1)  # an image without captions: 0


def training_view(images: CaptionDataset,
                  batch_unit: str) -> tuple[CaptionDataset | CaptionPairs, Callable[[list], Batch]]:
    """The training data set and its collate function for dataset.batch_unit (images | captions)."""
    if batch_unit == "images":
        return images, collate
    if batch_unit == "captions":
        return CaptionPairs(images), collate_pairs
    raise ValueError(f"dataset.batch_unit must be one of {BATCH_UNITS}, got {batch_unit!r}")
