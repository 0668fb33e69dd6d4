"""Score a COCO results file like the official evaluation server: `captioning-score --annotations A --results R`.

The references are a COCO caption file or a Karpathy split file (`--split`, default test), told apart by their
content; the rules each file must follow are in captioning/data/readers/references.py, checked before any scoring, each
failure a clear error naming the file. Only the images in the results are scored (coco-caption's
`imgIds = res.getImgIds()`).

    captioning-score --annotations captions_val2014.json --results results.json
    captioning-score --annotations data/shapes/dataset_shapes.json --results outputs/<run>/results.json
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from captioning.base.files import write_text_atomic
from captioning.cli import ArgumentParser, run_cli, writable_file

# Text-only imports: references and metrics.coco need neither torch nor pycocotools (tests/tools/test_score_imports.py).
from captioning.data.readers.references import load_references, load_results
from captioning.metrics.coco import score_captions

logger = logging.getLogger(__name__)
PROG = "captioning-score"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text + "\n")


def score_files(annotations: str | Path, results: str | Path, metrics: Sequence[str] = ("bleu", "meteor", "rouge",
                "cider"), tokenizer: str = "auto", out: str | Path | None = None,
                per_image: str | Path | None = None, split: str = "test") -> dict[str, Any]:
    """Score a results file against an annotation file (COCO, or a Karpathy file's `split`); writes the metrics
    (and per-image scores) if asked."""
    for path in (out, per_image):
        if path:
            writable_file(path)  # a read-only output fails now, not after the scoring
    refs = load_references(annotations, split)
    res = load_results(results, refs)
    scores = score_captions(res, refs, metrics=metrics, tokenizer=tokenizer)
    summary = {**scores.overall, "num_images": len(res), "tokenizer": scores.tokenizer}
    if scores.skipped:
        summary["skipped"] = scores.skipped
    if out:
        _write(Path(out), json.dumps(summary, indent=2))
    if per_image:
        rows = [{"image_id": i, "caption": res[i], **s} for i, s in scores.per_image.items()]
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
    parser.add_argument("--metrics", default="bleu,meteor,rouge,cider", help="comma-separated; add spice if installed")
    parser.add_argument("--tokenizer", default="auto", choices=["auto", "ptb-java", "python"])
    parser.add_argument("--out", help="also write the metrics JSON here")
    parser.add_argument("--per-image", help="write per-image scores (JSON) here")
    args = parser.parse_args(argv)
    metrics = [m for m in args.metrics.split(",") if m]
    summary = run_cli(lambda: score_files(args.annotations, args.results, metrics, args.tokenizer, args.out,
                                          args.per_image, args.split), PROG, (ValueError, OSError, RuntimeError))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
