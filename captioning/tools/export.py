"""Export a checkpoint for inference without this project: `captioning-export --checkpoint best.pt --out DIR`.

Writes the encoder and one decoder step as separate graphs (ONNX, or TorchScript with --format torchscript):
encoder.onnx, init.onnx (the attention's per-image keys and the decoder's initial state) and step.onnx, with
captioning.json beside them (vocabulary, the encoder's preprocessing, grid and state layout; see
captioning/export/manifest.py). Each graph is checked against the model before the folder is written. Caption from
the folder with ONNX Runtime and NumPy only: `captioning-run-export DIR IMAGE...`. Prints each file
written with its size. A model that cannot be exported, a bad checkpoint or output folder: one `error:` line on
stderr and exit status 2 (for a missing checkpoint, or a file that is none, before torch is imported).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from captioning.checkpoint import check_checkpoint_file
from captioning.cli import ArgumentParser, positive_int, run_cli, writable_dir
from captioning.export.manifest import BACKENDS

PROG = "captioning-export"


def human_size(n: int) -> str:
    """A file size for people: 812 B, 45.3 kB, 12.1 MB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def export(checkpoint: Path, out: Path, backend: str, image_size: int | None, hard_test_mode: str | None) -> None:
    """Export and print `PATH<TAB>SIZE` for every file written."""
    writable_dir(out)  # a read-only output folder fails before the model is loaded
    check_checkpoint_file(checkpoint)  # and so does a file that is no checkpoint, before torch is imported
    from captioning.export.exporter import export_checkpoint

    files = export_checkpoint(checkpoint, out, backend, image_size, hard_test_mode)
    for path in files:
        print(f"{path}\t{human_size(path.stat().st_size)}", flush=True)
    print(f"total\t{human_size(sum(p.stat().st_size for p in files))}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status."""
    parser = ArgumentParser(prog=PROG, description="Export a trained checkpoint as an encoder graph and one decoder "
                            "step (ONNX or TorchScript) with its vocabulary and preprocessing in captioning.json.",
                            epilog="example: captioning-export --checkpoint outputs/<run>/checkpoints/best.pt "
                            "--out exported/ && captioning-run-export exported/ photo.jpg")
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path, help="folder for the graphs and captioning.json")
    parser.add_argument("--format", choices=BACKENDS, default="onnx", dest="backend")
    parser.add_argument("--image-size", type=positive_int, default=None,
                        help="image side for an encoder that does not resize (default: the data set's generated "
                        "image size stored in the checkpoint)")
    parser.add_argument("--hard-test-mode", choices=("expectation", "argmax"), default=None,
                        help="hard attention only: the test-time context to export (default: the checkpoint's)")
    args = parser.parse_args(argv)
    run_cli(lambda: export(args.checkpoint, args.out, args.backend, args.image_size, args.hard_test_mode), PROG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
