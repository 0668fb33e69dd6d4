"""Attention correctness: exact attention mass inside boxes, checked against hand computations."""

from __future__ import annotations

import math
import time
from fractions import Fraction

import numpy as np
import pytest
import torch

from captioning.metrics import attention_correctness, attention_mass_in_boxes, box_coverage


def one_hot(h: int, w: int, r: int, c: int) -> np.ndarray:
    a = np.zeros((h, w))
    a[r, c] = 1.0
    return a


def uniform(h: int, w: int) -> np.ndarray:
    return np.full((h, w), 1.0 / (h * w))


# ------------------------------------------------------------------------------------------------
# attention_mass_in_boxes
# ------------------------------------------------------------------------------------------------
def test_all_mass_in_one_cell_inside_the_box() -> None:
    # 32x32 image, 4x4 grid: cell (1, 2) covers rows 8..15 and columns 16..23
    assert attention_mass_in_boxes(one_hot(4, 4, 1, 2), [[16, 8, 24, 16]], (32, 32)) == 1.0
    assert attention_mass_in_boxes(one_hot(4, 4, 1, 2), [[10, 2, 30, 20]], (32, 32)) == 1.0
    # half of it horizontally and half vertically -> a quarter; a box elsewhere -> nothing
    assert attention_mass_in_boxes(one_hot(4, 4, 1, 2), [[0, 0, 20, 12]], (32, 32)) == 0.25
    assert attention_mass_in_boxes(one_hot(4, 4, 1, 2), [[0, 0, 16, 32]], (32, 32)) == 0.0
    # 100x100 image on a 7x7 grid: cell (3, 3) covers [300/7, 400/7) = [42.86, 57.14) on both axes
    assert attention_mass_in_boxes(one_hot(7, 7, 3, 3), [[42, 42, 58, 58]], (100, 100)) == pytest.approx(1.0, abs=1e-12)
    # box [50, 0, 100, 100) keeps (400/7 - 50) / (100/7) = 0.5 of that cell
    half = attention_mass_in_boxes(one_hot(7, 7, 3, 3), [[50, 0, 100, 100]], (100, 100))
    assert half == pytest.approx(0.5, abs=1e-12)


@pytest.mark.parametrize(
    ("image_size", "grid", "box"),
    [
        ((32, 32), (4, 4), (5, 3, 20, 31)),     # divisible
        ((96, 96), (8, 8), (0, 0, 96, 96)),     # the whole image
        ((100, 100), (7, 7), (10, 20, 60, 73)),  # 100 = 7 * 14 + 2: cells are 100/7 pixels wide
        ((50, 75), (3, 4), (7, 11, 69, 38)),    # non-square, both axes non-divisible
        ((224, 224), (7, 7), (13, 17, 200, 101)),
    ],
)
def test_uniform_map_gives_box_area_over_image_area(image_size, grid, box) -> None:
    H, W = image_size
    x0, y0, x1, y1 = box
    expected = Fraction((x1 - x0) * (y1 - y0), H * W)  # exact rational area ratio
    got = attention_mass_in_boxes(uniform(*grid), [box], image_size)
    assert got == pytest.approx(float(expected), rel=0, abs=1e-12)


def _exact_mass(alpha: list[list[Fraction]], boxes: list[tuple[int, int, int, int]], H: int, W: int) -> Fraction:
    """Independent exact computation: every pixel of the union, intersected with every cell rectangle."""
    h, w = len(alpha), len(alpha[0])

    def overlap(p: int, k: int, n: int, size: int) -> Fraction:  # |[p, p+1) ∩ [k*size/n, (k+1)*size/n)|
        lo, hi = max(Fraction(p), Fraction(k * size, n)), min(Fraction(p + 1), Fraction((k + 1) * size, n))
        return max(hi - lo, Fraction(0))

    inside = [[any(x0 <= x < x1 and y0 <= y < y1 for x0, y0, x1, y1 in boxes) for x in range(W)] for y in range(H)]
    cell_area = Fraction(H, h) * Fraction(W, w)
    total = Fraction(0)
    for r in range(h):
        rows = [(y, overlap(y, r, h, H)) for y in range(H)]
        rows = [(y, o) for y, o in rows if o]
        for c in range(w):
            cols = [(x, overlap(x, c, w, W)) for x in range(W)]
            cols = [(x, o) for x, o in cols if o]
            covered = sum((oy * ox for y, oy in rows for x, ox in cols if inside[y][x]), Fraction(0))
            total += alpha[r][c] * covered / cell_area
    return total


