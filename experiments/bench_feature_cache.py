"""Benchmark: one frozen-encoder training epoch from the feature cache vs. re-encoding every image.

Writes `--images` JPEGs (random photos-like noise, 320 x 240 .. 500 x 375) with two captions each, builds a
cache with `extract_features`, then times one training epoch (forward, backward, optimizer step of the decoder)
both ways with the same frozen encoder. Prints seconds and the ratio; not a test.

    python experiments/bench_feature_cache.py --images 200 --encoder resnet50 --image-size 224
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

from captioning.data.dataset import CaptionDataset, collate
from captioning.data.readers.records import ImageRecord
from captioning.data.vocab import Vocabulary
from captioning.factory.models import build_captioner
from captioning.features.extract import extract_features
from captioning.training.losses import caption_loss

WORDS = "a man woman dog cat sits runs on the grass beach street with red blue ball".split()


def make_images(root: Path, n: int, seed: int = 0) -> list[ImageRecord]:
    """n JPEG files of COCO-like sizes with two random captions each."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        w, h = int(rng.integers(320, 501)), int(rng.integers(240, 376))
        pixels = rng.integers(0, 256, size=(h // 8, w // 8, 3), dtype=np.uint8)  # smooth-ish: upsampled noise
        path = root / f"{i:05d}.jpg"
        Image.fromarray(pixels).resize((w, h), Image.BILINEAR).save(path, quality=90)
        caps = [list(rng.choice(WORDS, size=int(rng.integers(6, 12)))) for _ in range(2)]
        records.append(ImageRecord(i, path, caps, [" ".join(c) for c in caps]))
    return records


def epoch_seconds(model: torch.nn.Module, dataset: CaptionDataset, batch_size: int,
                  workers: int) -> tuple[float, float]:
    """Wall time and CPU time of this process for one training epoch (data loading included).

    CPU time is what to compare on a shared machine (with workers=0 all the work is in this process).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-3)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, collate_fn=collate, num_workers=workers)
    model.train()
    start, cpu = time.perf_counter(), time.process_time()
    for batch in loader:
        out = model(batch.images, batch.captions, batch.image_index)
        loss = caption_loss(out.logits, batch.captions[:, 1:], out.alphas, Vocabulary.pad_id, attention_weight=1.0)
        opt.zero_grad(set_to_none=True)
        loss.total.backward()
        opt.step()
    return time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=200)
    p.add_argument("--encoder", default="resnet50", help="torchvision arch: resnet18/50/101, vgg16/19")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(0)
    vgg = args.encoder.startswith("vgg")
    enc = {"_target_": "vgg" if vgg else "resnet", "arch": args.encoder,
           "pretrained": False, "fine_tune": "none", "image_size": args.image_size,
           **({} if vgg else {"grid_size": 14})}
    model_cfg = {"encoder": enc,
                 "attention": {"_target_": "soft", "attention_dim": 512},
                 "decoder": {"_target_": "sat", "embed_dim": 512,
                             "hidden_dim": 512, "dropout": 0.5}}
    with tempfile.TemporaryDirectory() as tmp:
        records = make_images(Path(tmp), args.images)
        vocab = Vocabulary.build(c for r in records for c in r.captions)
        model = build_captioner(model_cfg, len(vocab))
        t0, c0 = time.perf_counter(), time.process_time()
        cache = extract_features(records, model.encoder, enc, Path(tmp) / "features", batch_size=args.batch_size,
                                 num_workers=args.workers, progress=False)
        extract_s = (time.perf_counter() - t0, time.process_time() - c0)
        transform = model.encoder.transform()
        images_s = epoch_seconds(model, CaptionDataset(records, vocab, transform), args.batch_size, args.workers)
        cached_s = epoch_seconds(model, CaptionDataset(records, vocab, transform, features=cache), args.batch_size,
                                 args.workers)
        size_mb = (Path(tmp) / "features" / "grids.npy").stat().st_size / 2**20
    print(f"{args.images} images, {args.encoder} at {args.image_size} px (frozen), grid {cache.grid} x "
          f"{model.encoder.out_dim}, batch {args.batch_size}, torch threads {torch.get_num_threads()}")
    print(f"{'':28s}{'wall s':>9s}{'CPU s':>9s}")
    print(f"{'extraction (once)':28s}{extract_s[0]:9.2f}{extract_s[1]:9.2f}   cache {size_mb:.1f} MiB float16")
    print(f"{'epoch re-encoding images':28s}{images_s[0]:9.2f}{images_s[1]:9.2f}")
    print(f"{'epoch from the cache':28s}{cached_s[0]:9.2f}{cached_s[1]:9.2f}")
    print(f"{'speed-up of a cached epoch':28s}{images_s[0] / cached_s[0]:8.1f}x{images_s[1] / cached_s[1]:8.1f}x")

if __name__ == "__main__":
    main()
