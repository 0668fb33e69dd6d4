"""Caption a whole split and score it: the library code between decoding and the reports.

`decode_split` runs real decoding (greedy or beam search, never teacher forcing) over a data set and returns one
`Prediction` per readable image; `score_predictions` scores them as coco-caption does, plus attention correctness
where the data set has object boxes; `instance_correctness` does it on COCO instance masks. `evaluate_split` is
the one chain from a model and a split to metrics.json and the report, run by `captioning-evaluate` and at the end
of training.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any, cast

import torch
import yaml
from omegaconf import OmegaConf
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioning.base.decoding import SUPPRESS_UNK
from captioning.data.dataset import CaptionDataset, collate
from captioning.evaluation.outputs import write_outputs
from captioning.evaluation.region_maps import paint_predictions, painted
from captioning.metrics import (
    attention_correctness,
    diversity_and_collapse,
    score_captions,
)
from captioning.metrics.chair import chair_on_shapes, is_shapes_annotation
from captioning.metrics.chair_coco import chair_on_coco
from captioning.metrics.coco_attention import CocoInstances, coco_attention_correctness, view_geometry
from captioning.models.captioner import Captioner, reports_sentinel, selects_regions
from captioning.reporting.items import Prediction
from captioning.runtime import CONF_DIR

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalSettings:
    """The `eval` config section: which split, how it is decoded, what is scored and written. No defaults of its
    own: the values are conf/eval/default.yaml's (`EvalSettings.shipped()`), or a composed config's (`of`)."""

    split: str
    beam_size: int
    max_len: int
    length_penalty: float
    batch_size: int
    metrics: tuple[str, ...]
    num_figures: int
    report: bool  # report.html and attention.npz
    instances: str | None  # COCO instances file: attention correctness on its masks
    compile: bool  # decode through a compiled decoder step
    attention_layer: int | None  # decoder=transformer: the cross-attention layer figures read (None: its own)
    attention_head: int | None  # ... and one head of it (None: the decoder's choice)
    collapse_share: float  # one caption for more than this share of the images: said in one line (collapse)
    suppress_unk: bool  # decoding never emits <unk>

    @classmethod
    def of(cls, ev: Any) -> EvalSettings:
        """From an `eval` config section (a DictConfig). A key added after the first release (report, instances,
        compile, attention_layer, attention_head, collapse_share, suppress_unk) that an older section lacks takes
        conf/eval/default.yaml's value."""
        def later(key: str) -> Any:
            return ev[key] if key in ev else shipped_eval()[key]

        collapse_share = float(later("collapse_share"))
        if not 0.0 <= collapse_share <= 1.0:
            raise ValueError(f"eval.collapse_share must be a share of the images, from 0 to 1 (1: never warn); got "
                             f"{collapse_share:g}")
        return cls(str(ev.split), int(ev.beam_size), int(ev.max_len), float(ev.length_penalty),
                   int(ev.batch_size), tuple(ev.metrics), int(ev.num_figures), bool(later("report")),
                   later("instances") or None, bool(later("compile")), later("attention_layer"),
                   later("attention_head"), collapse_share, bool(later("suppress_unk")))

    @classmethod
    def shipped(cls, **changes: Any) -> EvalSettings:
        """conf/eval/default.yaml's settings, with `changes` (as `eval.KEY=VALUE` overrides would make them)."""
        return replace(cls.of(OmegaConf.create(shipped_eval())), **changes)


@cache
def shipped_eval() -> dict[str, Any]:
    """conf/eval/default.yaml as shipped: the one copy of the eval defaults."""
    return cast(dict[str, Any], yaml.safe_load((CONF_DIR / "eval" / "default.yaml").read_text(encoding="utf-8")))


Decode = Callable[[Captioner, CaptionDataset, EvalSettings], "Sequence[Prediction] | None"]


