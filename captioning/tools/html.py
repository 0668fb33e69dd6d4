"""`captioning-html --results R --annotations A`: the HTML report of any COCO results file.

Scores each caption against its references (coco-caption's metrics) and writes one self-contained page; with
`--attention` (an attention.npz of captioning-evaluate) hovering a word shows its map, and `--checkpoint` crops
each image to the encoder's view, which the maps cover. The images are looked up under `--image-root`; without it,
under the checkpoint's `dataset.image_root` (the folder its run read them from) when `--checkpoint` is given, else
as the annotation file says (a Karpathy file: under its own folder). Images that are not found are said in one
warning line naming the folder and what to give.

With `--attention` the overall metrics also have attention correctness, as captioning-evaluate scores it: on the
word boxes of a Karpathy annotation file that has them (the `shapes` data set's dataset_shapes.json, where
`eval.instances` is null), or, with `--instances` (the COCO instances file `eval.instances` takes) and
`--checkpoint` (whose encoder's resize and crop say which part of each image a map covers), on instance masks.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from captioning.checkpoint import check_checkpoint_file
from captioning.cli import ArgumentParser, run_cli, writable_file
from captioning.data.readers.records import ImageRecord
from captioning.data.readers.references import load_results, read_annotations
from captioning.metrics import TOKENIZERS, attention_correctness, score_captions
from captioning.reporting.curves import CURVES_NAME, plot_history
from captioning.reporting.html import (
    ATTENTION_NAME,
    MAX_ENTRIES,
    REPORT_NAME,
    load_attention,
    load_view_uri,
    shown_count,
    write_report,
)
from captioning.reporting.items import ReportItem

logger = logging.getLogger(__name__)
PROG = "captioning-html"


def items_from_results(results: Mapping[int, str], refs: Mapping[int, list[str]], scores: Mapping[int, dict],
                       paths: Mapping[int, Path], maps: Mapping[int, np.ndarray] | None = None,
                       mark_regions: bool = False,
                       view: Callable[[Image.Image], Image.Image] | None = None) -> list[ReportItem]:
    """Report rows for a results file; `maps` (matching_maps: one map per word) are the attention maps."""
    maps = maps or {}
    return [ReportItem(image_id, caption.split(), list(refs[image_id]), dict(scores.get(image_id, {})),
                       load_view_uri(paths.get(image_id), view), maps.get(image_id), mark_regions)
            for image_id, caption in results.items()]


def matching_maps(results: Mapping[int, str], attention: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
    """The attention maps of the results' captions, each with one map per word; the others are dropped, with a
    warning (those captions are shown without attention and left out of attention correctness)."""
    maps = {i: attention[i] for i in results if i in attention and attention[i].shape[0] == len(results[i].split())}
    mismatched = [i for i in results if i in attention and i not in maps]
    missing = [i for i in results if i not in attention and results[i].split()]
    if mismatched:
        logger.warning("%d captions do not match their attention maps' word count (e.g. image %d); shown without "
                       "attention", len(mismatched), mismatched[0])
    if missing:
        logger.warning("%d captions have no attention maps in the attention file (e.g. image %d)", len(missing),
                       missing[0])
    return maps


def attention_metrics(results: Mapping[int, str], maps: Mapping[int, np.ndarray],
                      records: Sequence[ImageRecord] | None, instances: Path | None = None,
                      geometry: Callable[[int, int], Any] | None = None) -> dict[str, Any]:
    """Attention correctness of the maps, with the functions captioning-evaluate uses: on the masks of an instances
    file (coco_attention_correctness; `geometry`, a ViewGeometry, places each map's view in its image), else on the
    word boxes of the annotation file's `records` (a Karpathy file's split; None for a COCO caption file) when every
    result's image has them (attention_correctness); {} otherwise."""
    ids = [i for i in results if i in maps]
    words, alphas = [results[i].split() for i in ids], [maps[i] for i in ids]
    if instances is not None:
        from captioning.metrics.coco_attention import CocoInstances, coco_attention_correctness, full_image

        masks = CocoInstances(instances)
        masks.check_image_ids(list(results))
        return coco_attention_correctness(words, alphas, ids, masks, geometry or full_image)
    boxes = {r.image_id: (r.word_boxes, r.size) for r in records or () if r.word_boxes and r.size is not None}
    if not all(i in boxes for i in results):
        logger.info("no attention correctness: the annotation file has no word boxes for every image (give a COCO "
                    "instances file with --instances)")
        return {}
    return attention_correctness(words, alphas, [boxes[i][0] for i in ids], [boxes[i][1] for i in ids])


def check_options(args: argparse.Namespace) -> None:
    """Refuse, before any work, options that cannot be served."""
    if args.instances is not None and args.attention is None:
        raise ValueError("--instances needs --attention: attention correctness scores the maps of an attention.npz")
    if args.instances is not None and args.checkpoint is None:
        raise ValueError("--instances needs --checkpoint: its encoder's resize and crop say which part of each image "
                         "the attention maps cover")
    if args.max_entries < 0:
        raise ValueError(f"--max-entries must be >= 0 (0: every image), got {args.max_entries}")
    if args.image_root is not None and not args.image_root.is_dir():
        raise FileNotFoundError(f"--image-root is not a folder: {args.image_root}")


