"""Convert bottom-up attention TSV files into a region cache for `encoder=regions`: `captioning-convert-regions`.

    captioning-convert-regions --tsv trainval/karpathy_*_resnet101_faster_rcnn_genome.tsv.* --out data/coco/regions
    captioning-train experiment=coco_updown_bu dataset.features=data/coco/regions

Interrupted, the same command continues where it stopped. numpy is imported when the conversion starts, so `--help`
answers at once. The cache's layout and checks: captioning/features/regions.py and regions_tsv.py.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from captioning.cli import ArgumentParser, positive_int, run_cli, writable_dir

PROG = "captioning-convert-regions"


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: converts, prints meta.json's content as JSON; returns the exit status (0)."""
    parser = ArgumentParser(prog=PROG, description="Convert bottom-up attention TSV files (image_id, image_w, image_h, "
                            "num_boxes, boxes, features; base64 float32) into a region cache (float16 features, "
                            "float32 boxes, O(1) access per image) for encoder=regions.",
                            epilog="example: captioning-convert-regions --tsv trainval/*.tsv.0 trainval/*.tsv.1 "
                            "--out data/coco/regions")
    parser.add_argument("--tsv", nargs="+", required=True, help="the TSV files, in order")
    parser.add_argument("--out", required=True, help="the cache folder (an interrupted conversion there continues)")
    parser.add_argument("--flush-every", type=positive_int, default=1000,
                        help="images between two progress records (default 1000)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    def convert() -> dict:
        from captioning.features.regions_tsv import convert_tsv

        writable_dir(args.out)
        return convert_tsv(args.tsv, args.out, progress_bar=not args.no_progress, flush_every=args.flush_every)

    meta = run_cli(convert, PROG, (ValueError, OSError))
    print(json.dumps({k: v for k, v in meta.items() if k != "sources"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
