"""Per-word attention overlays drawn like the figures of Show, Attend and Tell (white = attended)."""

from __future__ import annotations

import logging
import math
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from captioning.base.files import atomic_file

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn: the maps' arithmetic here needs none
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

# Gaussian width of the smoothing kernel in grid cells (the paper's figures: upscale 16, sigma 20 px ~ 1.25 cells;
# a little less keeps neighbouring cells distinguishable).
SMOOTH_SIGMA_CELLS = 0.6
PANEL_INCHES = 2.6
DPI = 100
_MAX_PANEL_SIDE = 512  # images larger than this are shrunk for display only
# Text from data (caption words, a sweep's overrides) is drawn as it is: every call that draws such a string passes
# **PLAIN_TEXT, so matplotlib neither parses it as mathtext (a word like "$\\foo$" would abort the drawing, "a_b^c"
# would be typeset) nor hands it to TeX, whatever the rcParams say.
PLAIN_TEXT: dict[str, Any] = {"parse_math": False, "usetex": False}


def _to_numpy(x: Any) -> np.ndarray:
    """Convert an array-like (numpy array, list or torch tensor) to a float64 numpy array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().float().numpy()
    return np.asarray(x, dtype=np.float64)


def _nearest_index(n_out: int, n_in: int) -> np.ndarray:
    """Source cell of every output pixel (the cell containing the pixel centre) when upsampling n_in to n_out."""
    return np.minimum(((2 * np.arange(n_out) + 1) * n_in) // (2 * n_out), n_in - 1)


def _gaussian_weights(n_out: int, n_in: int, sigma_cells: float) -> np.ndarray:
    """(n_out, n_in) row-normalised Gaussian interpolation weights from cell centres to pixel centres."""
    cell = n_out / n_in
    pixel = np.arange(n_out) + 0.5
    centre = (np.arange(n_in) + 0.5) * cell
    d = (pixel[:, None] - centre[None, :]) / (sigma_cells * cell)
    w = np.exp(-0.5 * d * d)
    return w / w.sum(axis=1, keepdims=True)


def chosen_regions(alphas: Any) -> list[int]:
    """The region each word's attention map (T, h, w) selects (its argmax, row-major), for hard-attention figures;
    `alphas` is a NumPy array or a CPU tensor."""
    maps = np.asarray(alphas)
    return maps.reshape(len(maps), -1).argmax(1).tolist()


def upsample_attention(alpha: np.ndarray, size: tuple[int, int], smooth: bool = True) -> np.ndarray:
    """Upsample an (h, w) attention map to (H, W) = size, smoothed, scaled to [0, 1] (a uniform map: all 1; a map with
    no mass, monotonic attention attending to nothing: all 0, the whole image faded)."""
    a = _to_numpy(alpha)
    if a.ndim != 2 or 0 in a.shape:
        raise ValueError(f"alpha must be a non-empty (h, w) map, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError("alpha contains non-finite values")
    H, W = (int(s) for s in size)
    if H <= 0 or W <= 0:
        raise ValueError(f"size must be positive (H, W), got {size}")
    h, w = a.shape
    if smooth:
        # Gaussian-kernel interpolation between cell centres; boundary-corrected by row normalisation, so a
        # uniform map stays uniform and a one-hot map peaks over its own cell.
        out = _gaussian_weights(H, h, SMOOTH_SIGMA_CELLS) @ a @ _gaussian_weights(W, w, SMOOTH_SIGMA_CELLS).T
    else:
        out = a[np.ix_(_nearest_index(H, h), _nearest_index(W, w))]
    lo, hi = float(out.min()), float(out.max())
    if not np.any(a):
        return np.zeros((H, W), dtype=np.float32)  # no mass (monotonic attention attending to nothing): nothing
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        return np.ones((H, W), dtype=np.float32)  # uniform attention: everything equally attended
    return ((out - lo) / (hi - lo)).astype(np.float32)


def overlay_attention(
    image: Image.Image, alpha: np.ndarray, *, smooth: bool = True, strength: float = 0.7
) -> np.ndarray:
    """Blend an (h, w) attention map over the image; returns an (H, W, 3) uint8 array."""
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"strength must lie in [0, 1], got {strength}")
    rgb = np.asarray(image.convert("RGB"), dtype=np.float32)
    m = upsample_attention(alpha, rgb.shape[:2], smooth=smooth)
    # Modulate brightness by attention: attended pixels keep their value, the rest fade to (1 - strength).
    out = rgb * (1.0 - strength + strength * m)[..., None]
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _as_maps(alphas: Any, n_words: int) -> np.ndarray:
    """Validate alphas as (T, h, w); a flat (T, L) with square L is reshaped to (T, sqrt L, sqrt L)."""
    a = _to_numpy(alphas)
    if a.ndim == 2:
        side = math.isqrt(a.shape[1])
        if side * side != a.shape[1]:
            raise ValueError(f"flat alphas (T, L) need a square L, got {a.shape}; pass (T, h, w)")
        a = a.reshape(a.shape[0], side, side)
    if a.ndim != 3:
        raise ValueError(f"alphas must be (T, h, w), got shape {a.shape}")
    if a.shape[0] != n_words:
        raise ValueError(f"got {n_words} words but {a.shape[0]} attention maps")
    return a


def _display_image(image: Image.Image) -> Image.Image:
    """RGB copy of the image, shrunk (aspect kept) if its longer side exceeds the panel limit."""
    img = image.convert("RGB")
    scale = _MAX_PANEL_SIDE / max(img.size)
    if scale < 1.0:
        size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
        img = img.resize(size, Image.Resampling.BICUBIC)
    return img


def _checked_regions(regions: Sequence[int], num_words: int, h: int, w: int) -> list[int]:
    """Hard attention's chosen cell per word, refused unless there is one per word inside the h x w grid."""
    cells = [int(r) for r in regions]
    if len(cells) != num_words:
        raise ValueError(f"got {num_words} words but {len(cells)} regions")
    bad = [r for r in cells if not 0 <= r < h * w]
    if bad:
        raise ValueError(f"regions {bad} outside the {h}x{w} grid")
    return cells


