"""The one image loader: data sets, the feature cache, `captioning-caption` and the HTML report all read images here.

Every file becomes an 8-bit RGB image the same way:
- EXIF orientation is applied (a photo shows as a viewer shows it);
- 16-bit grey (PIL modes I;16, I;16B, I;16L, and I holding 0..65535) is scaled to 8 bits (v * 255 / 65535,
  rounded), never clipped to white; 32-bit float grey (F) in 0..1 is scaled by 255, other ranges min-max;
- transparency (RGBA, LA, PA, a palette or grey image with a transparent colour) is composited on WHITE, as a page
  or viewer shows it, so transparent pixels never bring back whatever colour the file hides under them;
- CMYK, palette, bilevel and YCbCr images are converted by PIL;
- an animated GIF/PNG/WebP gives its first frame.

Decompression bombs are refused per image: the width x height in the file's header is compared with `max_pixels`
before anything is decoded, and so is the aspect ratio with MAX_ASPECT (a thin strip becomes a bomb when resized).
PIL's process-wide `Image.MAX_IMAGE_PIXELS` is never changed; its own guard (which
refuses an image over twice that number when opening it) is caught here and reported like any unreadable image.
Every failure is an `ImageError` naming the file, which data sets count as a skipped image with its reason.
"""

from __future__ import annotations

import logging
import os
import struct
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

logger = logging.getLogger(__name__)

# 8192 x 8192: far beyond any captioning data set (COCO images are about 640 x 480), and below PIL's own warning
# threshold, so PIL's global guard never decides before ours does.
DEFAULT_MAX_PIXELS = 8192 * 8192
# A resize of the shorter side to 256 (VGG/ResNet) turns a 1 x 60,000 image (60,000 pixels: no bomb) into 256 x
# 15,360,000 (11 GB); at 200:1 it stays at 256 x 51,200 (13 million pixels). Panoramas are about 4:1 to 10:1.
MAX_ASPECT = 200
BACKGROUND = (255, 255, 255)  # what transparent pixels become

_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, TypeError, EOFError, struct.error, Image.DecompressionBombError,
                  Image.DecompressionBombWarning)


class ImageError(OSError):
    """An image that cannot be used: missing, empty, corrupt, truncated or too large."""


def _grey_to_8bit(im: Image.Image) -> Image.Image:
    """16/32-bit grey (I;16*, I, F) as 8-bit L, scaled rather than clipped."""
    arr = np.asarray(im, dtype=np.float64)
    lo, hi = (float(arr.min()), float(arr.max())) if arr.size else (0.0, 0.0)
    if im.mode in _SIXTEEN_BIT or (im.mode == "I" and lo >= 0 and hi <= 65535):
        scaled = arr * (255.0 / 65535.0)  # 16-bit range; an 8-bit value v stored as v * 257 comes back as v
    elif im.mode == "F" and lo >= 0 and hi <= 1:
        scaled = arr * 255.0
    else:  # any other range: stretch it
        scaled = (arr - lo) * (255.0 / max(hi - lo, 1e-12))
    return Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8), "L")


def _has_alpha(im: Image.Image) -> bool:
    return im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info


def to_rgb(im: Image.Image) -> Image.Image:
    """8-bit RGB from any PIL mode, by the rules in the module docstring."""
    if im.mode in (*_SIXTEEN_BIT, "I", "F"):
        im = _grey_to_8bit(im)
    if _has_alpha(im):
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (*BACKGROUND, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return im.convert("RGB")


def _upright(im: Image.Image, path: Path) -> Image.Image:
    """Apply the EXIF orientation; a broken EXIF block leaves the image as stored (it is still usable)."""
    try:
        return ImageOps.exif_transpose(im)
    except _DECODE_ERRORS + (KeyError, AttributeError) as err:
        logger.debug("%s: EXIF orientation ignored (%s)", path, err)
        return im


def load_image(path: str | os.PathLike, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Open an image file as 8-bit RGB (see the module docstring); an ImageError names the file otherwise."""
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            raise ImageError(f"empty (0-byte) image file: {path}")
        with warnings.catch_warnings():
            # PIL warns (or raises, above twice its limit) from its process-wide setting; ours is per call.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                width, height = im.size  # from the header: nothing decoded yet
                if width * height > max_pixels:
                    raise ImageError(f"image too large: {path} is {width} x {height} = {width * height} pixels, over "
                                     f"the limit of {max_pixels} (decompression-bomb guard; raise max_pixels if the "
                                     "image is genuine)")
                if width < 1 or height < 1:
                    raise ImageError(f"image has no pixels: {path} is {width} x {height}")
                if max(width, height) > MAX_ASPECT * min(width, height):
                    raise ImageError(f"image too elongated: {path} is {width} x {height}, over {MAX_ASPECT}:1 (an "
                                     "encoder resizing its shorter side would make it billions of pixels)")
                im.seek(0)  # animated GIF/PNG/WebP: the first frame
                im.load()  # decode now, so a truncated file fails here and not later
                return to_rgb(_upright(im, path))
    except ImageError:
        raise
    except FileNotFoundError as err:
        raise ImageError(f"image file not found: {path}") from err
    except IsADirectoryError as err:
        raise ImageError(f"not an image file but a folder: {path}") from err
    except Image.DecompressionBombError as err:
        raise ImageError(f"image too large: {path} ({err})") from err
    except _DECODE_ERRORS as err:
        raise ImageError(f"cannot read image {path}: {err}") from err
