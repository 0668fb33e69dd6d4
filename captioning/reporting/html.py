"""A self-contained HTML report of a decoded split (report.html) and its attention file (attention.npz).

report.html lists every image with its generated caption, references and per-image scores in a table sortable by
any metric; hovering or clicking a word draws that word's attention map over the image (white = attended, as in
the figures; for hard attention the selected cell is outlined in red). Nothing is fetched from outside the file:
thumbnails and training curves are embedded as data URIs, and attention maps travel as base64 uint8 grids that an
inline script upsamples onto a canvas laid over the image (the map covers the encoder's view of the image, so any
grid size and aspect ratio work). This module prepares the data; the page's markup, style and script are in
captioning/reporting/page.py.
"""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from captioning.base.files import atomic_file, write_text_atomic
from captioning.data.dataset import CaptionDataset
from captioning.data.images import ImageError, load_image
from captioning.reporting.curves import CURVES_NAME
from captioning.reporting.figures import chosen_regions
from captioning.reporting.items import Prediction, ReportItem
from captioning.reporting.page import THUMB_SIDE, render_page

logger = logging.getLogger(__name__)

JPEG_QUALITY = 80
ATTENTION_NAME = "attention.npz"
REPORT_NAME = "report.html"
# Column order of the per-image metrics; any other numeric score follows, sorted by name.
METRIC_ORDER = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE")


def image_data_uri(image: Image.Image, max_side: int = THUMB_SIDE) -> str:
    """A JPEG thumbnail (longer side max_side, aspect kept; small images are enlarged) as a data URI."""
    img = image.convert("RGB")
    scale = max_side / max(img.size)
    if scale != 1.0:
        size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
        img = img.resize(size, Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def png_data_uri(path: Path) -> str:
    """A PNG file as a data URI."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def quantize_maps(alphas: np.ndarray) -> np.ndarray:
    """Each (h, w) map min-max scaled to 0..255 (uint8), as visualize.upsample_attention scales it; a uniform map
    is all 255 (everything equally attended)."""
    a = np.asarray(alphas, dtype=np.float64)  # (T, h, w)
    lo = a.min(axis=(1, 2), keepdims=True)
    span = a.max(axis=(1, 2), keepdims=True) - lo
    flat = span <= 1e-12 * np.maximum(1.0, np.abs(lo))
    scaled = np.where(flat, 1.0, (a - lo) / np.where(flat, 1.0, span))
    return np.rint(scaled * 255).astype(np.uint8)


def _attention_json(item: ReportItem) -> dict[str, Any] | None:
    if item.alphas is None:
        return None
    T, h, w = item.alphas.shape
    out: dict[str, Any] = {"h": h, "w": w, "maps": base64.b64encode(quantize_maps(item.alphas).tobytes()).decode()}
    if item.mark_regions:
        out["regions"] = chosen_regions(item.alphas)
    return out


def metric_columns(items: Sequence[ReportItem]) -> list[str]:
    """The per-image numeric scores present in any item, in METRIC_ORDER then by name."""
    names = {k for it in items for k, v in it.scores.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return [m for m in METRIC_ORDER if m in names] + sorted(names - set(METRIC_ORDER))


# -- page ----------------------------------------------------------------------------------------------------------
def render_report(items: Sequence[ReportItem], metrics: Mapping[str, Any], title: str = "Captioning report",
                  curves: Path | None = None) -> str:
    """The report page as one HTML string (no external resources)."""
    if not items:
        raise ValueError("no images to report: the results are empty")
    columns = metric_columns(items)
    curves_uri = png_data_uri(curves) if curves is not None and curves.is_file() else None
    data = json.dumps({"entries": [_attention_json(it) for it in items]}, separators=(",", ":"))
    return render_page(items, columns, metrics, title, curves_uri, data)


def write_report(path: Path, items: Sequence[ReportItem], metrics: Mapping[str, Any],
                 title: str = "Captioning report", curves: Path | None = None) -> Path:
    """Write report.html atomically (curves: a PNG to embed, if it exists); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_report(items, metrics, title, curves)
    write_text_atomic(path, text)
    logger.info("wrote HTML report of %d images (%.1f MB) to %s", len(items), len(text) / 1e6, path)
    return path


# -- building items ------------------------------------------------------------------------------------------------
def load_view_uri(path: Path | None, view: Callable[[Image.Image], Image.Image] | None) -> str | None:
    """The thumbnail of the encoder's view of an image file, or None (with a warning) if it cannot be read."""
    if path is None:
        return None
    try:
        image = load_image(Path(path))
    except ImageError as err:
        logger.warning("report: %s; the row is shown without its image", err)
        return None
    return image_data_uri(view(image) if view is not None else image)


def items_from_predictions(preds: Sequence[Prediction], dataset: CaptionDataset, mark_regions: bool = False,
                           view: Callable[[Image.Image], Image.Image] | None = None) -> list[ReportItem]:
    """Report rows for decoded predictions (captions, per-image scores, attention maps, view thumbnails)."""
    return [ReportItem(p.image_id, list(p.words), list(dataset.records[p.index].raw), dict(p.scores),
                       load_view_uri(dataset.records[p.index].path, view),
                       p.alphas.detach().cpu().float().numpy() if p.words else None, mark_regions)
            for p in preds]


def save_attention(path: Path, items: Sequence[ReportItem]) -> Path:
    """attention.npz: `image_ids` (N,), one float16 (T, h, w) array `alphas_<id>` per image, and `mark_regions`."""
    with_maps = [it for it in items if it.alphas is not None]
    arrays: dict[str, Any] = {f"alphas_{it.image_id}": np.asarray(it.alphas, dtype=np.float16) for it in with_maps}
    arrays["image_ids"] = np.array([it.image_id for it in with_maps], dtype=np.int64)
    arrays["mark_regions"] = np.array(any(it.mark_regions for it in with_maps))
    with atomic_file(path) as f:
        np.savez_compressed(f, **arrays)
    return Path(path)


def load_attention(path: Path) -> tuple[dict[int, np.ndarray], bool]:
    """Read an attention.npz written by save_attention: image id -> (T, h, w) maps, and whether to mark regions."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"attention file not found: {path}")
    try:
        with np.load(path) as npz:
            ids = npz["image_ids"].tolist()
            return {int(i): npz[f"alphas_{i}"].astype(np.float64) for i in ids}, bool(npz["mark_regions"])
    except (KeyError, ValueError, OSError) as err:
        raise ValueError(f"{path} is not an attention file written by captioning-evaluate "
                         f"(image_ids, alphas_<id>, mark_regions): {err}") from err


def write_prediction_report(out_dir: Path, preds: Sequence[Prediction], dataset: CaptionDataset,
                            metrics: Mapping[str, Any], mark_regions: bool = False,
                            view: Callable[[Image.Image], Image.Image] | None = None) -> Path | None:
    """attention.npz and report.html in out_dir for decoded predictions; curves.png there is embedded if present.

    Returns the report's path, or None when there is nothing to report (no image could be decoded).
    """
    out_dir = Path(out_dir)
    if not preds:
        logger.warning("no decoded images: %s not written", out_dir / REPORT_NAME)
        return None
    items = items_from_predictions(preds, dataset, mark_regions, view)
    save_attention(out_dir / ATTENTION_NAME, items)
    return write_report(out_dir / REPORT_NAME, items, metrics, f"Captioning report: {out_dir.name}",
                        out_dir / CURVES_NAME)
