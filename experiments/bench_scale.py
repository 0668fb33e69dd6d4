"""Benchmark: COCO-sized caption data, from the annotation file to a DataLoader pass, and feature cache rates.

Generates (once, kept in --work) a Karpathy split file of COCO's size from the project's synthetic caption text
(`synthetic_text.karpathy_file`: 123,287 images x 5 captions, 82,783 train + 30,504 restval /
5,000 val / 5,000 test, captions of 4-25 words, about 11 on average), then reports, each step in a fresh process:

  - read (dataset.prepared=null): the annotation file read into data sets as every run did before prepared captions;
  - first build: the same with dataset.prepared set and no prepared set yet (read, checked, tokenised, written);
  - cached load: a later run's load (the prepared set opened memory-mapped);
  - wall seconds and peak RSS of each, and the peak minus the RSS after the imports (the caption data's part);
  - a DataLoader pass over the train split with --workers workers (images replaced by a constant grid: only the
    caption data is measured), each worker's RSS and USS (private memory) after its first and before its last batch;
  - the feature cache's write and read rate (rows/s, MB/s) at VGG (14 x 14 x 512) and ResNet (14 x 14 x 2048,
    7 x 7 x 2048) sizes on --cache-rows rows, and each cache's size for COCO's 123,287 images.

With --baseline SRC (a checkout of the code before a change, e.g. a `git worktree`), the read and DataLoader steps
also run against SRC in the same run, and the ratios are printed.

    python experiments/bench_scale.py --work /tmp/scale --baseline /tmp/old
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/synthetic_text.py: the caption text

COCO_IMAGES = 123_287
GRIDS = {"vgg 14x14x512": (196, 512), "resnet 14x14x2048": (196, 2048), "resnet 7x7x2048": (49, 2048)}

# Runs in a fresh interpreter: builds the three data sets as the trainer does and prints one JSON line.
BUILD = """
import json, sys, time
def rss_mb():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024
import torch  # noqa: F401 (imported before the clock starts, as in a run)
from omegaconf import OmegaConf
from captioning.factory.datasets import build_datasets
cfg = OmegaConf.create(json.loads(sys.argv[1]))
base = rss_mb()
start = time.perf_counter()
vocab, data = build_datasets(cfg, transform=None)
wall = time.perf_counter() - start
# VmHWM, this process image's own peak: ru_maxrss keeps the parent's RSS at the fork (this script's, which
# holds the whole generated file on its first run)
peak = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024
print(json.dumps({"wall_s": wall, "peak_rss_mb": peak, "after_imports_mb": base, "vocab": len(vocab),
                  "images": {s: len(d) for s, d in data.items()}}))
"""

# A DataLoader pass over the train split; the workers' memory is sampled from the main process.
LOADER = """
import json, sys, time
import psutil, torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader
from captioning.factory.datasets import build_datasets
from captioning.data.dataset import collate

class ConstantGrid:  # stands in for a feature cache: every image is the same small (L, D) grid
    failed = {}
    def require(self, records): pass
    def __getitem__(self, image_id): return torch.zeros(4, 8)

cfg = OmegaConf.create(json.loads(sys.argv[1]))
_, data = build_datasets(cfg, transform=None, splits=["train"], features=ConstantGrid())
train = data["train"]
loader = DataLoader(train, batch_size=64, shuffle=True, num_workers=int(sys.argv[2]), collate_fn=collate,
                    generator=torch.Generator().manual_seed(0))
def sample():
    return [(m.rss / 2**20, m.uss / 2**20) for m in (c.memory_full_info() for c in psutil.Process().children())]
start, first, captions, n = time.perf_counter(), None, 0, len(loader)
for k, batch in enumerate(loader):
    captions += len(batch.captions)
    if k == 2 * int(sys.argv[2]):
        first = sample()
    if k == n - 2:
        last = sample()
print(json.dumps({"wall_s": time.perf_counter() - start, "batches": n, "captions": captions,
                  "first": first, "last": last}))
"""


def run(code: str, src: Path | None, *args: str) -> dict:
    """Run `code` in a fresh interpreter (with `src` first on the path, if given); its last stdout line as JSON."""
    env = dict(os.environ, PYTHONPATH=str(src)) if src else dict(os.environ)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env, capture_output=True,
                          text=True, check=False)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def coco_file(work: Path) -> Path:
    """The COCO-sized Karpathy file, generated once."""
    path = work / "dataset_coco.json"
    if not path.is_file():
        from synthetic_text import karpathy_file

        start = time.perf_counter()
        data = karpathy_file()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
        print(f"generated {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - start:.0f} s")
    return path


def raw_only(path: Path) -> Path:
    """The same file without the sentences' tokens (as a table or raw COCO captions give them): made once."""
    out = path.with_name(path.stem + "_raw.json")
    if not out.is_file():
        data = json.loads(path.read_text())
        for img in data["images"]:
            for s in img["sentences"]:
                del s["tokens"]
        out.write_text(json.dumps(data))
    return out


def dataset_cfg(path: Path, prepared: Path | None) -> str:
    """The `coco` data set's settings for the generated file."""
    return json.dumps({"reader": {"_target_": "karpathy",
                                  "annotations": str(path), "image_root": str(path.parent / "images")},
                       "prepared": str(prepared) if prepared else None, "min_word_freq": 5, "max_vocab": 10000,
                       "max_caption_len": 30, "captions_per_image": None})


