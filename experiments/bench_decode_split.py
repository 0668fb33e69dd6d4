"""Benchmark: decoding a trained run's test split, for comparing two versions of the code.

Loads a checkpoint (e.g. the default run's `checkpoints/best.pt`), reads its data set's test images once into
memory, then times `Captioner.generate` over them in batches of `--batch-size` (what `captioning-evaluate` and
validation run, image loading left out), best of `--repeats`. It prints the seconds and a digest of the decoded
captions, so two checkouts can be timed alternately and shown to decode the same captions:

    git worktree add /tmp/before <commit>
    for i in 1 2 3; do for root in /tmp/before $PWD; do
        PYTHONPATH=$root .venv/bin/python experiments/bench_decode_split.py outputs/xe/checkpoints/best.pt
    done; done
"""

from __future__ import annotations

import argparse
import hashlib
import time

import torch
from omegaconf import OmegaConf

from captioning.data.dataset import CaptionDataset, collate
from captioning.factory.datasets import build_datasets
from captioning.factory.load import load_model


def load_split(checkpoint: str, split: str) -> tuple[torch.nn.Module, CaptionDataset]:
    """A checkpoint's model (on the CPU) and a split of the data set it was trained on, read with its vocabulary."""
    model, vocab, ckpt = load_model(checkpoint, map_location="cpu")
    dataset_cfg = OmegaConf.create(ckpt["config"]).dataset
    _, data = build_datasets(dataset_cfg, model.encoder.transform(), splits=[split], vocab=vocab)
    return model, data[split]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--split", default="test")
    p.add_argument("--beam-size", type=int, default=3)
    p.add_argument("--max-len", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, ds = load_split(args.checkpoint, args.split)
    model.eval()
    items = [ds[i] for i in range(len(ds))]
    batches = [collate(items[i:i + args.batch_size]).images for i in range(0, len(items), args.batch_size)]
    times, digest = [], ""
    for _ in range(args.repeats):
        tokens: list[list[int]] = []
        start = time.perf_counter()
        with torch.no_grad():
            for images in batches:
                tokens += model.generate(images, args.beam_size, args.max_len)[0].tokens
        times.append(time.perf_counter() - start)
        digest = hashlib.sha256(repr(tokens).encode()).hexdigest()[:12]
    words = sum(len(t) for t in tokens) / len(tokens)
    print(f"{len(items)} {args.split} images, beam {args.beam_size}, batches of {args.batch_size}: best "
          f"{min(times):.2f} s (all: {', '.join(f'{t:.2f}' for t in times)}), {words:.1f} words a caption, "
          f"captions {digest}")


if __name__ == "__main__":
    main()
