"""Caption a whole split and score it: the library code between decoding and the reports.

`decode_split` runs real decoding (greedy or beam search, never teacher forcing) over a data set and returns one
`Prediction` per readable image; `score_predictions` scores them as coco-caption does, plus attention correctness
where the data set has object boxes; `instance_correctness` does it on COCO instance masks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioning.data.dataset import CaptionDataset, collate
from captioning.metrics import attention_correctness, caption_diversity, score_captions
from captioning.metrics.coco_attention import CocoInstances, coco_attention_correctness, view_geometry
from captioning.models.captioner import Captioner

logger = logging.getLogger(__name__)


@dataclass
class Prediction:
    """One decoded image: its caption and the (T, h, w) attention maps of its words."""

    index: int
    image_id: int
    words: list[str]
    alphas: torch.Tensor  # (T, h, w)
    scores: dict[str, float] = field(default_factory=dict)  # per-image metrics, once scored

    @property
    def caption(self) -> str:
        return " ".join(self.words)


@torch.no_grad()
def decode_split(model: Captioner, dataset: CaptionDataset, beam_size: int, max_len: int, length_penalty: float = 0.0,
                 batch_size: int = 50, progress: bool = True) -> list[Prediction]:
    """Caption every image of a data set (real decoding, not teacher forcing)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate)
    preds: list[Prediction] = []
    skipped: list[str] = []
    for batch in tqdm(loader, desc=f"decode (beam {beam_size})", disable=not progress, leave=False):
        skipped += batch.skipped
        if not batch.indices:
            continue
        decoded, (h, w) = model.generate(batch.images.to(device), beam_size, max_len, length_penalty)
        for i, toks, alpha in zip(batch.indices, decoded.tokens, decoded.alphas):
            words = dataset.vocab.decode(toks)
            preds.append(Prediction(i, dataset.records[i].image_id, words, alpha.view(-1, h, w)))
    model.train(was_training)
    if skipped:
        logger.warning("skipped %d unreadable images (not scored): %s", len(skipped),
                       "; ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else ""))
    return preds


def score_predictions(preds: list[Prediction], dataset: CaptionDataset, metrics: tuple[str, ...]) -> dict[str, Any]:
    """coco-caption scores, plus attention correctness where the data set has object boxes.

    Also fills each prediction's per-image `scores`.
    """
    candidates = {p.image_id: p.caption for p in preds}
    references = {dataset.records[p.index].image_id: dataset.records[p.index].raw for p in preds}
    scores = score_captions(candidates, references, metrics=metrics)
    for p in preds:
        p.scores = scores.per_image[p.image_id]
    out: dict[str, Any] = dict(scores.overall)
    out["tokenizer"] = scores.tokenizer
    if scores.skipped:
        out["skipped"] = scores.skipped
    recs = [dataset.records[p.index] for p in preds]
    sizes = [r.size for r in recs]
    if all(r.word_boxes for r in recs) and all(size is not None for size in sizes):
        ac = attention_correctness([p.words for p in preds], [p.alphas.numpy() for p in preds],
                                   [r.word_boxes for r in recs], cast(list[tuple[int, int]], sizes))
        out.update(ac)
    out.update(caption_diversity([p.words for p in preds]))  # beside the n-gram scores: how varied the captions are
    out["num_images"] = len(preds)
    out["skipped_images"] = len(dataset) - len(preds)  # unreadable images are counted, never silently dropped
    return out


def load_instances(path: str | None, dataset: CaptionDataset) -> CocoInstances | None:
    """COCO instance masks for attention correctness (`eval.instances`), read and matched to the split's images
    before the long decode, so a wrong file fails at once; None when no file is given."""
    if not path:
        return None
    instances = CocoInstances(path)
    instances.check_image_ids([r.image_id for r in dataset.records])
    return instances


def instance_correctness(preds: list[Prediction], instances: CocoInstances, model: Captioner) -> dict[str, Any]:
    """Attention correctness on the instance masks of the categories the generated words name."""
    return coco_attention_correctness([p.words for p in preds], [p.alphas.numpy() for p in preds],
                                      [p.image_id for p in preds], instances, view_geometry(model.encoder.transform()))


