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
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from captioning.base.files import atomic_file, write_text_atomic
from captioning.base.messages import one_line
from captioning.data.images import ImageError, load_image
from captioning.reporting.curves import CURVES_NAME
from captioning.reporting.figures import chosen_regions
from captioning.reporting.items import Prediction, ReportItem
from captioning.reporting.npz import MAX_BYTES, Member, open_npz
from captioning.reporting.page import THUMB_SIDE, capped_note, render_page

if TYPE_CHECKING:  # a type only: captioning-html reads no data set, and needs no torch
    from captioning.data.dataset import CaptionDataset

logger = logging.getLogger(__name__)

JPEG_QUALITY = 80
ATTENTION_NAME = "attention.npz"
REPORT_NAME = "report.html"
# Rows a page shows by default (`captioning-html --max-entries`, 0: all): the first ones, in result order. A row with
# a photo's thumbnail and its maps takes about 10-25 kB, so a capped page stays under about 50 MB, which a browser
# still opens (a million rows made a 794 MB page).
MAX_ENTRIES = 2000
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
    is all 255 (everything equally attended), a map with no mass all 0 (monotonic attention attending to nothing)."""
    a = np.asarray(alphas, dtype=np.float64)  # (T, h, w)
    lo = a.min(axis=(1, 2), keepdims=True)
    span = a.max(axis=(1, 2), keepdims=True) - lo
    flat = span <= 1e-12 * np.maximum(1.0, np.abs(lo))
    empty = ~a.any(axis=(1, 2), keepdims=True)
    scaled = np.where(empty, 0.0, np.where(flat, 1.0, (a - lo) / np.where(flat, 1.0, span)))
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
def shown_count(total: int, max_entries: int = MAX_ENTRIES) -> int:
    """How many of `total` rows a page capped at `max_entries` (0: no cap) shows: the first ones, in result order."""
    return total if max_entries <= 0 else min(total, max_entries)


def render_report(items: Sequence[ReportItem], metrics: Mapping[str, Any], title: str = "Captioning report",
                  curves: Path | None = None, total: int | None = None) -> str:
    """The report page as one HTML string (no external resources); `total`: how many rows there were before the
    page's cap kept `items` (the first ones), said on the page."""
    if not items:
        raise ValueError("no images to report: the results are empty")
    columns = metric_columns(items)
    curves_uri = png_data_uri(curves) if curves is not None and curves.is_file() else None
    data = json.dumps({"entries": [_attention_json(it) for it in items]}, separators=(",", ":"))
    return render_page(items, columns, metrics, title, curves_uri, data, total)


def write_report(path: Path, items: Sequence[ReportItem], metrics: Mapping[str, Any],
                 title: str = "Captioning report", curves: Path | None = None, total: int | None = None) -> Path:
    """Write report.html atomically (curves: a PNG to embed, if it exists); returns the path. `total` as in
    render_report: when rows were left out, the page says so and one warning line says how to show them."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_report(items, metrics, title, curves, total)
    write_text_atomic(path, text)
    logger.info("wrote HTML report of %d images (%.1f MB) to %s", len(items), len(text) / 1e6, path)
    if total is not None and total > len(items):
        logger.warning("%s: %s", path, capped_note(len(items), total))
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
                           view: Callable[[Image.Image], Image.Image] | None = None,
                           images: bool = True) -> list[ReportItem]:
    """Report rows for decoded predictions (captions, per-image scores, attention maps, view thumbnails unless
    `images` is False)."""
    return [ReportItem(p.image_id, list(p.words), list(dataset.records[p.index].raw), dict(p.scores),
                       load_view_uri(dataset.records[p.index].path, view) if images else None,
                       p.alphas.detach().cpu().float().numpy() if p.words else None, mark_regions, p.sentinel)
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


ATTENTION_LAYOUT = "an attention file written by captioning-evaluate (image_ids, alphas_<id>, mark_regions)"


def _check_layout(path: Path, members: Mapping[str, Member]) -> None:
    """Refuse, from the headers alone, an attention file that save_attention cannot have written."""
    n_maps = sum(name.startswith("alphas_") for name in members)
    ids, mark = members.get("image_ids"), members.get("mark_regions")
    if ids is None or ids.shape != (n_maps,) or ids.dtype.kind not in "iu":
        raise ValueError(f"{path} is not {ATTENTION_LAYOUT}: member 'image_ids.npy' should hold the {n_maps} ids of "
                         f"its {n_maps} maps, got {'none' if ids is None else f'a {ids.shape} {ids.dtype} array'}")
    if mark is None or mark.shape != ():
        raise ValueError(f"{path} is not {ATTENTION_LAYOUT}: member 'mark_regions.npy' should be one flag")
    flat = next((m for name, m in members.items() if name.startswith("alphas_") and len(m.shape) != 3), None)
    if flat is not None:
        raise ValueError(f"{path} is not {ATTENTION_LAYOUT}: member {flat.label} has the shape {flat.shape}, "
                         "not (T, h, w)")


def load_attention(path: Path, max_bytes: int = MAX_BYTES) -> tuple[dict[int, np.ndarray], bool]:
    """Read an attention.npz written by save_attention: image id -> (T, h, w) maps, and whether to mark regions.

    The file may be a stranger's: open_npz checks every member's header (plain numbers, the size the zip records,
    at most `max_bytes` in all as float64) and _check_layout their shapes before anything is loaded; a refusal is
    one ValueError line naming the file and the member."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"attention file not found: {path}")
    with open_npz(path, max_bytes, ATTENTION_LAYOUT) as (npz, members):
        _check_layout(path, members)
        try:
            ids = npz["image_ids"]
            return {int(i): npz[f"alphas_{i}"].astype(np.float64) for i in ids}, bool(npz["mark_regions"])
        except (KeyError, ValueError, OSError, EOFError, zlib.error) as err:  # a missing member, a broken stream
            raise ValueError(f"{path} is not {ATTENTION_LAYOUT}: {one_line(err)}") from err


def write_prediction_report(out_dir: Path, preds: Sequence[Prediction], dataset: CaptionDataset,
                            metrics: Mapping[str, Any], mark_regions: bool = False,
                            view: Callable[[Image.Image], Image.Image] | None = None,
                            max_entries: int = MAX_ENTRIES) -> Path | None:
    """attention.npz (every prediction) and report.html (the first `max_entries`, 0: all) in out_dir for decoded
    predictions; curves.png there is embedded if present.

    Returns the report's path, or None when there is nothing to report (no image could be decoded).
    """
    out_dir = Path(out_dir)
    if not preds:
        logger.warning("no decoded images: %s not written", out_dir / REPORT_NAME)
        return None
    shown = shown_count(len(preds), max_entries)
    items = (items_from_predictions(preds[:shown], dataset, mark_regions, view)  # thumbnails for the page's rows only
             + items_from_predictions(preds[shown:], dataset, mark_regions, view, images=False))
    save_attention(out_dir / ATTENTION_NAME, items)
    return write_report(out_dir / REPORT_NAME, items[:shown], metrics, f"Captioning report: {out_dir.name}",
                        out_dir / CURVES_NAME, len(items))
