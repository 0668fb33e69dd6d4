"""Benchmark: `captioning-caption` over a folder of images, in images per second, as a user runs it.

Two models: a trained checkpoint on its data set's test images (e.g. the default run's `best.pt` on the 250
`shapes` test images, 64 px), and a ResNet-101-sized model with random weights (experiment=coco_soft_resnet101:
ResNet-101 at 224 px, 14 x 14 x 2048 annotations, LSTM 1800, a 10,000-word vocabulary) on generated 640 x 480
JPEGs (COCO's typical size). Random weights rarely emit <end>, so its captions run to max_len (20 words): the
slowest case for decoding. Each case runs the command's own function (image reading in a thread, batches of
--batch-size, the JSON Lines log) and prints its summary line (images/s without the model's loading) and the wall
time of the whole command.

    PYTHONPATH=$PWD .venv/bin/python experiments/bench_caption.py outputs/<run>/checkpoints/best.pt
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from PIL import Image

from captioning.checkpoint import read_checkpoint, save_checkpoint
from captioning.data.readers.karpathy import read_karpathy
from captioning.data.vocab import Vocabulary
from captioning.factory.models import build_captioner, model_config
from captioning.runtime import CONF_DIR
from captioning.tools.caption import main as caption_main


def run(label: str, args: list[str]) -> None:
    """Run captioning-caption with args; print its summary line and the command's wall time."""
    err = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stderr(err):
        caption_main(args)
    wall = time.perf_counter() - start
    summary = [line for line in err.getvalue().splitlines() if "captioned" in line][-1]
    print(f"{label}: {summary.split(': ', 1)[1].split(';')[0]}; whole command {wall:.1f} s", flush=True)


def resnet101_checkpoint(path: Path) -> Path:
    """A ResNet-101-sized captioner with random weights and a 10,000-word vocabulary."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=coco_soft_resnet101", "encoder.pretrained=false"])
    vocab = Vocabulary.build([[f"w{i}" for i in range(10000 - 4)]])
    torch.manual_seed(0)
    model = build_captioner(model_config(cfg), len(vocab))
    return save_checkpoint(path, model, vocab, {"model": model_config(cfg)})


def photos(folder: Path, n: int) -> Path:
    """n smooth random 640 x 480 JPEGs (quality 90), like COCO's in size and file size."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        small = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
        Image.fromarray(small).resize((640, 480), Image.Resampling.BICUBIC).save(folder / f"{i:06d}.jpg", quality=90)
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a trained checkpoint (its data set's test split is captioned)")
    p.add_argument("--photos", type=int, default=64, help="generated 640 x 480 JPEGs for the ResNet-101 model")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, batches of {args.batch_size}")
    dataset = read_checkpoint(args.checkpoint)["config"]["dataset"]
    test = read_karpathy(dataset["annotations"], "test", dataset.get("image_root"))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        listing = work / "test.txt"
        listing.write_text("\n".join(str(r.path.resolve()) for r in test) + "\n")
        for beam in (1, 3):
            run(f"{args.checkpoint} on {len(test)} test images, beam {beam}",
                ["--list", str(listing), "--checkpoint", args.checkpoint, "--beam-size", str(beam),
                 "--batch-size", str(args.batch_size), "--jsonl", str(work / f"trained{beam}.jsonl")])
        big, folder = resnet101_checkpoint(work / "resnet101.pt"), photos(work / "photos", args.photos)
        for beam in (1, 3):
            run(f"ResNet-101-sized random model on {args.photos} 640x480 JPEGs, beam {beam}",
                [str(folder), "--checkpoint", str(big), "--beam-size", str(beam), "--batch-size",
                 str(args.batch_size), "--jsonl", str(work / f"resnet{beam}.jsonl")])


if __name__ == "__main__":
    main()
