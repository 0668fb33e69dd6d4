"""Decode a split and score it as coco-caption does; `captioning-evaluate checkpoint=PATH`."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioning.checkpoint import load_model
from captioning.data.build import build_datasets
from captioning.data.features import open_features
from captioning.data.karpathy import CaptionDataset, ImageError, collate, load_image
from captioning.decoding import generate
from captioning.html_report import write_prediction_report
from captioning.metrics import attention_correctness, score_captions
from captioning.metrics.coco_attention import CocoInstances, coco_attention_correctness, view_geometry
from captioning.models.attention import HardAttention
from captioning.models.captioner import Captioner
from captioning.schema import validate_evaluate_config
from captioning.visualize import chosen_regions, plot_attention

logger = logging.getLogger(__name__)
# The config groups live in the top-level conf/ folder of the source tree (installed with `pip install -e`).
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


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


def selects_regions(model: Captioner) -> bool:
    """Whether the model's attention picks single regions (hard attention), so figures should mark them."""
    return isinstance(model.decoder.attention, HardAttention)


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when available; anything else is passed to torch.device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device={name} was requested but CUDA is not available; use device=cpu")
    return device


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
        decoded, (h, w) = generate(model, batch.images.to(device), beam_size, max_len, length_penalty)
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
    if all(r.word_boxes and r.size for r in recs):
        ac = attention_correctness([p.words for p in preds], [p.alphas.numpy() for p in preds],
                                   [r.word_boxes for r in recs], [r.size for r in recs])
        out.update(ac)
    out["num_images"] = len(preds)
    out["skipped_images"] = len(dataset) - len(preds)  # unreadable images are counted, never silently dropped
    return out


def write_outputs(out_dir: Path, preds: list[Prediction], dataset: CaptionDataset, metrics: dict[str, Any],
                  num_figures: int, mark_regions: bool = False, view: Callable[[Image.Image], Image.Image] | None = None,
                  num_worst: int = 20, report: bool = True) -> None:
    """metrics.json, a COCO-format results file, per-image scores, the `num_worst` images by CIDEr, and
    attention figures for the first images.

    `report` adds report.html and attention.npz (the whole split, browsable);
    `mark_regions` (hard attention) outlines the region each word's attention selects (its argmax);
    `view` maps an image to the part the encoder saw (its resize/crop), which the attention maps cover.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}
    (out_dir / "metrics.json").write_text(json.dumps(clean, indent=2) + "\n")
    results = [{"image_id": p.image_id, "caption": p.caption} for p in preds]
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    per_image = [{"image_id": p.image_id, "caption": p.caption, "references": dataset.records[p.index].raw, **p.scores}
                 for p in preds]
    (out_dir / "per_image_scores.json").write_text(json.dumps(per_image, indent=1) + "\n")
    if per_image and "CIDEr" in per_image[0]:
        worst = sorted(per_image, key=lambda r: r["CIDEr"])[:num_worst]
        (out_dir / "worst_by_cider.json").write_text(json.dumps(worst, indent=1) + "\n")
    for p in preds[:num_figures]:
        if p.words:
            try:
                image = load_image(dataset.records[p.index].path)
            except ImageError as err:  # e.g. a run from a feature cache without the images: no figure, no crash
                logger.warning("no attention figure for image %s: %s", p.image_id, err)
                continue
            image = view(image) if view is not None else image
            regions = chosen_regions(p.alphas) if mark_regions else None
            plot_attention(image, p.words, p.alphas.numpy(), out_dir / "figures" / f"{p.image_id}.png", regions=regions)
    logger.info("wrote metrics, results and %d figures to %s", min(num_figures, len(preds)), out_dir)
    if report:
        write_prediction_report(out_dir, preds, dataset, metrics, mark_regions, view)  # report.html, attention.npz


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


def evaluate(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """Load a checkpoint, decode a split of its data set and write the scores; returns the metrics."""
    validate_evaluate_config(cfg)  # a typo, bad value or missing checkpoint fails here, naming the key
    device = resolve_device(cfg.device)
    model, vocab, ckpt = load_model(cfg.checkpoint, map_location=device)
    train_cfg = OmegaConf.create(ckpt["config"])
    dataset_cfg = cfg.dataset if cfg.get("dataset") is not None else train_cfg.dataset
    features = open_features(dataset_cfg.get("features"), model.encoder, ckpt["config"]["model"]["encoder"])
    _, data = build_datasets(dataset_cfg, model.encoder.transform(), splits=[cfg.eval.split], vocab=vocab,
                             features=features)
    ds = data[cfg.eval.split]
    instances = load_instances(cfg.eval.get("instances"), ds)
    preds = decode_split(model, ds, cfg.eval.beam_size, cfg.eval.max_len, cfg.eval.length_penalty, cfg.eval.batch_size)
    metrics = {"split": cfg.eval.split, "beam_size": cfg.eval.beam_size,
               **score_predictions(preds, ds, tuple(cfg.eval.metrics))}
    if instances is not None:  # the mask-based measure replaces the box-based one (`shapes` word boxes)
        metrics.update(instance_correctness(preds, instances, model))
    write_outputs(out_dir, preds, ds, metrics, cfg.eval.num_figures, selects_regions(model), model.encoder.view,
                  report=cfg.eval.get("report", True))
    return metrics


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="evaluate")
def main(cfg: DictConfig) -> None:
    """Console entry point."""
    metrics = evaluate(cfg, Path(HydraConfig.get().runtime.output_dir))
    print(json.dumps(metrics, indent=2))


if __name__ == "__main__":
    main()
