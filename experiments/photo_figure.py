"""The README's figure of a photograph: a checkpoint's caption and per-word attention maps on photographs whose
licence allows it (scikit-image's sample photographs: public domain or CC0), with the model's training data named.

    pip install scikit-image
    python experiments/photo_figure.py CHECKPOINT --out experiments/figures/flickr8k_1k_astronaut.jpg \
        --photo astronaut --trained-on "1,000 Flickr8k photos (753 for training)"

Also prints each photo's caption (beam 3) for every sample photo named with --also.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

from PIL import Image

import captioning

LICENCES = {"astronaut": "public domain (NASA)", "chelsea": "CC0 (Stefan van der Walt)",
            "coffee": "CC0 (Rachel Michetti)", "rocket": "public domain (SpaceX)"}


def sample_photo(name: str) -> Image.Image:
    """A scikit-image sample photograph as a PIL image."""
    import skimage.data

    return Image.fromarray(getattr(skimage.data, name)())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--photo", default="astronaut", choices=sorted(LICENCES))
    parser.add_argument("--also", default="chelsea,coffee,rocket", help="other sample photos to caption (printed)")
    parser.add_argument("--trained-on", required=True, help="the training data, named in the figure's title")
    parser.add_argument("--out", type=Path, required=True, help="the figure (.jpg or .png)")
    args = parser.parse_args()
    model = captioning.load(args.checkpoint, device="cpu")
    for name in [args.photo, *[n for n in args.also.split(",") if n]]:
        result = model.caption(sample_photo(name), beam_size=3)
        print(f"{name} ({LICENCES.get(name, 'scikit-image sample')}): {result.caption}")
        if name != args.photo:
            continue
        fig = model.plot(result)
        fig.suptitle(f"scikit-image's '{name}' photo ({LICENCES[name]}), captioned by a model trained on "
                     f"{args.trained_on}", fontsize=9)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        Image.open(buf).convert("RGB").save(args.out, quality=85) if args.out.suffix.lower() in (".jpg", ".jpeg") \
            else args.out.write_bytes(buf.getvalue())
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
