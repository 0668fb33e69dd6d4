"""Score a COCO results file like the official evaluation server: `captioning-score --annotations A --results R`.

Rules (checked before any scoring, each failure a clear error naming the file):
- the annotation file is a COCO caption file: {"annotations": [{"image_id": int, "caption": str}, ...]};
- the results file is a list of {"image_id": int, "caption": str};
- every result's image id has references, and no image id appears twice;
- an empty caption is allowed and scores 0 on every metric (as coco-caption scores it).
Only the images in the results are scored (coco-caption's `imgIds = res.getImgIds()`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from captioning.metrics import score_captions


def _load(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from err


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true/false are not image ids


def load_references(path: str | Path) -> dict[int, list[str]]:
    """image id -> reference captions, from a COCO caption annotation file."""
    path = Path(path)
    data = _load(path)
    if not isinstance(data, dict) or not isinstance(data.get("annotations"), list):
        raise ValueError(f"{path}: expected a COCO caption annotation file with an 'annotations' list")
    refs: dict[int, list[str]] = defaultdict(list)
    for n, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict) or not isinstance(ann.get("caption"), str) or not _is_id(ann.get("image_id")):
            raise ValueError(f"{path}: annotation {n} needs an integer 'image_id' and a string 'caption', got {ann!r:.200}")
        refs[ann["image_id"]].append(ann["caption"])
    return dict(refs)


def load_results(path: str | Path, references: dict[int, list[str]]) -> dict[int, str]:
    """image id -> generated caption, from a COCO results file, validated against the references."""
    path = Path(path)
    data = _load(path)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of {{\"image_id\": ..., \"caption\": ...}}")
    results: dict[int, str] = {}
    for n, res in enumerate(data):
        if not isinstance(res, dict) or not isinstance(res.get("caption"), str) or not _is_id(res.get("image_id")):
            raise ValueError(f"{path}: entry {n} needs an integer 'image_id' and a string 'caption', got {res!r:.200}")
        image_id = res["image_id"]
        if image_id in results:
            raise ValueError(f"{path}: image id {image_id} appears more than once (entry {n}); keep one caption per image")
        if image_id not in references:
            raise ValueError(f"{path}: image id {image_id} (entry {n}) has no reference captions in the annotation file")
        results[image_id] = res["caption"]
    if not results:
        raise ValueError(f"{path}: the results file is empty")
    return results


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Console entry point: prints the metrics as JSON on stdout."""
    parser = argparse.ArgumentParser(description="Score a COCO results file with coco-caption's metrics.")
    parser.add_argument("--annotations", required=True, help="COCO caption annotation file (references)")
    parser.add_argument("--results", required=True, help='results file: [{"image_id": ..., "caption": ...}]')
    parser.add_argument("--metrics", default="bleu,meteor,rouge,cider", help="comma-separated; add spice if installed")
    parser.add_argument("--tokenizer", default="auto", choices=["auto", "ptb-java", "python"])
    parser.add_argument("--out", help="also write the metrics JSON here")
    parser.add_argument("--per-image", help="write per-image scores (JSON) here")
    args = parser.parse_args(argv)
    try:
        refs = load_references(args.annotations)
        results = load_results(args.results, refs)
        scores = score_captions(results, refs, metrics=[m for m in args.metrics.split(",") if m], tokenizer=args.tokenizer)
    except (OSError, ValueError, RuntimeError) as err:
        parser.exit(2, f"captioning-score: error: {err}\n")
    out = {**scores.overall, "num_images": len(results), "tokenizer": scores.tokenizer}
    if scores.skipped:
        out["skipped"] = scores.skipped
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.per_image:
        per_image = [{"image_id": i, "caption": results[i], **s} for i, s in scores.per_image.items()]
        Path(args.per_image).write_text(json.dumps(per_image, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
