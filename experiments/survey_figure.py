"""One test image's attention maps under each attention form: a figure with one row per run of a sweep.

Each row is one run folder (what `captioning-train` wrote: results.json, attention.npz, config.yaml and
checkpoints/best.pt): the image with the run's name and caption, then each generated word's map overlaid on what
the encoder sees (as the run's own figures draw it). The image is the first test image every run captioned, or
`--image-id`. Runs are named `NAME=FOLDER` (or by their folder's name):

    python experiments/survey_figure.py soft=outputs/soft mean=outputs/mean monotonic=outputs/monotonic \\
        --out experiments/figures/survey_maps.jpg
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from captioning.data.images import load_image
from captioning.data.readers.karpathy import read_karpathy
from captioning.factory.load import load_model
from captioning.reporting.figures import overlay_attention
from captioning.reporting.html import load_attention


def read_run(folder: Path) -> tuple[dict[int, str], dict[int, np.ndarray]]:
    """A run's captions (image id -> caption) and maps (image id -> (T, h, w))."""
    captions = {int(r["image_id"]): str(r["caption"]) for r in json.loads((folder / "results.json").read_text())}
    maps, _ = load_attention(folder / "attention.npz")
    return captions, maps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="NAME=FOLDER or FOLDER, one per row")
    p.add_argument("--image-id", type=int, default=None, help="the test image (default: the first all runs captioned)")
    p.add_argument("--max-words", type=int, default=10, help="word panels per row at most")
    p.add_argument("--dpi", type=int, default=72)
    p.add_argument("--out", type=Path, required=True, help="the figure: .png, or .jpg (a fraction of the size)")
    args = p.parse_args()
    named = [(r.split("=", 1) if "=" in r else (Path(r).name, r)) for r in args.runs]
    runs = [(name, Path(folder), *read_run(Path(folder))) for name, folder in named]
    common = sorted(set.intersection(*(set(captions) for _, _, captions, _ in runs)))
    if not common:
        raise SystemExit("the runs captioned no image in common")
    worded = [i for i in common if all(i in maps for _, _, _, maps in runs)]  # no run's caption is empty
    image_id = (worded or common)[0] if args.image_id is None else args.image_id
    if image_id not in common:
        raise SystemExit(f"image {image_id} is not captioned by every run (e.g. {common[:5]})")
    cfg = OmegaConf.load(runs[0][1] / "config.yaml")
    records = read_karpathy(Path(cfg.dataset.annotations), cfg.eval.split, cfg.dataset.image_root)
    record = next(r for r in records if r.image_id == image_id)
    model, _, _ = load_model(runs[0][1] / "checkpoints" / "best.pt")
    image = model.encoder.view(load_image(record.path))  # what the encoders see (every run: the same encoder view)
    cols = 1 + args.max_words
    fig = Figure(figsize=(1.6 * cols, 1.9 * len(runs)), dpi=args.dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(runs), cols, squeeze=False)
    for row, (name, _, captions, maps) in zip(axes, runs):
        words = captions[image_id].split()
        row[0].imshow(np.asarray(image))
        row[0].set_title(name, fontsize=9, fontweight="bold")
        row[0].text(0, 1.0, textwrap.fill(captions[image_id], 24), fontsize=6, va="top", ha="left",
                    transform=row[0].transAxes, color="white", backgroundcolor="black")
        for ax, word, alpha in zip(row[1:], words, maps.get(image_id, ())):  # an empty caption has no maps
            ax.imshow(overlay_attention(image, alpha))
            ax.set_title(word, fontsize=8)
        for ax in row:
            ax.set_axis_off()
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=args.dpi)
    print(f"wrote {args.out}: image {image_id}, {len(runs)} runs")


if __name__ == "__main__":
    main()
