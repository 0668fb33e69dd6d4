"""Tests for captioning.reporting.figures: upsampling, overlay brightness placement and the attention grid figure."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.image import AxesImage
from matplotlib.patches import Rectangle
from PIL import Image

from captioning.reporting.figures import attention_figure, overlay_attention, plot_attention, upsample_attention


def _one_hot(h: int, w: int, r: int, c: int) -> np.ndarray:
    a = np.full((h, w), 1e-4)
    a[r, c] = 1.0
    return a / a.sum()


def _cell_means(x: np.ndarray, h: int, w: int) -> np.ndarray:
    """Mean of x over each grid cell's pixels (a pixel belongs to the cell containing its centre)."""
    H, W = x.shape
    rows = np.floor((np.arange(H) + 0.5) * h / H).astype(int)
    cols = np.floor((np.arange(W) + 0.5) * w / W).astype(int)
    return np.array([[x[rows == i][:, cols == j].mean() for j in range(w)] for i in range(h)])


@pytest.mark.parametrize("smooth", [True, False])
@pytest.mark.parametrize(
    "grid,size", [((7, 7), (224, 224)), ((8, 8), (90, 120)), ((12, 9), (50, 77)), ((1, 3), (5, 5))]
)
def test_upsample_shape_and_range(grid, size, smooth):
    rng = np.random.default_rng(0)
    up = upsample_attention(rng.random(grid), size, smooth=smooth)
    assert up.shape == size
    assert up.min() >= 0.0 and up.max() <= 1.0
    assert up.min() == pytest.approx(0.0) and up.max() == pytest.approx(1.0)


@pytest.mark.parametrize("grid,factor", [((7, 7), (16, 16)), ((8, 6), (5, 10)), ((14, 14), (1, 3))])
def test_upsample_nearest_is_exact_blocks(grid, factor):
    rng = np.random.default_rng(1)
    a = rng.random(grid)
    up = upsample_attention(a, (grid[0] * factor[0], grid[1] * factor[1]), smooth=False)
    expected = (a - a.min()) / (a.max() - a.min())
    np.testing.assert_allclose(up, np.kron(expected, np.ones(factor)), atol=1e-6)


def test_upsample_uniform_map_is_all_ones_and_rejects_bad_input():
    assert np.all(upsample_attention(np.full((7, 7), 1 / 49), (30, 40)) == 1.0)
    assert np.all(upsample_attention(np.zeros((7, 7)), (30, 40)) == 0.0)  # no mass (monotonic): all faded
    with pytest.raises(ValueError):
        upsample_attention(np.ones(49), (7, 7))
    with pytest.raises(ValueError):
        upsample_attention(np.array([[np.nan, 1.0]]), (4, 4))


def test_upsample_accepts_torch_tensor():
    torch = pytest.importorskip("torch")
    a = np.random.default_rng(4).random((7, 7))
    expected = upsample_attention(a, (28, 28))
    np.testing.assert_allclose(upsample_attention(torch.tensor(a), (28, 28)), expected, atol=1e-6)


def test_upsample_smooth_is_smooth():
    up = upsample_attention(_one_hot(7, 7, 3, 3), (112, 112), smooth=True)
    assert np.abs(np.diff(up, axis=0)).max() < 0.2 and np.abs(np.diff(up, axis=1)).max() < 0.2
    assert np.unravel_index(up.argmax(), up.shape) in {(55, 55), (55, 56), (56, 55), (56, 56)}


