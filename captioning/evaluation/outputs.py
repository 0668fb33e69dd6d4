"""Everything a decoded split leaves in its run folder: scores, results, per-image scores, figures, the report."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

from captioning.base.jsonio import write_json_atomic
from captioning.data.dataset import CaptionDataset
from captioning.data.images import ImageError, load_image
from captioning.reporting.figures import chosen_regions, plot_attention
from captioning.reporting.html import write_prediction_report
from captioning.reporting.items import Prediction

logger = logging.getLogger(__name__)


def write_outputs(out_dir: Path, preds: list[Prediction], dataset: CaptionDataset, metrics: dict[str, Any],
                  num_figures: int, mark_regions: bool = False,
                  view: Callable[[Image.Image], Image.Image] | None = None,
                  num_worst: int = 20, report: bool = True) -> None:
    """metrics.json, a COCO-format results file, per-image scores, the `num_worst` images by CIDEr, and
    attention figures for the first images. Every file is written atomically: a failed write (a full disk) raises
    one OSError line naming the file and leaves that file's previous version whole.

    `report` adds report.html and attention.npz (the whole split, browsable);
    `mark_regions` (hard attention) outlines the region each word's attention selects (its argmax);
    `view` maps an image to the part the encoder saw (its resize/crop), which the attention maps cover.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}
    write_json_atomic(out_dir / "metrics.json", clean, indent=2)
    results = [{"image_id": p.image_id, "caption": p.caption} for p in preds]
    write_json_atomic(out_dir / "results.json", results, indent=1)
    per_image: list[dict[str, Any]] = [{"image_id": p.image_id, "caption": p.caption,
                                        "references": dataset.records[p.index].raw, **p.scores} for p in preds]
    write_json_atomic(out_dir / "per_image_scores.json", per_image, indent=1)
    if per_image and "CIDEr" in per_image[0]:
        worst = sorted(per_image, key=lambda r: r["CIDEr"])[:num_worst]
        write_json_atomic(out_dir / "worst_by_cider.json", worst, indent=1)
    for p in preds[:num_figures]:  # an empty caption: the image alone, titled so (reporting/figures.py)
        try:
            image = load_image(dataset.records[p.index].path)
        except ImageError as err:  # e.g. a run from a feature cache without the images: no figure, no crash
            logger.warning("no attention figure for image %s: %s", p.image_id, err)
            continue
        image = view(image) if view is not None else image
        regions = chosen_regions(p.alphas) if mark_regions and p.words else None
        plot_attention(image, p.words, p.alphas.numpy(), out_dir / "figures" / f"{p.image_id}.png", regions=regions,
                       sentinel=p.sentinel)
    logger.info("wrote metrics, results and %d figures to %s", min(num_figures, len(preds)), out_dir)
    if report:
        write_prediction_report(out_dir, preds, dataset, metrics, mark_regions, view)  # report.html, attention.npz
