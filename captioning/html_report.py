"""A self-contained HTML report of a decoded split: `captioning-html --results R --annotations A`.

report.html lists every image with its generated caption, references and per-image scores in a table sortable by
any metric; hovering or clicking a word draws that word's attention map over the image (white = attended, as in
visualize.py; for hard attention the selected cell is outlined in red). Nothing is fetched from outside the file:
thumbnails and training curves are embedded as data URIs, and attention maps travel as base64 uint8 grids that an
inline script upsamples onto a canvas laid over the image (the map covers the encoder's view of the image, so any
grid size and aspect ratio work). `plot_history` draws the training curves (loss, validation CIDEr / BLEU-4).
This module prepares the data; the page's markup, style and script are in captioning/html_page.py.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from PIL import Image

from captioning.data.karpathy import ImageError, load_image, read_karpathy
from captioning.html_page import THUMB_SIDE, render_page
from captioning.visualize import chosen_regions
from captioning.metrics import score_captions
from captioning.score import load_references, load_results

if TYPE_CHECKING:
    from captioning.data.karpathy import CaptionDataset
    from captioning.evaluate import Prediction

logger = logging.getLogger(__name__)

JPEG_QUALITY = 80
CURVES_NAME = "curves.png"
ATTENTION_NAME = "attention.npz"
REPORT_NAME = "report.html"
# Column order of the per-image metrics; any other numeric score follows, sorted by name.
METRIC_ORDER = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE")


@dataclass
class ReportItem:
    """One row of the report: an image's caption, references, scores and (optionally) its attention maps."""

    image_id: int
    words: list[str]
    references: list[str]
    scores: dict[str, float] = field(default_factory=dict)
    image_uri: str | None = None  # JPEG thumbnail of the encoder's view, as a data URI
    alphas: np.ndarray | None = None  # (T, h, w), one map per word
    mark_regions: bool = False  # hard attention: outline the cell each map selects (its argmax)

    def __post_init__(self) -> None:
        if self.alphas is not None:
            a = np.asarray(self.alphas, dtype=np.float64)
            if a.ndim != 3 or a.shape[0] != len(self.words) or 0 in a.shape[1:]:
                raise ValueError(f"image {self.image_id}: alphas must be (T, h, w) with T = {len(self.words)} "
                                 f"words, got shape {a.shape}")
            if not np.all(np.isfinite(a)):
                raise ValueError(f"image {self.image_id}: alphas contain non-finite values")
            self.alphas = a


# -- encoding ------------------------------------------------------------------------------------------------------
def image_data_uri(image: Image.Image, max_side: int = THUMB_SIDE) -> str:
    """A JPEG thumbnail (longer side max_side, aspect kept; small images are enlarged) as a data URI."""
    img = image.convert("RGB")
    scale = max_side / max(img.size)
    if scale != 1.0:
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.BICUBIC)
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
    """Write report.html (curves: a PNG to embed, if it exists); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_report(items, metrics, title, curves)
    path.write_text(text, encoding="utf-8")
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
    arrays = {f"alphas_{it.image_id}": it.alphas.astype(np.float16) for it in with_maps}
    np.savez_compressed(path, image_ids=np.array([it.image_id for it in with_maps], dtype=np.int64),
                        mark_regions=np.array(any(it.mark_regions for it in with_maps)), **arrays)
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


# -- training curves -----------------------------------------------------------------------------------------------
CURVE_PANELS = (("training loss", ("loss", "nll")), ("validation CIDEr", ("val_CIDEr",)),
                ("validation BLEU-4", ("val_Bleu_4",)))


def load_history(path: Path) -> list[dict[str, Any]]:
    """history.json of a training run: a non-empty list of per-epoch dicts, each with an 'epoch'."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"history file not found: {path}")
    try:
        history = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON (line {err.lineno}: {err.msg})") from err
    if not isinstance(history, list) or not history or not all(isinstance(h, dict) and "epoch" in h for h in history):
        raise ValueError(f"{path}: expected a non-empty list of per-epoch records with an 'epoch' key")
    return history