def show_build(name: str, r: dict) -> None:
    print(f"  {name:<34} {r['wall_s']:7.2f} s   peak RSS {r['peak_rss_mb']:6.0f} MB   "
          f"caption data {r['peak_rss_mb'] - r['after_imports_mb']:6.0f} MB   vocabulary {r['vocab']}")


def show_loader(name: str, r: dict) -> None:
    grow = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(r["first"], r["last"])]
    print(f"  {name}: {r['batches']} batches, {r['captions']} captions in {r['wall_s']:.1f} s")
    for k, (a, b, g) in enumerate(zip(r["first"], r["last"], grow)):
        print(f"    worker {k}: RSS {a[0]:5.0f} -> {b[0]:5.0f} MB ({g[0]:+5.0f}),  USS {a[1]:5.0f} -> {b[1]:5.0f} MB "
              f"({g[1]:+5.0f})")


def feature_cache_rates(rows: int) -> None:
    """Write rate (batches of 32 rows into the memory-mapped grid file, flushed) and random-row read rate."""
    import numpy as np

    from captioning.features.cache import FeatureCache
    from captioning.features.disk import cache_bytes

    rng = np.random.default_rng(0)
    for name, (length, dim) in GRIDS.items():
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
            root, row_mb, side = Path(tmp), length * dim * 2 / 1e6, int(length ** 0.5)
            grids = np.lib.format.open_memmap(root / "grids.npy", mode="w+", dtype=np.float16,
                                              shape=(rows, length, dim))
            block = rng.standard_normal((32, length, dim)).astype(np.float16)
            start = time.perf_counter()
            for first in range(0, rows, 32):
                grids[first:first + 32] = block[: rows - first]
                grids.flush()
            os.fsync(os.open(root / "grids.npy", os.O_RDONLY))
            write = time.perf_counter() - start
            del grids
            os.posix_fadvise(fd := os.open(root / "grids.npy", os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
            cache = FeatureCache(root, {"grid": [side, side]}, list(range(rows)), {})
            order = rng.permutation(rows)
            start = time.perf_counter()
            for i in order:
                cache[int(i)]
            read = time.perf_counter() - start
            print(f"  {name:<18} write {rows / write:8.0f} rows/s {rows * row_mb / write:7.0f} MB/s   "
                  f"random read (cold) {rows / read:8.0f} rows/s {rows * row_mb / read:7.0f} MB/s   "
                  f"COCO cache {cache_bytes(COCO_IMAGES, (side, side), dim) / 1e9:6.1f} GB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "captioning-scale")
    parser.add_argument("--baseline", type=Path, help="a checkout of the code before the change, run side by side")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--cache-rows", type=int, default=3000)
    parser.add_argument("--skip", nargs="*", default=[], choices=["build", "loader", "cache"])
    parser.add_argument("--raw-only", action="store_true",
                        help="build from the file without tokens (every caption tokenised: tables, raw COCO files)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    path = coco_file(args.work)
    if args.raw_only:
        path = raw_only(path)
    prepared = args.work / ("prepared_raw" if args.raw_only else "prepared")
    print(f"{path}: {path.stat().st_size / 1e6:.0f} MB, {os.cpu_count()} CPUs")
    if "build" not in args.skip:
        print("building the train/val/test data sets (fresh process each):")
        if args.baseline:
            before = run(BUILD, args.baseline, dataset_cfg(path, None))
            show_build("before the change (baseline code)", before)
        read = run(BUILD, None, dataset_cfg(path, None))
        show_build("read, dataset.prepared=null", read)
        subprocess.run(["rm", "-rf", str(prepared)], check=True)
        first = run(BUILD, None, dataset_cfg(path, prepared))
        show_build("first build (prepared written)", first)
        cached = run(BUILD, None, dataset_cfg(path, prepared))
        show_build("cached load (prepared opened)", cached)
        if args.baseline:
            print(f"  ratios to the baseline: first build {first['wall_s'] / before['wall_s']:.2f}x wall, "
                  f"{first['peak_rss_mb'] / before['peak_rss_mb']:.2f}x peak RSS; cached load "
                  f"{cached['wall_s'] / before['wall_s']:.3f}x wall, "
                  f"{cached['peak_rss_mb'] / before['peak_rss_mb']:.2f}x peak RSS")
    if "loader" not in args.skip:
        print(f"DataLoader pass over the train split, num_workers={args.workers}, batch 64 images:")
        if args.baseline:
            show_loader("before the change (baseline code)", run(LOADER, args.baseline, dataset_cfg(path, None),
                                                                  str(args.workers)))
        run(BUILD, None, dataset_cfg(path, prepared))  # make sure the prepared set exists
        show_loader("prepared captions", run(LOADER, None, dataset_cfg(path, prepared), str(args.workers)))
    if "cache" not in args.skip:
        where = os.environ.get("BENCH_TMP") or tempfile.gettempdir()
        print(f"feature cache, {args.cache_rows} rows (float16), on {where}:")
        feature_cache_rates(args.cache_rows)


if __name__ == "__main__":
    main()
