"""The table and figures of experiments/decoders_shapes.sh, from its runs' metrics.json, history.json and figures.

    python experiments/decoders_table.py OUT TABLE.md FIGURE.png

FIGURE: SAT soft's and the Transformer's maps of one test image; decoders_zoo.jpg beside it: the zoo's attention
models' maps of one test image (Att2in, Att2all, adaptive with and without its sentinel, AoA, M2; those run).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import imread

NAMES = {"sat_soft": "SAT soft", "sat_hard": "SAT hard", "updown": "Up-Down", "transformer": "Transformer",
         "fc": "Show and Tell", "att2in": "Att2in", "att2all": "Att2all", "adaptive": "Adaptive (sentinel)",
         "adaptive_spatial": "Adaptive, no sentinel", "aoa": "AoA", "m2": "M2"}


def row(run: Path, label: str) -> str:
    """One table row: test metrics (beam 3) and training seconds per epoch."""
    m = json.loads((run / "metrics.json").read_text())
    epochs = len(json.loads((run / "history.json").read_text()))
    per_epoch = m["train_seconds"] / max(epochs, 1)
    return (f"| {label} | {m['Bleu_4']:.4f} | {m['METEOR']:.4f} | {m['CIDEr']:.4f} | "
            f"{m['attention_correctness']:.3f} | {m['distinct_captions']:.3f} | {per_epoch:.1f} | "
            f"{m['best_epoch']} of {epochs} |")


# The models whose maps the figures put one above the other (their XE runs' figures of one test image).
PAIR = ("sat_soft", "transformer")
ZOO = ("att2in", "att2all", "adaptive", "adaptive_spatial", "aoa", "m2")
TITLES = {"sat_soft": "SAT soft attention", "transformer": "Transformer (last layer, mean of heads)",
          "adaptive": "Adaptive (sentinel): spatial alpha_t, beta_t in the titles",
          "aoa": "AoA (f_att: multi-head, mean of heads)", "m2": "M2 (last layer, mean of heads)"}


def stacked(out: Path, names: tuple[str, ...], figure: Path) -> None:
    """The XE runs' attention figures of one test image that all of `names` drew, one above the other, titled by
    model; runs not made are left out (fewer than two: no figure)."""
    names = tuple(n for n in names if (out / f"xe_{n}" / "figures").is_dir())
    common = set.intersection(*({p.name for p in (out / f"xe_{n}" / "figures").glob("*.png")} for n in names)) \
        if len(names) > 1 else set()
    if not common:
        return
    image = min(common)
    images = [imread(str(out / f"xe_{n}" / "figures" / image)) for n in names]
    fig = Figure(figsize=(12, sum(i.shape[0] / i.shape[1] * 12 + 0.4 for i in images)))
    FigureCanvasAgg(fig)
    for k, (picture, name) in enumerate(zip(images, names)):
        ax = fig.add_subplot(len(images), 1, k + 1)
        ax.imshow(picture)
        ax.set_title(TITLES.get(name, NAMES[name]))
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(figure, dpi=80)
    print(f"figure: {figure} (test image {Path(image).stem}: {', '.join(names)})")


def main(out: Path, table: Path, figure: Path) -> None:
    lines = ["| model | BLEU-4 | METEOR | CIDEr | attention correctness | distinct captions | s / epoch | best epoch |",
             "|---|---|---|---|---|---|---|---|"]
    for name, label in NAMES.items():
        for phase in ("xe", "scst"):
            if (out / f"{phase}_{name}" / "metrics.json").is_file():  # runs not made (MODELS, XE_ONLY) are left out
                lines.append(row(out / f"{phase}_{name}", f"{label} {phase.upper()}"))
    text = "\n".join(lines) + "\n"
    table.write_text(text)
    print(text)
    stacked(out, PAIR, figure)
    stacked(out, ZOO, figure.with_name("decoders_zoo.jpg"))  # JPEG: a sixth of the PNG


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:4]))