def curves_figure(history: Sequence[Mapping[str, Any]]) -> Figure:
    """One panel per curve group present in the history (loss, validation CIDEr, validation BLEU-4) by epoch."""
    panels = [(title, [k for k in keys if any(isinstance(h.get(k), (int, float)) for h in history)])
              for title, keys in CURVE_PANELS]
    panels = [(title, keys) for title, keys in panels if keys]
    if not panels:
        raise ValueError("the history has none of " + ", ".join(k for _, keys in CURVE_PANELS for k in keys))
    fig = Figure(figsize=(4.2 * len(panels), 3.2), dpi=100)
    FigureCanvasAgg(fig)
    for ax, (title, keys) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        for key in keys:
            pts = [(h["epoch"], float(h[key])) for h in history if isinstance(h.get(key), (int, float))]
            ax.plot([e for e, _ in pts], [v for _, v in pts], marker="o", markersize=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_history(history_path: Path, out_path: Path) -> Path:
    """Draw curves.png from a run's history.json; returns the PNG's path."""
    fig = curves_figure(load_history(history_path))
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(out_path, format="png")
    finally:
        fig.clear()
    logger.info("wrote training curves to %s", out_path)
    return out_path


# -- any results file ----------------------------------------------------------------------------------------------
def load_annotations(path: Path, split: str = "test",
                     image_root: Path | None = None) -> tuple[dict[int, list[str]], dict[int, Path]]:
    """References and image paths by image id, from a COCO caption file or a Karpathy split file (its `split`).

    COCO files give image paths only with an image_root (image_root / images[].file_name); Karpathy files
    resolve them like training does (image_root or the file's folder, then filepath / filename).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from err
    if isinstance(data, dict) and isinstance(data.get("annotations"), list):
        refs = load_references(path)
        images = data.get("images") if image_root is not None else None
        paths = {int(im["id"]): Path(image_root) / im["file_name"] for im in images or []
                 if isinstance(im, dict) and "id" in im and "file_name" in im}
        return refs, paths
    records = read_karpathy(path, split, image_root)  # raises a clear error for a missing or malformed file
    return {r.image_id: list(r.raw) for r in records}, {r.image_id: r.path for r in records}


def items_from_results(results: Mapping[int, str], refs: Mapping[int, list[str]], scores: Mapping[int, dict],
                       paths: Mapping[int, Path], attention: Mapping[int, np.ndarray] | None = None,
                       mark_regions: bool = False,
                       view: Callable[[Image.Image], Image.Image] | None = None) -> list[ReportItem]:
    """Report rows for a results file; an attention map set that does not match its caption's words is dropped."""
    items, mismatched = [], []
    for image_id, caption in results.items():
        words = caption.split()
        alphas = None if attention is None else attention.get(image_id)
        if alphas is not None and alphas.shape[0] != len(words):
            mismatched.append(image_id)
            alphas = None
        items.append(ReportItem(image_id, words, list(refs[image_id]), dict(scores.get(image_id, {})),
                                load_view_uri(paths.get(image_id), view), alphas, mark_regions))
    if mismatched:
        logger.warning("%d captions do not match their attention maps' word count (e.g. image %d); shown without "
                       "attention", len(mismatched), mismatched[0])
    return items


def main(argv: Sequence[str] | None = None) -> Path:
    """Console entry point: builds report.html from a COCO results file; prints its path."""
    parser = argparse.ArgumentParser(prog="captioning-html", description="Self-contained HTML report of a results "
                                     "file: captions, references, per-image scores and attention maps.")
    parser.add_argument("--results", required=True, type=Path, help='results file: [{"image_id": .., "caption": ..}]')
    parser.add_argument("--annotations", required=True, type=Path,
                        help="references: a COCO caption file or a Karpathy split file (dataset_*.json)")
    parser.add_argument("--split", default="test", help="split of a Karpathy file (default: test)")
    parser.add_argument("--image-root", type=Path, help="folder of the images (COCO: images[].file_name under it)")
    parser.add_argument("--attention", type=Path, help=f"{ATTENTION_NAME} written by captioning-evaluate")
    parser.add_argument("--checkpoint", type=Path, help="the model's checkpoint, to crop images to the encoder's view")
    parser.add_argument("--history", type=Path, help="history.json of the training run: plots curves.png")
    parser.add_argument("--metrics", default="bleu,meteor,rouge,cider", help="comma-separated coco-caption metrics")
    parser.add_argument("--tokenizer", default="auto", choices=["auto", "ptb-java", "python"])
    parser.add_argument("--out", type=Path, help=f"output file (default: {REPORT_NAME} next to the results)")
    parser.add_argument("--title", help="page title")
    args = parser.parse_args(argv)
    out = args.out or args.results.parent / REPORT_NAME
    try:
        if args.image_root is not None and not args.image_root.is_dir():
            raise FileNotFoundError(f"--image-root is not a folder: {args.image_root}")
        refs, paths = load_annotations(args.annotations, args.split, args.image_root)
        results = load_results(args.results, refs)
        scores = score_captions(results, refs, [m for m in args.metrics.split(",") if m], args.tokenizer)
        attention, mark = load_attention(args.attention) if args.attention else (None, False)
        view = None
        if args.checkpoint is not None:
            from captioning.checkpoint import load_model  # torch model building only when asked for

            view = load_model(args.checkpoint)[0].encoder.view
        if args.history is not None:
            plot_history(args.history, out.parent / CURVES_NAME)
        items = items_from_results(results, refs, scores.per_image, paths, attention, mark, view)
        metrics = {"results": str(args.results), **scores.overall, "num_images": len(results),
                   "tokenizer": scores.tokenizer}
        write_report(out, items, metrics, args.title or f"Captioning report: {args.results.name}",
                     out.parent / CURVES_NAME)
    except (OSError, ValueError, RuntimeError) as err:
        parser.exit(2, f"captioning-html: error: {err}\n")
    print(out)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