@torch.no_grad()
def decode_split(model: Captioner, dataset: CaptionDataset, beam_size: int, max_len: int, length_penalty: float = 0.0,
                 batch_size: int = 50, progress: bool = True, suppress_unk: bool = SUPPRESS_UNK) -> list[Prediction]:
    """Caption every image of a data set (real decoding, not teacher forcing); `suppress_unk`: never <unk>."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate)
    sentinel = reports_sentinel(model)  # decoder=adaptive: keep beta_t
    preds: list[Prediction] = []
    skipped: list[str] = []
    for batch in tqdm(loader, desc=f"decode (beam {beam_size})", disable=not progress, leave=False):
        skipped += batch.skipped
        if not batch.indices:
            continue
        mask = None if batch.mask is None else batch.mask.to(device)
        decoded, (h, w) = model.generate(batch.images.to(device), beam_size, max_len, length_penalty, mask=mask,
                                         suppress_unk=suppress_unk)
        counts = [h * w] * len(batch.indices) if batch.mask is None else batch.mask.sum(dim=1).tolist()
        betas = decoded.channels if sentinel and decoded.channels is not None else [None] * len(decoded.tokens)
        for i, toks, alpha, n, beta in zip(batch.indices, decoded.tokens, decoded.alphas, counts, betas):
            words = dataset.vocab.decode(toks)
            maps = alpha.view(-1, h, w) if batch.mask is None else alpha[:, :n].reshape(-1, 1, n)  # own regions
            preds.append(Prediction(i, dataset.records[i].image_id, words, maps,
                                    sentinel=None if beta is None else beta[:, 0].float().tolist()))
    model.train(was_training)
    if skipped:
        logger.warning("skipped %d unreadable images (not scored): %s", len(skipped),
                       "; ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else ""))
    return preds


def score_predictions(preds: list[Prediction], dataset: CaptionDataset, metrics: tuple[str, ...],
                      collapse_share: float | None = None) -> dict[str, Any]:
    """coco-caption scores, plus attention correctness where the data set has object boxes, object hallucination
    (CHAIR, metrics/chair.py) where it knows each image's objects (`shapes`), and how varied the captions are. One
    caption for more than `collapse_share` of the images (eval.collapse_share; None: the shipped value) is warned
    about in one line and named in the scores (`collapsed_caption`).

    Also fills each prediction's per-image `scores`.
    """
    candidates = {p.image_id: p.caption for p in preds}
    references = {dataset.records[p.index].image_id: dataset.records[p.index].raw for p in preds}
    scores = score_captions(candidates, references, metrics=metrics, tokenizer=dataset.tokenizer)
    for p in preds:
        p.scores = dict(scores.per_image[p.image_id])
    out: dict[str, Any] = dict(scores.overall)
    out["tokenizer"] = scores.tokenizer
    if scores.skipped:
        out["skipped"] = scores.skipped
    recs = [dataset.records[p.index] for p in preds]
    sizes = [r.size for r in recs]
    if region_sets(dataset) and not painted(preds):
        pass  # one weight per region, no map over the image: painted on the boxes at the test, if there are any
    elif all(r.word_boxes for r in recs) and all(size is not None for size in sizes):
        ac = attention_correctness([p.words for p in preds], [p.alphas.numpy() for p in preds],
                                   [r.word_boxes for r in recs], cast(list[tuple[int, int]], sizes))
        out.update(ac)
    if recs and all(is_shapes_annotation(r.word_boxes) for r in recs):  # objects known: hallucination (CHAIR)
        chair = chair_on_shapes({p.image_id: p.words for p in preds}, {r.image_id: r.word_boxes for r in recs})
        out.update(chair.overall)
        for p in preds:
            p.scores.update(chair.per_image[p.image_id])
    threshold = float(shipped_eval()["collapse_share"]) if collapse_share is None else collapse_share
    diversity, note = diversity_and_collapse([p.words for p in preds], threshold)
    out.update(diversity)  # beside the n-gram scores: how varied the captions are
    if note is not None:
        logger.warning(note)
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


def coco_chair(preds: list[Prediction], dataset: CaptionDataset, instances: CocoInstances) -> dict[str, Any]:
    """CHAIR on COCO (metrics/chair_coco.py): each image's objects are its instance annotations' categories and those
    its references name. Also fills each prediction's per-image CHAIR and hallucinated words."""
    references = {p.image_id: dataset.records[p.index].raw for p in preds}
    chair = chair_on_coco({p.image_id: p.words for p in preds}, instances.categories([p.image_id for p in preds]),
                          references)
    for p in preds:
        p.scores.update(chair.per_image[p.image_id])
    return chair.overall


def instance_correctness(preds: list[Prediction], instances: CocoInstances, model: Captioner) -> dict[str, Any]:
    """Attention correctness on the instance masks of the categories the generated words name."""
    return coco_attention_correctness([p.words for p in preds], [p.alphas.numpy() for p in preds],
                                      [p.image_id for p in preds], instances, view_geometry(model.encoder.transform()))




def _decode(model: Captioner, dataset: CaptionDataset, ev: EvalSettings) -> list[Prediction]:
    return decode_split(model, dataset, ev.beam_size, ev.max_len, ev.length_penalty, ev.batch_size,
                        suppress_unk=ev.suppress_unk)


def evaluate_split(model: Captioner, dataset: CaptionDataset, ev: EvalSettings, out_dir: Path,
                   instances: CocoInstances | None = None, before: dict[str, Any] | None = None,
                   after: dict[str, Any] | None = None, decode: Decode = _decode) -> dict[str, Any] | None:
    """Decode a split with the eval settings, score it and write its files (metrics.json, results, figures,
    report.html); returns the metrics: `before`, split and beam size, the scores, `after`.

    `decode` is how the split is decoded (under torchrun: each rank a shard, rank 0 gets them all); where it
    returns None (a rank other than 0), this process neither scores nor writes, and gets None.
    """
    preds = decode(model, dataset, ev)
    if preds is None:
        return None
    preds = list(preds)
    # region sets with boxes: their weights painted over the image, before scoring reads them (region_maps.py)
    sets = region_sets(dataset) and not paint_predictions(preds, dataset)
    metrics = {**(before or {}), "split": ev.split, "beam_size": ev.beam_size,
               **score_predictions(preds, dataset, ev.metrics, ev.collapse_share), **(after or {})}
    if instances is not None and "chair_mentions" not in metrics:  # CHAIR on COCO (`shapes` has its own objects)
        metrics.update(coco_chair(preds, dataset, instances))
    if instances is not None and not sets:  # the mask-based measure replaces the box-based one (`shapes` word boxes)
        metrics.update(instance_correctness(preds, instances, model))
    if sets and (ev.num_figures or ev.report or instances is not None):
        logger.warning("region sets without boxes carry no map over the image: no attention figures, report page or "
                       "attention correctness (their maps (T, 1, regions) are not drawn); metrics and results are "
                       "written")
    write_outputs(out_dir, preds, dataset, metrics, 0 if sets else ev.num_figures, selects_regions(model),
                  model.encoder.view, report=ev.report and not sets)
    return metrics


def region_sets(dataset: CaptionDataset) -> bool:
    """Whether the data set reads region sets (each image its own number of regions), not grids."""
    return dataset.features is not None and dataset.features.sets