def test_arbitrary_map_matches_exact_rational_computation() -> None:
    H, W, h, w = 23, 17, 5, 3  # neither side divisible
    rng = np.random.default_rng(0)
    weights = rng.integers(1, 20, size=(h, w))
    alpha_f = [[Fraction(int(v), int(weights.sum())) for v in row] for row in weights]
    boxes = [(2, 3, 11, 15), (7, 10, 16, 22), (0, 0, 3, 2)]  # the first two overlap
    expected = _exact_mass(alpha_f, boxes, H, W)
    got = attention_mass_in_boxes(weights / weights.sum(), boxes, (H, W))
    assert got == pytest.approx(float(expected), rel=0, abs=1e-12)


def test_divisible_sizes_equal_per_pixel_rasterisation() -> None:
    """When H = k*h and W = m*w each cell is a k x m pixel block: the same as spreading per pixel."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        h, w = rng.integers(1, 9, size=2)
        k, m = rng.integers(1, 7, size=2)
        H, W = int(h * k), int(w * m)
        alpha = rng.dirichlet(np.ones(h * w)).reshape(h, w)
        boxes = []
        for _ in range(rng.integers(1, 4)):
            x0, x1 = sorted(rng.integers(0, W + 1, size=2))
            y0, y1 = sorted(rng.integers(0, H + 1, size=2))
            boxes.append((int(x0), int(y0), int(x1), int(y1)))
        pixels = np.kron(alpha, np.ones((k, m))) / (k * m)  # each pixel: its cell's mass / pixel count
        mask = np.zeros((H, W), dtype=bool)
        for x0, y0, x1, y1 in boxes:
            mask[y0:y1, x0:x1] = True
        assert attention_mass_in_boxes(alpha, boxes, (H, W)) == pytest.approx(pixels[mask].sum(), rel=0, abs=1e-12)


def test_overlapping_boxes_are_counted_once() -> None:
    a, b = (10, 20, 60, 70), (30, 30, 80, 90)  # 50x50 and 50x60 boxes sharing a 30x40 rectangle
    union = 50 * 50 + 50 * 60 - 30 * 40
    got = attention_mass_in_boxes(uniform(7, 7), [a, b], (100, 100))
    assert got == pytest.approx(union / 10_000, rel=0, abs=1e-12)
    assert attention_mass_in_boxes(uniform(4, 4), [a, a, a], (100, 100)) == pytest.approx(0.25, abs=1e-12)
    # a box inside another adds nothing
    assert attention_mass_in_boxes(uniform(4, 4), [(0, 0, 50, 50), (10, 10, 20, 20)], (100, 100)) == pytest.approx(0.25)


def test_boxes_are_clipped_and_may_be_fractional_or_empty() -> None:
    assert attention_mass_in_boxes(uniform(4, 4), [(-10, -10, 16, 16)], (32, 32)) == pytest.approx(0.25)
    assert attention_mass_in_boxes(uniform(4, 4), [(0, 0, 1000, 1000)], (32, 32)) == pytest.approx(1.0)
    assert attention_mass_in_boxes(uniform(4, 4), [(0.5, 0, 8.5, 32)], (32, 32)) == pytest.approx(8 / 32)
    assert attention_mass_in_boxes(uniform(4, 4), [(5, 5, 5, 20)], (32, 32)) == 0.0
    assert attention_mass_in_boxes(uniform(4, 4), [], (32, 32)) == 0.0


def test_share_is_relative_to_total_mass() -> None:
    alpha = one_hot(4, 4, 0, 0) * 3 + one_hot(4, 4, 3, 3)  # not normalised
    assert attention_mass_in_boxes(alpha, [(0, 0, 8, 8)], (32, 32)) == pytest.approx(0.75)
    assert math.isnan(attention_mass_in_boxes(np.zeros((4, 4)), [(0, 0, 8, 8)], (32, 32)))


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="attention map"):
        attention_mass_in_boxes(np.ones(16) / 16, [(0, 0, 8, 8)], (32, 32))
    with pytest.raises(ValueError, match="x0, y0, x1, y1"):
        attention_mass_in_boxes(uniform(4, 4), [(0, 0, 8)], (32, 32))
    with pytest.raises(ValueError, match="image_size"):
        attention_mass_in_boxes(uniform(4, 4), [(0, 0, 8, 8)], (0, 32))


def test_box_coverage_fractions() -> None:
    cov = box_coverage([(0, 0, 12, 8)], (4, 4), (32, 32))
    expected = np.zeros((4, 4))
    expected[0, 0], expected[0, 1] = 1.0, 0.5
    np.testing.assert_allclose(cov, expected, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# attention_correctness
# ------------------------------------------------------------------------------------------------
def test_attention_correctness_by_hand() -> None:
    size = (32, 32)  # 4x4 grid: 8x8-pixel cells
    words = [["a", "red", "circle", "and", "a", "square"], ["a", "blue", "triangle"]]
    alphas = [
        np.stack([uniform(4, 4), one_hot(4, 4, 0, 0), one_hot(4, 4, 0, 1), uniform(4, 4), uniform(4, 4),
                  one_hot(4, 4, 3, 3)]),
        np.stack([uniform(4, 4), uniform(4, 4), one_hot(4, 4, 2, 2)]),
    ]
    boxes = [
        {"red": [[0, 0, 16, 8]], "circle": [[0, 0, 16, 8]], "square": [[24, 24, 32, 28]]},
        {"blue": [[0, 0, 16, 16]], "triangle": [[16, 16, 20, 24]], "green": [[0, 0, 1, 1]]},
    ]
    # image 0: red -> 1 (cell (0,0) inside), circle -> 1 (cell (0,1) inside), square -> 0.5 (half of
    # cell (3,3)); "a" and "and" are not object words.  image 1: blue -> uniform over a quarter of
    # the image = 0.25, triangle -> half of cell (2,2) = 0.5; "green" is never generated.
    out = attention_correctness(words, alphas, boxes, [size, size])
    assert out["attention_words"] == 5
    assert out["attention_correctness"] == pytest.approx((1 + 1 + 0.5 + 0.25 + 0.5) / 5, abs=1e-12)


def test_repeated_words_count_each_time_and_others_are_ignored() -> None:
    words = [["dog", "cat", "dog"]]
    alphas = [np.stack([one_hot(2, 2, 0, 0), one_hot(2, 2, 1, 1), one_hot(2, 2, 0, 1)])]
    boxes = [{"dog": [[0, 0, 10, 10]]}]
    out = attention_correctness(words, alphas, boxes, [(20, 20)])
    assert out == {"attention_correctness": pytest.approx(0.5), "attention_words": 2}


def test_a_map_with_no_mass_counts_zero_and_a_deficit_is_the_share_of_what_was_given() -> None:
    """Monotonic attention may attend to nothing (an all-zero map) or give less than 1 in all."""
    alphas = [np.stack([0.25 * one_hot(2, 2, 0, 0), np.zeros((2, 2)), one_hot(2, 2, 1, 1)])]
    out = attention_correctness([["dog", "dog", "dog"]], alphas, [{"dog": [[0, 0, 10, 10]]}], [(20, 20)])
    assert out == {"attention_correctness": pytest.approx(1 / 3), "attention_words": 3}


def test_no_object_words_gives_nan() -> None:
    out = attention_correctness([["a", "thing"], []], [np.stack([uniform(2, 2)] * 2), np.zeros((0, 2, 2))],
                                [{"dog": [[0, 0, 1, 1]]}, {}], [(8, 8), (8, 8)])
    assert math.isnan(out["attention_correctness"])
    assert out["attention_words"] == 0


def test_accepts_torch_tensors_and_non_square_images() -> None:
    alphas = [torch.tensor(np.stack([one_hot(3, 5, 1, 4)]), dtype=torch.float32)]
    # 30x50 image, 3x5 grid: cell (1, 4) covers rows 10..19, columns 40..49
    out = attention_correctness([["cube"]], alphas, [{"cube": [[40, 10, 50, 20]]}], [(30, 50)])
    assert out["attention_correctness"] == pytest.approx(1.0)


def test_length_mismatches_raise() -> None:
    with pytest.raises(ValueError, match="2 words but 3 attention maps"):
        attention_correctness([["a", "dog"]], [np.stack([uniform(2, 2)] * 3)], [{"dog": [[0, 0, 1, 1]]}], [(8, 8)])
    with pytest.raises(ValueError, match="same length"):
        attention_correctness([["dog"]], [], [{}], [(8, 8)])
    with pytest.raises(ValueError, match=r"\(T, h, w\)"):
        attention_correctness([["dog"]], [uniform(2, 2)], [{"dog": [[0, 0, 1, 1]]}], [(8, 8)])


def test_fast_on_250_images_of_16_words() -> None:
    rng = np.random.default_rng(0)
    n, T = 250, 16
    vocab = ["a", "red", "green", "circle", "square", "and", "left", "of", "the", "blue", "triangle"]
    words = [list(rng.choice(vocab, size=T)) for _ in range(n)]
    alphas = [rng.dirichlet(np.ones(64), size=T).reshape(T, 8, 8) for _ in range(n)]
    boxes = [{"red": [[3, 4, 30, 29]], "circle": [[3, 4, 30, 29]], "square": [[40, 50, 80, 90], [60, 5, 90, 30]],
              "green": [[40, 50, 80, 90]], "blue": [[60, 5, 90, 30]], "triangle": [[60, 5, 90, 30]]}
             for _ in range(n)]
    start = time.perf_counter()
    out = attention_correctness(words, alphas, boxes, [(96, 96)] * n)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, elapsed
    # cross-check against the one-map function
    ref = [attention_mass_in_boxes(alphas[i][t], boxes[i][wd], (96, 96))
           for i in range(n) for t, wd in enumerate(words[i]) if wd in boxes[i]]
    assert out["attention_words"] == len(ref)
    assert out["attention_correctness"] == pytest.approx(float(np.mean(ref)), abs=1e-12)
