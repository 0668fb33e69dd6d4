"""Decoding and scoring during training: the validation split every epoch and the test split at the end, each
decoded by real decoding (evaluation's decode_split), sharded over the ranks under torchrun."""

from __future__ import annotations

import copy
from typing import Any, TypeVar

import torch

from captioning.base.decoding import SUPPRESS_UNK
from captioning.data.dataset import CaptionDataset
from captioning.evaluation.split import decode_split as decode_whole
from captioning.evaluation.split import score_predictions
from captioning.models.captioner import Captioner
from captioning.reporting.items import Prediction
from captioning.training import randomness
from captioning.training.distributed import broadcast_object, gather_objects, initialized, rank, world_size

T = TypeVar("T")


def shard(dataset: T) -> T:
    """This rank's 1/N of a caption data set: images rank, rank + N, rank + 2N, ... (for sharded decoding).

    Works on any data set that keeps per-image lists in `records` and `encoded` (CaptionDataset); image j of
    the shard is image rank + N * j of the whole.
    """
    if not initialized():
        return dataset
    part = copy.copy(dataset)
    part.records = dataset.records[rank()::world_size()]  # type: ignore[attr-defined]
    part.encoded = dataset.encoded[rank()::world_size()]  # type: ignore[attr-defined]
    return part


def decode_split(model: Captioner, dataset: CaptionDataset, beam_size: int, max_len: int,
                 length_penalty: float, batch_size: int, progress: bool,
                 suppress_unk: bool = SUPPRESS_UNK) -> list[Prediction] | None:
    """evaluation's decode_split, sharded: each rank decodes its 1/N of the split and rank 0 receives every
    prediction in data set order, exactly those of a single-process decode; the other ranks get None."""
    if not initialized():
        return decode_whole(model, dataset, beam_size, max_len, length_penalty, batch_size, progress,
                            suppress_unk)
    preds = decode_whole(model, shard(dataset), beam_size, max_len, length_penalty, batch_size, progress,
                         suppress_unk)
    for p in preds:  # image j of the shard is image rank + N j of the split; maps travel on the CPU
        p.index, p.alphas = rank() + world_size() * p.index, p.alphas.cpu()
    parts = gather_objects(preds)
    return sorted((p for part in parts for p in part), key=lambda p: p.index) if parts is not None else None



def decode_with_forked_rng(model: Captioner, dataset: CaptionDataset, beam_size: int, max_len: int,
                           length_penalty: float, batch_size: int, progress: bool,
                           device: torch.device,
                           suppress_unk: bool = SUPPRESS_UNK) -> list[Prediction] | None:
    """decode_split of a whole split, on every rank its shard under torchrun (rank 0 gets all predictions, the
    others None), without moving training's random streams (e.g. test_mode=sample)."""
    with randomness.forked(device):
        return decode_split(model, dataset, beam_size, max_len, length_penalty, batch_size, progress,
                            suppress_unk)


def validation_scores(preds: list[Prediction] | None, dataset: CaptionDataset,
                      collapse_share: float | None = None) -> dict[str, Any]:
    """BLEU and CIDEr-D of rank 0's predictions (and score_predictions' collapse check), on every rank,
    so that early stopping and the LR schedule take the same decisions everywhere (a collective)."""
    val = score_predictions(preds, dataset, ("bleu", "cider"), collapse_share) if preds is not None else None
    return broadcast_object(val)  # type: ignore[arg-type]  # rank 0's scores on every rank
