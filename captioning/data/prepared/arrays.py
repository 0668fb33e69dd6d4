"""Captions of every split as flat arrays: the form prepared captions take on disk and in memory.

A `CaptionTable` holds, per split, the word index of every token (`tokens`, int32) with offsets per caption
(`caption_offsets`) and per image (`image_offsets`), the image ids, sizes, paths, raw references and word boxes,
plus one word list for all splits, ranked by training count (`words`, `train_counts`). Nothing here is a Python
object per caption, so a table read memory-mapped costs no copy per DataLoader worker. `SplitView` reads like the
list of `ImageRecord`s a reader returns; `EncodedCaptions` like `CaptionDataset.encoded` (word ids of a vocabulary,
<start> ... <end>), both built per item from the arrays. `Vocabulary.from_counts` gives the vocabulary a plain
`Vocabulary.build` over the training captions would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np
import torch

from captioning.base.files import atomic_file, write_text_atomic
from captioning.data.readers.records import SPLITS, ImageRecord
from captioning.data.tokenizers import CAPTION_TOKENIZERS, DEFAULT_TOKENIZER
from captioning.data.vocab import Vocabulary


@dataclass
class SplitArrays:
    """One split's arrays (memory-mapped when read from disk)."""

    tokens: np.ndarray  # (T,) int32 word index of every token, captions one after another
    caption_offsets: np.ndarray  # (C+1,) int64 caption c is tokens[caption_offsets[c]:caption_offsets[c+1]]
    image_offsets: np.ndarray  # (N+1,) int64 image i has captions image_offsets[i]:image_offsets[i+1]
    image_ids: np.ndarray  # (N,) int64
    sizes: np.ndarray  # (N, 2) int32 (height, width); -1 where the annotation does not say
    raw: np.ndarray  # (bytes,) uint8 every raw reference in UTF-8, one after another
    raw_offsets: np.ndarray  # (C+1,) int64
    paths: np.ndarray  # (bytes,) uint8 every image path in UTF-8
    path_offsets: np.ndarray  # (N+1,) int64
    word_boxes: dict[int, dict[str, list[list[float]]]]  # image row -> its word boxes (only rows that have some)

    ARRAYS = ("tokens", "caption_offsets", "image_offsets", "image_ids", "sizes", "raw", "raw_offsets", "paths",
              "path_offsets")

    def __len__(self) -> int:
        return len(self.image_ids)

    def check(self, num_words: int) -> str | None:
        """What is inconsistent in the arrays (offsets out of order or range, unknown word indices), or None."""
        n, c = len(self.image_ids), len(self.caption_offsets) - 1
        shapes = {"image_offsets": (len(self.image_offsets), n + 1), "path_offsets": (len(self.path_offsets), n + 1),
                  "raw_offsets": (len(self.raw_offsets), c + 1), "sizes": (self.sizes.shape, (n, 2))}
        for name, (got, want) in shapes.items():
            if got != want:
                return f"{name} has shape {got}, expected {want}"
        for name, offsets, end in (("caption_offsets", self.caption_offsets, len(self.tokens)),
                                   ("image_offsets", self.image_offsets, c), ("raw_offsets", self.raw_offsets,
                                                                              len(self.raw)),
                                   ("path_offsets", self.path_offsets, len(self.paths))):
            if offsets[0] != 0 or offsets[-1] != end or (np.diff(offsets) < 0).any():
                return f"{name} does not run from 0 to {end} in order"
        if len(self.tokens) and (int(self.tokens.min()) < 0 or int(self.tokens.max()) >= num_words):
            return f"tokens holds word indices outside 0..{num_words - 1}"
        if any(not 0 <= row < n for row in self.word_boxes):
            return "word_boxes names an image row outside the split"
        return None


