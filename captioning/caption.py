"""Caption your own images: `captioning-caption IMAGE [IMAGE ...] --checkpoint PATH [--beam-size K] [--out DIR]`.

Prints one line per image (`path<TAB>caption`) and writes its attention figure to DIR. An image that
cannot be read is reported on stderr and skipped; the others are still captioned (exit code 1 then).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from captioning.checkpoint import load_model
from captioning.decoding import generate
from captioning.evaluate import resolve_device, selects_regions
from captioning.visualize import chosen_regions, plot_attention


def open_image(path: Path) -> Image.Image:
    """Read JPEG/PNG/WebP/... as RGB, honouring EXIF rotation; a clear error for anything else."""
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    try:
        with Image.open(path) as im:
            im.load()
            return ImageOps.exif_transpose(im).convert("RGB")
    except (UnidentifiedImageError, OSError) as err:
        raise ValueError(f"not a readable image: {path} ({err})") from err


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description="Caption images and draw their attention maps.")
    parser.add_argument("images", nargs="+", type=Path)
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--beam-size", type=int, default=3)
    parser.add_argument("--max-len", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("captions"), help="folder for attention figures")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    try:
        device = resolve_device(args.device)
        model, vocab, _ = load_model(args.checkpoint, map_location=device)
    except (OSError, ValueError, RuntimeError) as err:
        parser.exit(2, f"captioning-caption: error: {err}\n")
    transform, failures = model.encoder.transform(), 0
    for path in args.images:
        try:
            image = open_image(path)
        except (OSError, ValueError) as err:
            print(f"captioning-caption: skipped: {err}", file=sys.stderr)
            failures += 1
            continue
        with torch.no_grad():
            decoded, (h, w) = generate(model, transform(image).unsqueeze(0).to(device), args.beam_size, args.max_len)
        words, alphas = vocab.decode(decoded.tokens[0]), decoded.alphas[0].view(-1, h, w)
        print(f"{path}\t{' '.join(words)}")
        if words:
            regions = chosen_regions(alphas) if selects_regions(model) else None
            plot_attention(model.encoder.view(image), words, alphas.numpy(), args.out / f"{path.stem}.png", regions=regions)
    return 1 if failures else 0


def cli() -> None:
    """Console script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