@pytest.mark.parametrize("smooth", [True, False])
@pytest.mark.parametrize("grid", [(7, 7), (8, 8), (12, 12), (6, 9)])
@pytest.mark.parametrize("wh", [(120, 90), (90, 120), (224, 224)])
def test_overlay_brightest_over_attended_cell(grid, wh, smooth):
    h, w = grid
    image = Image.new("RGB", wh, (128, 128, 128))
    cells = [(0, 0), (h - 1, w - 1), (h // 2, w // 3), (1, w - 2), (h - 1, 0)]
    for r, c in cells:
        out = overlay_attention(image, _one_hot(h, w, r, c), smooth=smooth)
        assert out.shape == (wh[1], wh[0], 3) and out.dtype == np.uint8
        means = _cell_means(out.astype(np.float64).mean(axis=2), h, w)
        assert np.unravel_index(means.argmax(), means.shape) == (r, c)
        # attended cell is bright (close to the input), far cells darkened to about 1 - strength
        if smooth:
            assert means[r, c] > 85
        else:  # flat blocks: exactly the input on the cell, exactly (1 - strength) * input elsewhere
            others = np.delete(means.ravel(), r * w + c)
            assert means[r, c] == 128 and np.all(others == 38)
        far = (h - 1 - r, w - 1 - c) if (h - 1 - r, w - 1 - c) != (r, c) else (0, 0)
        if max(abs(far[0] - r), abs(far[1] - c)) >= 3:
            assert means[far] < 0.45 * 128


def test_overlay_formula_and_strength():
    image = Image.new("RGB", (20, 10), (200, 100, 50))
    a = np.array([[0.0, 1.0]])
    out = overlay_attention(image, a, smooth=False, strength=0.5)
    np.testing.assert_array_equal(out[:, 10:], np.broadcast_to([200, 100, 50], (10, 10, 3)))
    np.testing.assert_array_equal(out[:, :10], np.broadcast_to([100, 50, 25], (10, 10, 3)))
    np.testing.assert_array_equal(overlay_attention(image, a, strength=0.0), np.asarray(image))
    with pytest.raises(ValueError):
        overlay_attention(image, a, strength=1.5)


def _image_axes(fig):
    return [ax for ax in fig.axes if any(isinstance(im, AxesImage) for im in ax.get_images())]


def test_attention_figure_panels_and_titles():
    words = ["a", "dog", "on", "the", "grass", "<end>"]
    alphas = np.random.default_rng(2).dirichlet(np.ones(49), size=len(words)).reshape(-1, 7, 7)
    image = Image.new("RGB", (120, 90), (90, 140, 60))
    fig = attention_figure(image, words, alphas, ncols=4)
    axes = _image_axes(fig)
    assert len(axes) == 1 + len(words) == len(fig.axes)
    assert axes[0].get_title() == "a dog on the grass <end>"
    assert [ax.get_title() for ax in axes[1:]] == words
    assert all(not ax.axison for ax in axes)
    assert not any(isinstance(p, Rectangle) for ax in axes for p in ax.patches)
    assert _image_axes(attention_figure(image, words, alphas, title="hi"))[0].get_title() == "hi"


def test_attention_figure_hard_attention_rectangles():
    words = ["a", "cat", "sits"]
    h, w = 8, 6
    regions = [0, 13, h * w - 1]
    alphas = np.stack([_one_hot(h, w, *divmod(r, w)).ravel() for r in regions]).reshape(-1, h, w)
    image = Image.new("RGB", (120, 80), (128, 128, 128))
    axes = _image_axes(attention_figure(image, words, alphas, regions=regions))
    assert not [p for p in axes[0].patches if isinstance(p, Rectangle)]
    for ax, reg in zip(axes[1:], regions):
        rects = [p for p in ax.patches if isinstance(p, Rectangle)]
        assert len(rects) == 1
        H, W = ax.get_images()[0].get_array().shape[:2]
        r, c = divmod(reg, w)
        x0, y0 = rects[0].get_xy()
        assert (x0 + 0.5, y0 + 0.5) == pytest.approx((c * W / w, r * H / h))
        assert (rects[0].get_width(), rects[0].get_height()) == pytest.approx((W / w, H / h))


def test_plot_attention_writes_png(tmp_path):
    words = ["two", "birds", "fly"]
    alphas = np.random.default_rng(3).random((3, 14, 14))
    image = Image.new("RGB", (160, 100), (30, 60, 200))
    out = plot_attention(image, words, alphas, tmp_path / "sub" / "dir" / "att.png", regions=[0, 5, 195])
    assert out == tmp_path / "sub" / "dir" / "att.png"
    png = Image.open(out)
    assert png.format == "PNG" and png.width > 300 and png.height > 100
    arr = np.asarray(png.convert("RGB")).astype(int)
    # red hard-attention boxes are drawn
    assert ((arr[..., 0] > 200) & (arr[..., 1] < 60) & (arr[..., 2] < 60)).sum() > 50


def test_plot_attention_length_mismatch(tmp_path):
    image = Image.new("RGB", (32, 32))
    with pytest.raises(ValueError):
        plot_attention(image, ["a", "b"], np.ones((3, 7, 7)), tmp_path / "x.png")
    with pytest.raises(ValueError):
        plot_attention(image, ["a", "b"], np.ones((2, 7, 7)), tmp_path / "x.png", regions=[0])
    with pytest.raises(ValueError):
        plot_attention(image, ["a", "b"], np.ones((2, 7, 7)), tmp_path / "x.png", regions=[0, 49])
    assert not (tmp_path / "x.png").exists()