def _blob(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 bytes of the texts one after another and their (len+1,) offsets."""
    encoded = [t.encode("utf-8") for t in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets


def _text(blob: np.ndarray, offsets: np.ndarray, k: int) -> str:
    return blob[offsets[k]:offsets[k + 1]].tobytes().decode("utf-8")


def _save_array(path: Path, array: np.ndarray) -> None:
    with atomic_file(path) as f:
        np.save(f, array, allow_pickle=False)


class CaptionTable:
    """Every split's captions as flat arrays, with one word list ranked by training count."""

    def __init__(self, words: list[str], train_counts: np.ndarray, splits: dict[str, SplitArrays],
                 folder: Path | None = None, tokenizer: str = DEFAULT_TOKENIZER):
        self.words, self.train_counts, self.splits = words, train_counts, splits
        self.tokenizer = tokenizer  # the rule that made the tokens (dataset.tokenizer), given to each record
        self.folder = folder  # where it was loaded from: pickled as that path (spawned workers map the same files)

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "splits": list(self.splits)} if self.folder else dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "words" in state:
            self.__dict__.update(state)
        else:
            self.__dict__.update(CaptionTable.load(state["folder"], state["splits"]).__dict__)

    @classmethod
    def from_records(cls, records: Mapping[str, Sequence[ImageRecord]]) -> CaptionTable:
        """The table of a reader's records (`records` must hold a `train` split: the words are ranked by it)."""
        flat = {s: [w for r in rs for c in r.captions for w in c] for s, rs in records.items()}
        first = {w: k for k, w in enumerate(dict.fromkeys(w for s in flat for w in flat[s]))}  # word -> first seen
        ids = {s: np.fromiter(map(first.__getitem__, f), dtype=np.int64, count=len(f)) for s, f in flat.items()}
        del flat
        counts = np.bincount(ids["train"], minlength=len(first))
        unranked = list(first)
        order = sorted(range(len(unranked)), key=lambda k: (-counts[k], unranked[k]))  # Vocabulary.build's ranking
        rank = np.empty(len(order), dtype=np.int32)
        rank[order] = np.arange(len(order), dtype=np.int32)
        splits = {s: cls._split(rs, rank[ids[s]]) for s, rs in records.items()}
        tokenizer = next((r.tokenizer for r in records["train"]), DEFAULT_TOKENIZER)
        return cls([unranked[k] for k in order], counts[order].astype(np.int64), splits, tokenizer=tokenizer)

    @staticmethod
    def _split(records: Sequence[ImageRecord], tokens: np.ndarray) -> SplitArrays:
        lengths = [len(c) for r in records for c in r.captions]
        caption_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=caption_offsets[1:])
        image_offsets = np.zeros(len(records) + 1, dtype=np.int64)
        np.cumsum([len(r.captions) for r in records], out=image_offsets[1:])
        if any(len(r.raw) != len(r.captions) for r in records):
            raise ValueError("every caption needs its raw text (a reader returned records with unequal lists)")
        raw, raw_offsets = _blob([w for r in records for w in r.raw])
        paths, path_offsets = _blob([str(r.path) for r in records])
        sizes = np.array([r.size or (-1, -1) for r in records], dtype=np.int32).reshape(len(records), 2)
        return SplitArrays(tokens, caption_offsets, image_offsets, np.array([r.image_id for r in records], np.int64),
                           sizes, raw, raw_offsets, paths, path_offsets,
                           {i: r.word_boxes for i, r in enumerate(records) if r.word_boxes})

    def vocabulary(self, min_freq: int, max_size: int | None) -> Vocabulary:
        """The vocabulary `Vocabulary.build` gives for the training captions."""
        return Vocabulary.from_counts(dict(zip(self.words, self.train_counts.tolist())), min_freq, max_size)

    def split(self, name: str) -> SplitView:
        """One split, read like a reader's list of records."""
        if name not in self.splits:
            raise ValueError(f"split must be one of {tuple(self.splits) or SPLITS}, got {name!r}")
        return SplitView(self, name)

    # -- files ---------------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        """Write the table as .npy files (and small JSON files) into an existing folder; a failed write is one
        OSError line naming the file (prepared.py's _write then removes the whole folder)."""
        write_text_atomic(folder / "words.json", json.dumps(self.words, ensure_ascii=False))
        write_text_atomic(folder / "tokenizer.json", json.dumps(self.tokenizer))
        _save_array(folder / "train_counts.npy", self.train_counts)
        for s, arrays in self.splits.items():
            for name in SplitArrays.ARRAYS:
                _save_array(folder / f"{s}.{name}.npy", getattr(arrays, name))
            write_text_atomic(folder / f"{s}.word_boxes.json",
                              json.dumps({str(k): v for k, v in arrays.word_boxes.items()}))

    @classmethod
    def load(cls, folder: Path, splits: Sequence[str]) -> CaptionTable:
        """Open a saved table memory-mapped (nothing is read into memory but the word list and word boxes).

        A ValueError (or OSError) says what is missing or inconsistent."""
        words = json.loads((folder / "words.json").read_text(encoding="utf-8"))
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise ValueError("words.json is not a list of strings")
        counts = np.load(folder / "train_counts.npy", mmap_mode="r")
        named = folder / "tokenizer.json"  # absent in sets made before the choice: all of them ptb
        tokenizer = json.loads(named.read_text(encoding="utf-8")) if named.is_file() else DEFAULT_TOKENIZER
        if tokenizer not in CAPTION_TOKENIZERS:
            raise ValueError(f"tokenizer.json names no tokenizer of {CAPTION_TOKENIZERS}")
        if counts.shape != (len(words),):
            raise ValueError(f"train_counts.npy has shape {counts.shape}, expected ({len(words)},)")
        out = {}
        for s in splits:
            arrays = {name: np.load(folder / f"{s}.{name}.npy", mmap_mode="r") for name in SplitArrays.ARRAYS}
            boxes = json.loads((folder / f"{s}.word_boxes.json").read_text(encoding="utf-8"))
            out[s] = SplitArrays(**arrays, word_boxes={int(k): v for k, v in boxes.items()})
            if (problem := out[s].check(len(words))) is not None:
                raise ValueError(f"split {s}: {problem}")
        return cls(words, counts, out, folder, tokenizer)


class SplitView(Sequence[ImageRecord]):
    """A split of a `CaptionTable` read like a list of `ImageRecord`s, each built when it is asked for."""

    def __init__(self, table: CaptionTable, name: str, rows: np.ndarray | None = None):
        self.table, self.name = table, name
        self.rows = np.arange(len(table.splits[name])) if rows is None else rows

    @property
    def arrays(self) -> SplitArrays:
        return self.table.splits[self.name]

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, i: int) -> ImageRecord: ...

    @overload
    def __getitem__(self, i: slice) -> SplitView: ...

    def __getitem__(self, i: int | slice) -> ImageRecord | SplitView:
        if isinstance(i, slice):
            return SplitView(self.table, self.name, self.rows[i])
        a, row = self.arrays, int(self.rows[i])
        first, last = int(a.image_offsets[row]), int(a.image_offsets[row + 1])
        words = self.table.words
        captions = [[words[k] for k in a.tokens[a.caption_offsets[c]:a.caption_offsets[c + 1]].tolist()]
                    for c in range(first, last)]
        size = tuple(a.sizes[row].tolist())
        return ImageRecord(int(a.image_ids[row]), Path(_text(a.paths, a.path_offsets, row)), captions,
                           [_text(a.raw, a.raw_offsets, c) for c in range(first, last)],
                           dict(a.word_boxes.get(row, {})), size if size[0] >= 0 else None, self.table.tokenizer)

    def __iter__(self) -> Iterator[ImageRecord]:
        return (self[i] for i in range(len(self)))

    def where(self, i: int) -> tuple[int, str]:
        """Image i's id and path, without building its record (what loading its image needs)."""
        row = int(self.rows[i])
        return int(self.arrays.image_ids[row]), _text(self.arrays.paths, self.arrays.path_offsets, row)

    @property
    def image_ids(self) -> list[int]:
        """The image ids in order, without building the records."""
        return self.arrays.image_ids[self.rows].tolist()

    def caption_counts(self) -> np.ndarray:
        """(N,) the number of captions of each image."""
        return np.diff(self.arrays.image_offsets)[self.rows]

    def encoded(self, vocab: Vocabulary, max_len: int) -> EncodedCaptions:
        """The captions as `vocab` ids, cut to max_len words, with <start> and <end> (CaptionDataset.encoded)."""
        lookup = np.array([vocab.stoi.get(w, vocab.unk_id) for w in self.table.words], dtype=np.int64)
        return EncodedCaptions(self, lookup, max_len, vocab.start_id, vocab.end_id)