EMPTY_CAPTION = "(an empty caption: <end> was the first word)"


def attention_figure(
    image: Image.Image,
    words: Sequence[str],
    alphas: np.ndarray,
    *,
    regions: Sequence[int] | None = None,
    smooth: bool = True,
    ncols: int = 5,
    title: str | None = None,
    sentinel: Sequence[float] | np.ndarray | None = None,
) -> Figure:
    """Build the grid figure: the image, then one attention-overlay panel per word (hard-attention cell boxed;
    decoder=adaptive: the sentinel's weight beta beside each word, the share of the word not taken from the image).
    An empty caption (<end> first; maps (0, h, w)) is the image alone, titled so."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    words = [str(wd) for wd in words]
    maps = _as_maps(alphas, len(words))
    _, h, w = maps.shape
    if regions is not None:
        regions = _checked_regions(regions, len(words), h, w)
    if ncols < 1:
        raise ValueError(f"ncols must be >= 1, got {ncols}")
    if sentinel is not None and len(sentinel) != len(words):
        raise ValueError(f"got {len(words)} words but {len(sentinel)} sentinel weights")

    img = _display_image(image)
    W, H = img.size
    n = 1 + len(words)
    cols = min(ncols, n)
    rows = math.ceil(n / cols)
    aspect = H / W
    fig = Figure(figsize=(PANEL_INCHES * cols, PANEL_INCHES * rows * aspect + 0.45 * rows), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n:]:
        fig.delaxes(ax)

    head = title if title is not None else " ".join(words) or EMPTY_CAPTION
    axes[0].imshow(np.asarray(img))
    axes[0].set_title(textwrap.fill(head, width=max(20, int(PANEL_INCHES * 11))), fontsize=9, **PLAIN_TEXT)
    cell_w, cell_h = W / w, H / h
    for t, (ax, word) in enumerate(zip(axes[1:n], words)):
        ax.imshow(overlay_attention(img, maps[t], smooth=smooth))
        label = word if sentinel is None else f"{word}  \u03b2={float(sentinel[t]):.2f}"
        ax.set_title(label, fontsize=11, **PLAIN_TEXT)
        if regions is not None:
            r, c = divmod(regions[t], w)
            # imshow puts pixel centres on integers, so pixel edges sit at -0.5.
            ax.add_patch(
                Rectangle(
                    (c * cell_w - 0.5, r * cell_h - 0.5), cell_w, cell_h,
                    fill=False, edgecolor="red", linewidth=2.0,
                )
            )
    for ax in axes[:n]:
        ax.set_axis_off()
    fig.tight_layout()
    return fig


def plot_attention(
    image: Image.Image,
    words: Sequence[str],
    alphas: np.ndarray,
    out_path: str | os.PathLike,
    *,
    regions: Sequence[int] | None = None,
    smooth: bool = True,
    ncols: int = 5,
    title: str | None = None,
    sentinel: Sequence[float] | np.ndarray | None = None,
) -> Path:
    """Save a grid figure (PNG, atomically): the image, then one panel per word with its attention overlay; returns
    the path."""
    fig = attention_figure(image, words, alphas, regions=regions, smooth=smooth, ncols=ncols, title=title,
                           sentinel=sentinel)
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_file(path) as f:
            fig.savefig(f, dpi=DPI, format="png")
    finally:
        fig.clear()  # no pyplot registry is involved, so dropping the figure frees it
    log.info("saved attention figure with %d word panels to %s", len(words), path)
    return path
