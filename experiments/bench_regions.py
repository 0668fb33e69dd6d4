"""Benchmark: bottom-up region features, from the TSV to the reads a training run makes.

Generates (once, kept in --work) a TSV in peteanderson80/bottom-up-attention's format (image_id, image_w, image_h,
num_boxes, boxes, features; base64 float32) with --images images of --regions regions x --dim values (random
non-negative numbers, as the Faster R-CNN's pooled ReLU features are), then reports:

  - conversion: `captioning-convert-regions` (captioning.features.regions_tsv.convert_tsv) of that TSV, wall seconds,
    images/s and MB/s of TSV, and the cache's size on disk against the TSV's;
  - reads from the region cache in a shuffled order (what a training epoch does), images/s and regions/s, as the
    data set reads them (float32 tensors, every value checked finite);
  - the same from a folder of per-image npz files (ruotianluo's cocobu_att form, np.savez_compressed) of the first
    --npz-images images.

COCO has 123,287 images (Karpathy's splits); the 36-region TSV of all of them is about 48.5 GB, more than this
machine's free disk, so the run states the size it used and the COCO sizes computed from the format.

    python experiments/bench_regions.py --work /tmp/regions --images 15411
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

COCO_IMAGES = 123_287


def generate(path: Path, images: int, regions: int, dim: int, seed: int = 0) -> None:
    """A TSV of `images` lines (written once: kept if it exists with the same size)."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for image_id in range(images):
            feats = np.maximum(rng.normal(0.0, 1.0, (regions, dim)), 0).astype(np.float32)
            xy = rng.uniform(0, 400, (regions, 2))
            boxes = np.concatenate([xy, xy + rng.uniform(20, 200, (regions, 2))], axis=1).astype(np.float32)
            fields = [str(image_id), "640", "480", str(regions), base64.b64encode(boxes.tobytes()).decode(),
                      base64.b64encode(feats.tobytes()).decode()]
            f.write("\t".join(fields) + "\n")


def du(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def read_rate(source, ids: list[int]) -> tuple[float, int]:
    start, regions = time.perf_counter(), 0
    for i in ids:
        regions += source[i].shape[0]
    return time.perf_counter() - start, regions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--images", type=int, default=15_411, help="default: 1/8 of COCO's 123,287")
    parser.add_argument("--regions", type=int, default=36)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--npz-images", type=int, default=2000)
    args = parser.parse_args()

    from captioning.features.regions import RegionCache, RegionFolder
    from captioning.features.regions_tsv import convert_tsv

    args.work.mkdir(parents=True, exist_ok=True)
    tsv = args.work / f"bu_{args.images}x{args.regions}x{args.dim}.tsv"
    if not tsv.exists():
        start = time.perf_counter()
        generate(tsv, args.images, args.regions, args.dim)
        print(f"generated {tsv} in {time.perf_counter() - start:.0f} s (not part of the figures)", flush=True)
    cache = args.work / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    os.sync()
    start = time.perf_counter()
    meta = convert_tsv([tsv], cache, progress_bar=False)
    seconds = time.perf_counter() - start
    tsv_bytes, cache_bytes = tsv.stat().st_size, du(cache)
    out = {"images": meta["images"], "regions_per_image": args.regions, "dim": args.dim,
           "tsv_GB": round(tsv_bytes / 1e9, 3), "cache_GB": round(cache_bytes / 1e9, 3),
           "cache_over_tsv": round(cache_bytes / tsv_bytes, 3), "convert_s": round(seconds, 1),
           "convert_images_per_s": round(meta["images"] / seconds),
           "convert_tsv_MB_per_s": round(tsv_bytes / 1e6 / seconds),
           "coco_tsv_GB": round(tsv_bytes / args.images * COCO_IMAGES / 1e9, 1),
           "coco_cache_GB": round(cache_bytes / args.images * COCO_IMAGES / 1e9, 1)}
    ids = list(range(args.images))
    random.Random(0).shuffle(ids)
    regions = RegionCache.open(cache, args.dim)
    read_rate(regions, ids[:200])  # maps the files
    seconds, count = read_rate(regions, ids)
    out.update(cache_read_images_per_s=round(len(ids) / seconds), cache_read_regions_per_s=round(count / seconds))
    folder = args.work / "bu_att"
    if not folder.exists():
        folder.mkdir()
        for i in range(args.npz_images):
            np.savez_compressed(folder / f"{i}.npz", feat=regions[i].numpy())
    some = ids[: args.npz_images] if args.npz_images >= args.images else [i for i in ids if i < args.npz_images]
    seconds, count = read_rate(RegionFolder(folder, args.dim), some)
    out.update(npz_read_images_per_s=round(len(some) / seconds), npz_read_regions_per_s=round(count / seconds))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
