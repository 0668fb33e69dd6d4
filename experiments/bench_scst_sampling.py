"""Benchmark: SCST's sampling forward and backward on a trained run's test images, for comparing two versions.

Loads a checkpoint (e.g. the default run's `checkpoints/best.pt`), encodes `--images` test images once, then times
`sample_captions` (n samples per image, with gradients) plus the backward of the summed log-probabilities, in
training mode as SCST runs it, best and median of `--repeats`. Run it alternately on two checkouts:

    git worktree add /tmp/before <commit>
    for i in 1 2; do for root in /tmp/before $PWD; do
        PYTHONPATH=$root .venv/bin/python experiments/bench_scst_sampling.py outputs/xe/checkpoints/best.pt
    done; done
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_decode_split import load_split  # this folder is on sys.path when the script runs

from captioning.data.dataset import collate
from captioning.training.scst.sampling import sample_captions


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--images", type=int, default=32)
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--max-len", type=int, default=16)
    p.add_argument("--repeats", type=int, default=12)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, ds = load_split(args.checkpoint, "test")
    model.train()
    images = collate([ds[i] for i in range(args.images)]).images
    with torch.no_grad():
        a, grid = model.encode(images)
    torch.manual_seed(0)
    times, lengths = [], 0.0
    for _ in range(args.repeats):
        start = time.perf_counter()
        s = sample_captions(model.decoder, a, grid, args.samples, args.max_len)
        s.log_probs.sum().backward()
        times.append(time.perf_counter() - start)
        lengths = s.lengths.float().mean().item()
    print(f"{args.images} images x {args.samples} samples: best {min(times) * 1e3:.1f} ms, median "
          f"{statistics.median(times) * 1e3:.1f} ms, {lengths:.2f} words a sample")


if __name__ == "__main__":
    main()