def build_report(args: argparse.Namespace) -> Path:
    """What `captioning-html` does with its parsed arguments; returns the report's path."""
    out = args.out or args.results.parent / REPORT_NAME
    writable_file(out)  # a read-only output fails before the scoring; nothing else is written
    check_options(args)
    view, geometry, image_root = None, None, args.image_root
    if args.checkpoint is not None:  # first: a checkpoint that is refused is refused before any scoring
        check_checkpoint_file(args.checkpoint)  # a missing or foreign file: before torch is imported
        from captioning.factory.load import load_model
        from captioning.metrics.coco_attention import view_geometry

        model, _, ckpt = load_model(args.checkpoint)
        encoder = model.encoder
        view = encoder.view
        geometry = view_geometry(encoder.transform()) if args.instances is not None else None
        run_root = ((ckpt.get("config") or {}).get("dataset") or {}).get("image_root")
        if image_root is None and isinstance(run_root, str) and Path(run_root).is_dir():
            image_root = Path(run_root)  # where the checkpoint's run read its images
            logger.info("images under %s, the checkpoint's dataset.image_root", image_root)
    annotations = read_annotations(args.annotations, args.split, image_root)
    refs, paths = annotations.references, annotations.paths
    missing = [p for p in paths.values() if not Path(p).is_file()]
    if missing:
        print(f"{PROG}: warning: {len(missing)} of {len(paths)} images are not found (e.g. {missing[0]}): their rows "
              f"have no picture; give --image-root FOLDER, the folder the annotation file's image paths are under",
              file=sys.stderr, flush=True)
        paths = {i: p for i, p in paths.items() if Path(p).is_file()}  # said once, not once a row
    results = load_results(args.results, refs)
    attention, mark = load_attention(args.attention) if args.attention else (None, False)
    maps = matching_maps(results, attention) if attention is not None else None
    correctness = {} if maps is None else attention_metrics(  # before the scoring: a bad instances file fails first
        results, maps, annotations.records, args.instances, geometry)
    scores = score_captions(results, refs, [m for m in args.metrics.split(",") if m], args.tokenizer)
    shown = dict(list(results.items())[:shown_count(len(results), args.max_entries)])  # the page's rows, no more
    items = items_from_results(shown, refs, scores.per_image, paths, maps, mark, view)
    metrics = {"results": str(args.results), **scores.overall, **correctness, "num_images": len(results),
               "tokenizer": scores.tokenizer}
    title = args.title or f"Captioning report: {args.results.name}"
    with tempfile.TemporaryDirectory() as tmp:  # the curves are embedded in the page, not left beside it
        curves = plot_history(args.history, Path(tmp) / CURVES_NAME) if args.history is not None else None
        return write_report(out, items, metrics, title, curves, total=len(results))


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: builds report.html from a COCO results file, prints its path; returns the exit status."""
    parser = ArgumentParser(prog=PROG, description="Self-contained HTML report of a results file: captions, "
                            "references, per-image scores and attention maps.",
                            epilog="example: captioning-html --results outputs/<run>/results.json --annotations "
                            "data/shapes/dataset_shapes.json --attention outputs/<run>/attention.npz --out report.html "
                            "(COCO: add --instances data/coco/annotations/instances_val2014.json --checkpoint "
                            "outputs/<run>/checkpoints/best.pt for attention correctness)")
    parser.add_argument("--results", required=True, type=Path, help='results file: [{"image_id": .., "caption": ..}]')
    parser.add_argument("--annotations", required=True, type=Path,
                        help="references: a COCO caption file or a Karpathy split file (dataset_*.json)")
    parser.add_argument("--split", default="test", help="split of a Karpathy file (default: test)")
    parser.add_argument("--image-root", type=Path, help="folder of the images (COCO: images[].file_name under it)")
    parser.add_argument("--attention", type=Path, help=f"{ATTENTION_NAME} written by captioning-evaluate (with word "
                        "boxes in --annotations, as shapes has, the page also gets attention correctness)")
    parser.add_argument("--instances", type=Path, help="COCO instances file (what eval.instances takes): attention "
                        "correctness on its masks; needs --attention and --checkpoint")
    parser.add_argument("--checkpoint", type=Path, help="the model's checkpoint, to crop images to the encoder's view")
    parser.add_argument("--history", type=Path, help="history.json of the training run: its curves go in the page")
    parser.add_argument("--metrics", default="bleu,meteor,rouge,cider", help="comma-separated coco-caption metrics")
    parser.add_argument("--tokenizer", default="auto", choices=TOKENIZERS,
                        help="as captioning-score's: auto, ptb, ptb-java, python; whitespace, char (other languages)")
    parser.add_argument("--out", type=Path, help=f"output file (default: {REPORT_NAME} next to the results)")
    parser.add_argument("--title", help="page title")
    parser.add_argument("--max-entries", type=int, default=MAX_ENTRIES, metavar="N",
                        help=f"rows the page shows: the first N results (default: {MAX_ENTRIES}; 0: all); the overall "
                        "metrics cover every result")
    args = parser.parse_args(argv)
    print(run_cli(lambda: build_report(args), PROG, (OSError, ValueError, RuntimeError)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
