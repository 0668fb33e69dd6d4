"""Caption your own images: `captioning-caption IMAGE [IMAGE ...] --checkpoint PATH [--beam-size K] [--out DIR]`.

Prints one line per image (`path<TAB>caption`) and writes its attention figure to DIR, named after the image
(`x.png` for x.jpg; images sharing a name get their folder's name in front, then a number if still needed, so no
figure overwrites another). Images are read by the data sets' loader (captioning/data/images.py). An image that
cannot be read is reported on stderr and skipped; the others are still captioned (exit status 1 then). A bad
option, checkpoint or output folder is one `error:` line on stderr and exit status 2, before any image is read.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image

from captioning.checkpoint import load_model
from captioning.cli import ArgumentParser, one_line, positive_int, run_cli, writable_dir
from captioning.data.images import ImageError, load_image
from captioning.models.captioner import selects_regions
from captioning.reporting.figures import chosen_regions, plot_attention
from captioning.runtime import resolve_device

PROG = "captioning-caption"


def open_image(path: Path) -> Image.Image:
    """Read an image as the data sets do (RGB, EXIF rotation applied); an ImageError names the file otherwise."""
    return load_image(path)


def figure_names(paths: Sequence[Path]) -> list[str]:
    """One distinct figure file name per image: its stem, with its folder's name (then its position) on a clash."""
    stems = Counter(p.stem for p in paths)
    names = [p.stem if stems[p.stem] == 1 else f"{p.resolve().parent.name}_{p.stem}" for p in paths]
    counts = Counter(names)
    return [f"{n}_{k}.png" if counts[n] > 1 else f"{n}.png" for k, n in enumerate(names)]


def caption_images(images: Sequence[Path], checkpoint: Path, beam_size: int = 3, max_len: int = 20,
                   out: Path = Path("captions"), device: str = "auto") -> int:
    """Caption each image, print `path<TAB>caption` and write its attention figure; returns the number skipped."""
    writable_dir(out)  # a read-only output folder fails before the model is loaded
    dev = resolve_device(device)
    model, vocab, _ = load_model(checkpoint, map_location=dev)
    transform, failures = model.encoder.transform(), 0
    for path, name in zip(images, figure_names(images)):
        try:
            image = load_image(path)
            with torch.no_grad():
                decoded, (h, w) = model.generate(transform(image).unsqueeze(0).to(dev), beam_size, max_len)
        except ImageError as err:
            print(f"{PROG}: skipped: {err}", file=sys.stderr)
            failures += 1
            continue
        except RuntimeError as err:  # e.g. an image smaller than the encoder's pooling (SmallCNN without image_size)
            print(f"{PROG}: skipped: cannot caption {path}: {one_line(err)}", file=sys.stderr)
            failures += 1
            continue
        words, alphas = vocab.decode(decoded.tokens[0]), decoded.alphas[0].view(-1, h, w)
        print(f"{path}\t{' '.join(words)}", flush=True)
        if words:
            regions = chosen_regions(alphas) if selects_regions(model) else None
            plot_attention(model.encoder.view(image), words, alphas.numpy(), out / name, regions=regions)
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status (0, or 1 when some image was skipped)."""
    parser = ArgumentParser(prog=PROG, description="Caption images with a trained checkpoint and draw the attention "
                            "map of every word (one figure per image in --out).",
                            epilog="example: captioning-caption photo.jpg other.png --checkpoint "
                            "outputs/<run>/checkpoints/best.pt --beam-size 5 --out figures/")
    parser.add_argument("images", nargs="+", type=Path)
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--beam-size", type=positive_int, default=3)
    parser.add_argument("--max-len", type=positive_int, default=20, help="most words per caption (>= 1)")
    parser.add_argument("--out", type=Path, default=Path("captions"), help="folder for attention figures")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    failures = run_cli(lambda: caption_images(args.images, args.checkpoint, args.beam_size, args.max_len, args.out,
                                              args.device), PROG, (ValueError, OSError, RuntimeError))
    return 1 if failures else 0


def cli() -> None:
    """Console script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
