"""`captioning-html --results R --annotations A`: the HTML report of any COCO results file.

Scores each caption against its references (coco-caption's metrics) and writes one self-contained page; with
`--attention` (an attention.npz of captioning-evaluate) hovering a word shows its map, and `--checkpoint` crops
each image to the encoder's view, which the maps cover.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from captioning.cli import ArgumentParser, run_cli, writable_file
from captioning.data.references import load_annotations, load_results
from captioning.metrics import score_captions
from captioning.reporting.curves import CURVES_NAME, plot_history
from captioning.reporting.html import ATTENTION_NAME, REPORT_NAME, load_attention, load_view_uri, write_report
from captioning.reporting.items import ReportItem

logger = logging.getLogger(__name__)
PROG = "captioning-html"


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


def build_report(args: argparse.Namespace) -> Path:
    """What `captioning-html` does with its parsed arguments; returns the report's path."""
    out = args.out or args.results.parent / REPORT_NAME
    writable_file(out)  # a read-only output fails before the scoring; nothing else is written
    if args.image_root is not None and not args.image_root.is_dir():
        raise FileNotFoundError(f"--image-root is not a folder: {args.image_root}")
    view = None
    if args.checkpoint is not None:  # first: a checkpoint that is refused is refused before any scoring
        from captioning.factory.checkpoints import load_model

        view = load_model(args.checkpoint)[0].encoder.view
    refs, paths = load_annotations(args.annotations, args.split, args.image_root)
    results = load_results(args.results, refs)
    scores = score_captions(results, refs, [m for m in args.metrics.split(",") if m], args.tokenizer)
    attention, mark = load_attention(args.attention) if args.attention else (None, False)
    items = items_from_results(results, refs, scores.per_image, paths, attention, mark, view)
    metrics = {"results": str(args.results), **scores.overall, "num_images": len(results),
               "tokenizer": scores.tokenizer}
    title = args.title or f"Captioning report: {args.results.name}"
    with tempfile.TemporaryDirectory() as tmp:  # the curves are embedded in the page, not left beside it
        curves = plot_history(args.history, Path(tmp) / CURVES_NAME) if args.history is not None else None
        return write_report(out, items, metrics, title, curves)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: builds report.html from a COCO results file, prints its path; returns the exit status."""
    parser = ArgumentParser(prog=PROG, description="Self-contained HTML report of a results file: captions, "
                            "references, per-image scores and attention maps.",
                            epilog="example: captioning-html --results outputs/<run>/results.json --annotations "
                            "data/shapes/dataset_shapes.json --attention outputs/<run>/attention.npz --out report.html")
    parser.add_argument("--results", required=True, type=Path, help='results file: [{"image_id": .., "caption": ..}]')
    parser.add_argument("--annotations", required=True, type=Path,
                        help="references: a COCO caption file or a Karpathy split file (dataset_*.json)")
    parser.add_argument("--split", default="test", help="split of a Karpathy file (default: test)")
    parser.add_argument("--image-root", type=Path, help="folder of the images (COCO: images[].file_name under it)")
    parser.add_argument("--attention", type=Path, help=f"{ATTENTION_NAME} written by captioning-evaluate")
    parser.add_argument("--checkpoint", type=Path, help="the model's checkpoint, to crop images to the encoder's view")
    parser.add_argument("--history", type=Path, help="history.json of the training run: its curves go in the page")
    parser.add_argument("--metrics", default="bleu,meteor,rouge,cider", help="comma-separated coco-caption metrics")
    parser.add_argument("--tokenizer", default="auto", choices=["auto", "ptb-java", "python"])
    parser.add_argument("--out", type=Path, help=f"output file (default: {REPORT_NAME} next to the results)")
    parser.add_argument("--title", help="page title")
    args = parser.parse_args(argv)
    print(run_cli(lambda: build_report(args), PROG, (OSError, ValueError, RuntimeError)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
