"""The table and figure of experiments/decoders_shapes.sh, from its runs' metrics.json, history.json and figures.

    python experiments/decoders_table.py OUT TABLE.md FIGURE.png
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


def side_by_side(left: Path, right: Path, out: Path) -> None:
    """Two attention figures (the same test image) one above the other, titled by decoder."""
    images = [imread(str(p)) for p in (left, right)]
    fig = Figure(figsize=(12, 2 * sum(i.shape[0] / i.shape[1] * 6 for i in images)))
    FigureCanvasAgg(fig)
    for k, (image, title) in enumerate(zip(images, ("SAT soft attention", "Transformer (last layer, mean of heads)"))):
        ax = fig.add_subplot(2, 1, k + 1)
        ax.imshow(image)
        ax.set_title(title)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


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
    sat, transformer = (sorted((out / f"xe_{n}" / "figures").glob("*.png")) for n in ("sat_soft", "transformer"))
    common = sorted({p.name for p in sat} & {p.name for p in transformer})
    if common:
        name = common[0]
        side_by_side(out / "xe_sat_soft" / "figures" / name, out / "xe_transformer" / "figures" / name, figure)
        print(f"figure: {figure} (test image {Path(common[0]).stem})")


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:4]))
