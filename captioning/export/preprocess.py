"""An encoder's preprocessing as data, applied with PIL and NumPy only: the same pixels as its torchvision transform.

`captioning-export` writes the encoder's `transform()` (a torchvision Compose) as a list of steps:

    {"op": "resize", "size": S or [h, w], "interpolation": "bilinear", "max_size": null}
    {"op": "center_crop", "size": [h, w]}
    {"op": "to_tensor"}                                   uint8 (H, W, 3) -> float32 (3, H, W) in [0, 1]
    {"op": "normalize", "mean": [3 floats], "std": [3 floats]}

Each is computed as torchvision computes it on a PIL image (transforms/functional.py: the output size of a resize by
the smaller edge, PIL's resize, the rounding of the crop's corner, the zero padding of a crop larger than the image,
the float32 division by 255 and the float32 (x - mean) / std), so the arrays are bit-identical to the tensors the
PyTorch model sees (tests/export/test_export.py checks it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from captioning.base.constraints import MAX_IMAGE_SIDE
from captioning.data.images import to_rgb

# torchvision's InterpolationMode values and the PIL filters it uses for them (pil_modes_mapping).
RESAMPLING = {
    "nearest": Image.Resampling.NEAREST, "nearest-exact": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC, "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING, "lanczos": Image.Resampling.LANCZOS,
}
OPS = ("resize", "center_crop", "to_tensor", "normalize")


def _pair(value: Any, what: str) -> tuple[int, int]:
    """(h, w) from [h, w] (or [s] / s for a square); ValueError otherwise."""
    items = [value] if isinstance(value, int) else value
    if (not isinstance(items, list | tuple) or len(items) not in (1, 2)
            or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= MAX_IMAGE_SIDE for x in items)):
        raise ValueError(f"preprocessing step {what}: size must be an integer from 1 to {MAX_IMAGE_SIDE} or [h, w] "
                         f"of them, got {value!r:.80}")
    return (items[0], items[-1])


def check_steps(steps: Sequence[Any]) -> None:
    """Refuse a step list this version cannot apply: unknown ops, bad sizes, no (or a misplaced) to_tensor."""
    ops = [s.get("op") if isinstance(s, dict) else None for s in steps]
    for step, op in zip(steps, ops):
        if op not in OPS:
            raise ValueError(f"unknown preprocessing step {step!r} (this version knows {', '.join(OPS)})")
    if ops.count("to_tensor") != 1:
        raise ValueError("the preprocessing steps must hold exactly one 'to_tensor'")
    cut = ops.index("to_tensor")
    if any(op in ("resize", "center_crop") for op in ops[cut:]) or "normalize" in ops[:cut]:
        raise ValueError("the preprocessing steps must resize and crop before 'to_tensor' and normalize after it")
    for step, op in zip(steps, ops):
        if op == "resize":
            if step.get("interpolation") not in RESAMPLING:
                raise ValueError(f"resize: unknown interpolation {step.get('interpolation')!r}")
            if not isinstance(step["size"], int):
                _pair(step["size"], "resize")
            elif step.get("max_size") is not None and not isinstance(step["max_size"], int):
                raise ValueError(f"resize: max_size must be an integer or null, got {step['max_size']!r}")
        elif op == "center_crop":
            _pair(step.get("size"), "center_crop")
        elif op == "normalize":
            for key in ("mean", "std"):
                v = step.get(key)
                if not isinstance(v, list) or len(v) != 3 or not all(isinstance(x, int | float) for x in v):
                    raise ValueError(f"normalize: {key} must be 3 numbers, got {v!r}")
            if any(x == 0 for x in step["std"]):
                raise ValueError("normalize: std must not be 0")


def resized_size(height: int, width: int, size: int | Sequence[int], max_size: int | None) -> tuple[int, int]:
    """The (h, w) torchvision's Resize(size, max_size) gives an image of (height, width)."""
    if not isinstance(size, int):
        return _pair(list(size), "resize")
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    if max_size is not None and new_long > max_size:
        new_short, new_long = int(max_size * new_short / new_long), max_size
    return (new_long, new_short) if width <= height else (new_short, new_long)


def resize(image: Image.Image, size: int | Sequence[int], interpolation: str, max_size: int | None) -> Image.Image:
    """torchvision's Resize on a PIL image: unchanged when the size already fits, else PIL's resize."""
    h, w = resized_size(image.height, image.width, size, max_size)
    if (h, w) == (image.height, image.width):
        return image
    return image.resize((w, h), RESAMPLING[interpolation])


def center_crop(image: Image.Image, size: Sequence[int] | int) -> Image.Image:
    """torchvision's CenterCrop on a PIL image: zero padding first when the crop is larger than the image."""
    ch, cw = _pair(size, "center_crop")
    if cw > image.width or ch > image.height:
        dw, dh = max(cw - image.width, 0), max(ch - image.height, 0)  # (left, top) get the floor of half, as there
        padded = Image.new(image.mode, (image.width + dw, image.height + dh))  # black: fill 0
        padded.paste(image, (dw // 2, dh // 2))
        image = padded
        if (image.height, image.width) == (ch, cw):
            return image
    top, left = int(round((image.height - ch) / 2.0)), int(round((image.width - cw) / 2.0))
    return image.crop((left, top, left + cw, top + ch))


def to_array(image: Image.Image) -> np.ndarray:
    """ToTensor: 8-bit RGB (H, W, 3) -> float32 (3, H, W) in [0, 1], divided as torchvision divides."""
    pixels = np.asarray(image, dtype=np.uint8).reshape(image.height, image.width, 3)
    return pixels.transpose(2, 0, 1).astype(np.float32) / np.float32(255.0)  # (3, H, W)


def normalize(x: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Normalize: (x - mean) / std per channel, in float32 as torchvision's in-place sub_ and div_."""
    m = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
    s = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)
    return (x - m) / s  # (3, H, W)


def apply(image: Image.Image, steps: Sequence[dict[str, Any]]) -> np.ndarray:
    """The encoder's input (3, H, W) float32 for one image (any PIL mode: made 8-bit RGB as the image loader does)."""
    out: Any = to_rgb(image)
    for step in steps:
        op = step["op"]
        if op == "resize":
            out = resize(out, step["size"], step["interpolation"], step.get("max_size"))
        elif op == "center_crop":
            out = center_crop(out, step["size"])
        elif op == "to_tensor":
            out = to_array(out)
        else:
            out = normalize(out, step["mean"], step["std"])
    return out


def view(image: Image.Image, steps: Sequence[dict[str, Any]]) -> Image.Image:
    """The part of the image the encoder sees (its resize and crop only): what attention maps cover."""
    out = to_rgb(image)
    for step in steps:
        if step["op"] == "resize":
            out = resize(out, step["size"], step["interpolation"], step.get("max_size"))
        elif step["op"] == "center_crop":
            out = center_crop(out, step["size"])
    return out
