"""Score a COCO results file like the official evaluation server: `captioning-score --annotations A --results R`.

The references are a COCO caption file or a Karpathy split file (`--split`, default test), told apart by their
content; the rules each file must follow are in captioning/data/readers/references.py, checked before any scoring, each
failure a clear error naming the file. Only the images in the results are scored (coco-caption's
`imgIds = res.getImgIds()`).

    captioning-score --annotations captions_val2014.json --results results.json
    captioning-score --annotations data/shapes/dataset_shapes.json --results outputs/<run>/results.json
    captioning-score --annotations captions_val2014.json --instances instances_val2014.json --results r.json \
        --metrics bleu,meteor,rouge,cider,chair

Beside the scores: how varied the captions are (distinct_captions, top_caption_share, ...: metrics/diversity.py),
and one warning line on stderr when one caption is given for more than --collapse-share of the images (the model may
have collapsed onto it), as training and captioning-evaluate say it.

`chair` adds object hallucination (CHAIR_i, CHAIR_s: captioning/metrics/chair.py): on COCO against each image's
instance annotations (`--instances`) and the objects its references name, on `shapes` against the annotation
file's own objects.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from captioning.base.files import write_text_atomic
from captioning.cli import ArgumentParser, run_cli, writable_file

# Text-only imports: references and metrics.coco need neither torch nor pycocotools (tests/tools/test_score_imports.py).
from captioning.data.readers.references import Annotations, load_results, read_annotations
from captioning.metrics.chair import ChairScores, chair_on_shapes, is_shapes_annotation
from captioning.metrics.chair_coco import caption_words, chair_on_coco, instance_objects
from captioning.metrics.coco import TOKENIZERS, score_captions
from captioning.metrics.diversity import COLLAPSE_SHARE, diversity_and_collapse

logger = logging.getLogger(__name__)
PROG = "captioning-score"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text + "\n")


def chair_of(results: dict[int, str], found: Annotations, instances: str | Path | None) -> ChairScores:
    """CHAIR of the results: on `shapes` (a Karpathy file of `shapes` annotations) against each image's objects in
    the file, else on COCO against `instances` and the objects the references name (refused without it)."""
    records = {r.image_id: r for r in found.records or []}
    if records and all(is_shapes_annotation(records[i].word_boxes) for i in results):
        return chair_on_shapes({i: caption_words(c) for i, c in results.items()},
                               {i: records[i].word_boxes for i in results})
    if not instances:
        raise ValueError("chair on COCO needs --instances (COCO's instance annotations of the captioned images, "
                         "e.g. instances_val2014.json)")
    return chair_on_coco(results, instance_objects(instances, results), found.references)


def score_files(annotations: str | Path, results: str | Path, metrics: Sequence[str] = ("bleu", "meteor", "rouge",
                "cider"), tokenizer: str = "auto", out: str | Path | None = None,
                per_image: str | Path | None = None, split: str = "test", instances: str | Path | None = None,
                collapse_share: float = COLLAPSE_SHARE) -> dict[str, Any]:
    """Score a results file against an annotation file (COCO, or a Karpathy file's `split`); writes the metrics
    (and per-image scores) if asked. `chair` among the metrics adds CHAIR (`chair_of`; COCO needs `instances`).
    The captions' diversity is reported too; one caption for more than `collapse_share` of the images is said in one
    warning line on stderr and named in the metrics (`collapsed_caption`)."""
    if not 0.0 <= collapse_share <= 1.0:
        raise ValueError(f"--collapse-share must be a share of the images, from 0 to 1 (1: never warn); got "
                         f"{collapse_share:g}")
    for path in (out, per_image):
        if path:
            writable_file(path)  # a read-only output fails now, not after the scoring
    found = read_annotations(annotations, split)
    res = load_results(results, found.references)
    chair = chair_of(res, found, instances) if "chair" in metrics else None  # a missing file fails before scoring
    caption_metrics = [m for m in metrics if m != "chair"]
    scores = score_captions(res, found.references, metrics=caption_metrics, tokenizer=tokenizer) if caption_metrics \
        else None
    # words for the diversity figures: lower case, punctuation dropped (no tokenizer: the command stays light)
    diversity, note = diversity_and_collapse([re.findall(r"\w+", c.lower()) for c in res.values()], collapse_share)
    if note is not None:
        print(f"{PROG}: warning: {note}", file=sys.stderr, flush=True)
    summary: dict[str, Any] = {**(scores.overall if scores else {}), **(chair.overall if chair else {}),
                               **diversity, "num_images": len(res)}
    if scores:
        summary["tokenizer"] = scores.tokenizer
        if scores.skipped:
            summary["skipped"] = scores.skipped
    if out:
        _write(Path(out), json.dumps(summary, indent=2))
    if per_image:
        rows = [{"image_id": i, "caption": c, **(scores.per_image[i] if scores else {}),
                 **(chair.per_image[i] if chair else {})} for i, c in res.items()]
        _write(Path(per_image), json.dumps(rows, indent=1))
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: prints the metrics as JSON on stdout; returns the exit status (0)."""
    parser = ArgumentParser(prog=PROG, description="Score a COCO results file with coco-caption's metrics (PTB "
                            "tokenizer, BLEU-1..4, METEOR, ROUGE-L, CIDEr-D; SPICE if installed).",
                            epilog="example: captioning-score --annotations data/shapes/dataset_shapes.json "
                            "--results outputs/<run>/results.json")
    parser.add_argument("--annotations", required=True,
                        help="references: a COCO caption file, or a Karpathy split file (dataset_*.json, see --split)")
    parser.add_argument("--split", default="test", help="the split of a Karpathy file to score against (default: test)")
    parser.add_argument("--results", required=True, help='results file: [{"image_id": ..., "caption": ...}]')
    parser.add_argument("--metrics", default="bleu,meteor,rouge,cider",
                        help="comma-separated; add spice if installed, chair for object hallucination (CHAIR_i, "
                        "CHAIR_s; on COCO with --instances)")
    parser.add_argument("--instances", help="COCO instance annotations of the captioned images (instances_val2014"
                        ".json): the objects chair counts against, with those the references name")
    parser.add_argument("--tokenizer", default="auto", choices=TOKENIZERS,
                        help="how captions become words: auto or ptb (the PTB tokenizer, in Java where it is on the "
                        "PATH), ptb-java or python (force one); whitespace or char for other languages, as "
                        "dataset.tokenizer (METEOR and SPICE skipped) (default: auto)")
    parser.add_argument("--collapse-share", type=float, default=COLLAPSE_SHARE, metavar="S",
                        help="one caption for more than this share of the images is warned about (the model may have "
                        f"collapsed; 1: never) (default: {COLLAPSE_SHARE:g}, as eval.collapse_share)")
    parser.add_argument("--out", help="also write the metrics JSON here")
    parser.add_argument("--per-image", help="write per-image scores (JSON) here")
    args = parser.parse_args(argv)
    metrics = [m for m in args.metrics.split(",") if m]
    summary = run_cli(lambda: score_files(args.annotations, args.results, metrics, args.tokenizer, args.out,
                                          args.per_image, args.split, args.instances, args.collapse_share),
                      PROG, (ValueError, OSError, RuntimeError))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
