"""Caption images with an exported model, without torch: `captioning-run-export DIR IMAGE... [--beam-size K]`.

DIR is a folder written by `captioning-export --format onnx`; the captions come from captioning/export/runner.py
(ONNX Runtime, NumPy and Pillow only: this command never imports torch). Prints `path<TAB>caption` per image,
reading and captioning `--batch-size` images at a time. An image that cannot be read (or has another size than an
export without a resize takes) is reported on stderr and skipped (exit status 1); a bad folder is one `error:` line
and exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from captioning.base.decoding import BEAM_SIZE, MAX_LEN, SUPPRESS_UNK
from captioning.cli import ArgumentParser, positive_int, run_cli
from captioning.data.images import ImageError
from captioning.export.runner import Runner

PROG = "captioning-run-export"


def caption_files(folder: Path, images: Sequence[Path], beam_size: int, max_len: int, threads: int | None,
                  batch_size: int = 32, suppress_unk: bool = SUPPRESS_UNK) -> int:
    """Print `path<TAB>caption` for each readable image; returns how many were skipped (reported on stderr)."""
    runner = Runner(folder, threads)
    skipped = 0
    for start in range(0, len(images), batch_size):
        readable = []
        for path in images[start:start + batch_size]:
            try:
                readable.append((path, runner.pixels(path)))
            except (ImageError, ValueError) as err:
                print(f"{PROG}: skipped: {err}", file=sys.stderr)
                skipped += 1
        if readable:
            captions = runner.caption_pixels(np.stack([x for _, x in readable]), beam_size, max_len,
                                             suppress_unk=suppress_unk)
            for (path, _), c in zip(readable, captions):
                print(f"{path}\t{' '.join(c.words)}", flush=True)
    return skipped


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; exit status 0, 1 when an image was skipped, 2 on an error."""
    parser = ArgumentParser(prog=PROG, description="Caption images with a model exported by captioning-export "
                            "(ONNX Runtime and NumPy only; torch is not needed).",
                            epilog=f"example: {PROG} exported/ photo.jpg other.png --beam-size 3")
    parser.add_argument("folder", type=Path, help="the export folder (holds captioning.json)")
    parser.add_argument("images", nargs="+", type=Path)
    parser.add_argument("--beam-size", type=positive_int, default=BEAM_SIZE)
    parser.add_argument("--max-len", type=positive_int, default=MAX_LEN, help="most words per caption (>= 1)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="images per forward pass")
    parser.add_argument("--threads", type=positive_int, default=None, help="ONNX Runtime intra-op threads")
    parser.add_argument("--allow-unk", action="store_true", help="let captions hold <unk> (by default decoding never "
                        "emits it, as captioning-caption)")
    args = parser.parse_args(argv)
    skipped = run_cli(lambda: caption_files(args.folder, args.images, args.beam_size, args.max_len, args.threads,
                                            args.batch_size, not args.allow_unk), PROG,
                      (ValueError, OSError, ImportError))
    return 1 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
