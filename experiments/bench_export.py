"""Benchmark: the ONNX export of the default-sized model against PyTorch, on shapes test images (CPU).

Prints the size of each exported file, then milliseconds per image and images per second of the export runner
(ONNX Runtime + NumPy, captioning/export/runner.py) and of `Captioner.generate`, greedy and beam 3, with 1 and 2
threads (torch.set_num_threads / ONNX Runtime's intra-op threads), best of `--repeats`, on the same preprocessed
images in batches of `--batch-size` (image reading left out), and how many captions agree word for word.

The checkpoint is a trained run's (the README's numbers: the default run's best.pt, on its shapes test images):

    PYTHONPATH=$PWD .venv/bin/python experiments/bench_export.py --checkpoint outputs/<run>/checkpoints/best.pt
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from captioning.data.images import load_image
from captioning.data.readers.karpathy import read_karpathy_splits
from captioning.data.shapes.generate import build_shapes
from captioning.export.exporter import export_checkpoint
from captioning.export.runner import Runner
from captioning.factory.load import load_model
from captioning.models.captioner import Captioner
from captioning.tools.export import human_size


def best_of(repeats: int, decode: Callable[[torch.Tensor], list[list[int]]],
            batches: list[torch.Tensor]) -> tuple[float, list[list[int]]]:
    """The fastest of `repeats` passes of `decode` over the batches (seconds) and the captions' word ids."""
    times, out = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        out = [tokens for b in batches for tokens in decode(b)]
        times.append(time.perf_counter() - start)
    return min(times), out


def torch_tokens(model: Captioner, images: torch.Tensor, beam: int) -> list[list[int]]:
    """Captions of `Captioner.generate` (greedy for beam 1)."""
    with torch.no_grad():
        return model.generate(images, beam)[0].tokens


def onnx_tokens(runner: Runner, images: torch.Tensor, beam: int) -> list[list[int]]:
    """Captions of the export runner on the same images."""
    return [c.tokens for c in runner.caption_pixels(images.numpy(), beam)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, required=True, help="a run's best.pt (e.g. the default run's)")
    p.add_argument("--num-test", type=int, default=100, help="test images to caption")
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_export_") as tmp:
        run(args, Path(tmp))


def run(args: argparse.Namespace, work: Path) -> None:
    """Export into `work`, print sizes and timings."""
    torch.set_num_threads(2)
    ckpt = args.checkpoint
    print(f"checkpoint: {ckpt}")
    start = time.perf_counter()
    files = export_checkpoint(ckpt, work / "onnx")
    print(f"export (onnx, checked): {time.perf_counter() - start:.1f} s")
    for f in files:
        print(f"  {f.name:<16} {human_size(f.stat().st_size):>9}")
    model, vocab, saved = load_model(ckpt)
    generate = saved["config"]["dataset"]["generate"]
    root = Path(saved["config"]["dataset"]["root"])
    annotations = build_shapes(root, **{k: v for k, v in generate.items() if k not in ("_target_", "root")})
    paths = [r.path for r in read_karpathy_splits(["test"], annotations, root)["test"]][: args.num_test]
    transform = model.encoder.transform()
    images = torch.stack([transform(load_image(p)) for p in paths])  # (N, 3, H, W)
    batches = [images[i: i + args.batch_size] for i in range(0, len(images), args.batch_size)]
    print(f"{len(paths)} test images of {tuple(images.shape[2:])} px, batches of {args.batch_size}, "
          f"best of {args.repeats}; ms/image (images/s)")
    for threads in args.threads:
        torch.set_num_threads(threads)
        runner = Runner(work / "onnx", threads=threads)
        for beam in (1, 3):
            t_torch, ref = best_of(args.repeats, functools.partial(torch_tokens, model, beam=beam), batches)
            t_onnx, got = best_of(args.repeats, functools.partial(onnx_tokens, runner, beam=beam), batches)
            same = sum(a == b for a, b in zip(ref, got))
            words = np.mean([len(t) for t in ref])
            n = len(paths)
            print(f"threads={threads} {'greedy' if beam == 1 else f'beam {beam}':<7} "
                  f"torch {1e3 * t_torch / n:6.2f} ms ({n / t_torch:6.0f}/s)   "
                  f"onnx {1e3 * t_onnx / n:6.2f} ms ({n / t_onnx:6.0f}/s)   "
                  f"x{t_torch / t_onnx:4.2f}   same captions {same}/{n}, {words:.1f} words")


if __name__ == "__main__":
    main()