class EncodedCaptions(Sequence[list[torch.Tensor]]):
    """`encoded[i]`: image i's captions as (n+2,) int64 tensors <start> w_1 .. w_n <end>, built on access."""

    def __init__(self, split: SplitView, lookup: np.ndarray, max_len: int, start_id: int, end_id: int):
        self.split, self.lookup, self.max_len, self.start_id, self.end_id = split, lookup, max_len, start_id, end_id

    def __len__(self) -> int:
        return len(self.split)

    @overload
    def __getitem__(self, i: int) -> list[torch.Tensor]: ...

    @overload
    def __getitem__(self, i: slice) -> EncodedCaptions: ...

    def __getitem__(self, i: int | slice) -> list[torch.Tensor] | EncodedCaptions:
        if isinstance(i, slice):
            return EncodedCaptions(self.split[i], self.lookup, self.max_len, self.start_id, self.end_id)
        a, row = self.split.arrays, int(self.split.rows[i])
        first, last = int(a.image_offsets[row]), int(a.image_offsets[row + 1])
        bounds = a.caption_offsets[first:last + 1].tolist()
        ids = self.lookup[a.tokens[bounds[0]:bounds[-1]]]  # (tokens of the image's captions,) vocabulary ids
        out = []
        for begin, end in zip(bounds[:-1], bounds[1:]):
            begin, end = begin - bounds[0], min(end, begin + self.max_len) - bounds[0]
            t = np.empty(end - begin + 2, dtype=np.int64)  # (n+2,) <start> w_1 .. w_n <end>
            t[0], t[-1] = self.start_id, self.end_id
            t[1:-1] = ids[begin:end]
            out.append(torch.from_numpy(t))
        return out

    def caption_counts(self) -> np.ndarray:
        """(N,) the number of captions of each image, without building them."""
        return self.split.caption_counts()

    def caption_lengths(self) -> np.ndarray:
        """(C,) words of each caption (cut to max_len), images in order, without building them."""
        a, counts = self.split.arrays, self.caption_counts()
        first = a.image_offsets[self.split.rows]  # (N,) each image's first caption
        captions = np.repeat(first - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())  # (C,)
        return np.minimum(np.diff(a.caption_offsets)[captions], self.max_len)


def caption_lengths(encoded: Sequence[Sequence[Any]]) -> np.ndarray:
    """(C,) words of each caption of `CaptionDataset.encoded` (<start> and <end> not counted), images in order."""
    if isinstance(encoded, EncodedCaptions):
        return encoded.caption_lengths()
    return np.array([len(c) - 2 for caps in encoded for c in caps], dtype=np.int64)


def caption_counts(encoded: Sequence[Sequence[Any]]) -> np.ndarray:
    """(N,) captions per image of `CaptionDataset.encoded`, a list or an `EncodedCaptions`."""
    if isinstance(encoded, EncodedCaptions):
        return encoded.caption_counts()
    return np.array([len(c) for c in encoded], dtype=np.int64)
