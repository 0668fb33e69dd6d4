"""The attention family (conf/attention/*.yaml): normalisation, masks, gradients, decoding, initial scale, Luong's
scores, local-p and location specifics."""

from __future__ import annotations

import math

import pytest
import torch
from fixtures import TINY_MODEL
from omegaconf import OmegaConf

from captioning.factory import registry
from captioning.factory.models import build_captioner
from captioning.models.attention import Attention, SoftAttention
from captioning.models.attention_family import GeneralAttention, grid_positions, resolve_grid
from captioning.models.grid_attention import LocalAttention, LocationAttention
from captioning.runtime import CONF_DIR

CONF = CONF_DIR / "attention"
NAMES = ["soft", "dot", "general", "concat", "local", "location", "multihead"]
ALL_NAMES = ["soft", "hard", *NAMES[1:]]  # every file in conf/attention/
GRID_NAMES = ["local", "location"]
SMALL = {"attention_dim": 8, "predictor_dim": 8, "num_filters": 3, "kernel_size": 3, "num_heads": 2, "head_dim": 4,
         "half_width": 1}


def _config(name: str) -> dict:
    """conf/attention/<name>.yaml with its sizes shrunk for tests."""
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))
    assert cfg["_target_"] in registry.ATTENTIONS
    return {k: SMALL.get(k, v) for k, v in cfg.items()}


def _built(spec: dict, D: int, n: int) -> Attention:
    """The registered attention `spec` names, for annotations of D values and a hidden state of n."""
    cls, kwargs = registry.resolve("attention", spec, "attention")
    return cls(annotation_dim=D, hidden_dim=n, **kwargs)


def _make(name: str, D: int = 6, n: int = 5, **overrides) -> Attention:
    torch.manual_seed(0)
    return _built({**_config(name), **overrides}, D, n)


def _padded_batch(B: int = 2, grid: tuple[int, int] = (3, 4), D: int = 6, n: int = 5):
    """Annotations on a (3, 4) grid where image 0 only has the top-left 2x3 regions (the rest padded)."""
    torch.manual_seed(1)
    L = grid[0] * grid[1]
    a, h = torch.randn(B, L, D), torch.randn(B, n)
    pos = grid_positions(*grid)  # (L, 2)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[0] = (pos[:, 0] < 2) & (pos[:, 1] < 3)
    prev_alpha = mask.float() / mask.sum(1, keepdim=True)  # uniform over real regions, as at step 0
    return a, h, mask, prev_alpha


def _run(att: Attention, a, h, mask, prev_alpha, grid=(3, 4)):
    return att(a, att.prepare(a, grid), h, mask, prev_alpha)


def test_every_config_targets_this_family():
    names = sorted(p.stem for p in CONF.glob("*.yaml"))
    assert set(NAMES) <= set(names)
    for name in NAMES:
        assert isinstance(_make(name), Attention)


@pytest.mark.parametrize("name", NAMES)
def test_alphas_sum_to_one_and_masked_regions_get_zero_weight(name):
    att = _make(name)
    a, h, mask, prev_alpha = _padded_batch()
    out = _run(att, a, h, mask, prev_alpha)
    assert out.context.shape == (2, 6) and out.alpha.shape == (2, 12)
    torch.testing.assert_close(out.alpha.sum(-1), torch.ones(2))
    assert (out.alpha[~mask] == 0).all()
    if name != "local":  # local-p: zero outside its window too (tested below)
        assert (out.alpha[mask] > 0).all()
    if name != "multihead":  # z_t = sum_i alpha_ti a_i
        torch.testing.assert_close(out.context, torch.einsum("bl,bld->bd", out.alpha, a))
    # What lies in the padding cannot leak into image 0's attention or context.
    a2 = a.clone()
    a2[0, ~mask[0]] = 100.0
    out2 = _run(att, a2, h, mask, prev_alpha)
    torch.testing.assert_close(out2.alpha[0], out.alpha[0])
    torch.testing.assert_close(out2.context[0], out.context[0])


def test_multihead_context_depends_on_the_annotations():
    att = _make("multihead")
    a, h, mask, prev_alpha = _padded_batch()
    out = _run(att, a, h, mask, prev_alpha)
    assert out.context.shape == (2, 6)
    a2 = a.clone()
    a2[:, :4] += torch.randn(2, 4, 6)  # real regions of both images
    out2 = _run(att, a2, h, mask, prev_alpha)
    assert not torch.allclose(out.context, out2.context, atol=1e-4)
    assert not torch.allclose(out.alpha, out2.alpha, atol=1e-6)


def _captioner(name: str):
    torch.manual_seed(0)
    return build_captioner({**TINY_MODEL, "attention": _config(name)}, vocab_size=12)


# --- initial scale: nothing starts saturated at the paper's sizes ---------------------------------------------

def _entropy(alpha: torch.Tensor) -> torch.Tensor:
    """Mean entropy of attention maps (B, L)."""
    return -torch.special.xlogy(alpha, alpha).sum(-1).mean()


@pytest.mark.parametrize("name", ALL_NAMES)
def test_initial_attention_is_not_saturated_at_the_papers_sizes(name):
    """L = 196 (14 x 14), D = 512, n = 1800; a = relu(N(0, 1)) like post-ReLU CNN features, h = tanh(N(0, 1))."""
    L, D, n = 196, 512, 1800
    torch.manual_seed(0)
    att = _built(OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml")), D, n).eval()
    torch.manual_seed(1)
    a, h = torch.relu(torch.randn(4, L, D)), torch.tanh(torch.randn(4, n))
    with torch.no_grad():
        alpha = att(a, att.prepare(a, (14, 14)), h).alpha  # (B, L)
        torch.testing.assert_close(alpha.sum(-1), torch.ones(4))
        reference = torch.tensor(math.log(L))  # uniform over the grid
        if name == "local":  # its window: the same centres with flat scores (the Gaussian over <= 7 x 7 regions)
            for p in att.scorer.parameters():
                p.zero_()
            reference = _entropy(att(a, att.prepare(a, (14, 14)), h).alpha)
            assert reference < 0.7 * math.log(L)  # local: far from uniform over the grid, by design
    assert _entropy(alpha) > 0.9 * reference, (_entropy(alpha), reference)


def test_unscaled_general_score_would_start_nearly_one_hot():
    torch.manual_seed(0)
    att = GeneralAttention(512, 1800, scale=False)
    a, h = torch.relu(torch.randn(4, 196, 512)), torch.tanh(torch.randn(4, 1800))
    with torch.no_grad():
        assert _entropy(att(a, att.prepare(a), h).alpha) < 0.3 * math.log(196)


# --- dot, general, concat: Luong's formulas -------------------------------------------------------------------

def test_dot_is_the_plain_dot_product_when_sizes_match():
    att = _make("dot", D=5, n=5, scale=False)
    assert not list(att.parameters())
    a, h, mask, prev_alpha = _padded_batch(D=5)
    out = _run(att, a, h, mask, prev_alpha)
    expected = torch.softmax(torch.einsum("bld,bd->bl", a, h).masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(out.alpha, expected)
    scaled = _run(_make("dot", D=5, n=5), a, h, mask, prev_alpha)
    expected = torch.softmax((torch.einsum("bld,bd->bl", a, h) / 5**0.5).masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(scaled.alpha, expected)


def test_general_is_the_scaled_bilinear_form_and_dot_equals_it_when_sizes_differ():
    a, h, mask, prev_alpha = _padded_batch()
    general, dot = _make("general"), _make("dot")
    assert [n for n, _ in general.named_parameters()] == ["W_a.weight"]  # no region prior, no bias
    with torch.no_grad():
        dot.W_a.weight.copy_(general.W_a.weight)
    out = _run(general, a, h, mask, prev_alpha)
    scores = torch.einsum("bn,nd,bld->bl", h, general.W_a.weight, a) / 5**0.5
    torch.testing.assert_close(out.alpha, torch.softmax(scores.masked_fill(~mask, float("-inf")), -1))
    torch.testing.assert_close(_run(dot, a, h, mask, prev_alpha).alpha, out.alpha)
    assert len(list(_make("general", D=5, n=5).parameters())) == 1  # general keeps W_a when D == n


def test_concat_is_the_soft_score_without_its_bias():
    a, h, mask, prev_alpha = _padded_batch()
    concat, soft = _make("concat"), _make("soft")
    assert all(m.bias is None for m in (concat.W_x, concat.W_h, concat.v))
    with torch.no_grad():
        soft.W_a.weight.copy_(concat.W_x.weight), soft.W_a.bias.zero_()
        soft.W_h.weight.copy_(concat.W_h.weight), soft.w.weight.copy_(concat.v.weight)
    torch.testing.assert_close(_run(concat, a, h, mask, prev_alpha).alpha, _run(soft, a, h, mask, prev_alpha).alpha)


# --- local-p --------------------------------------------------------------------------------------------------

def _pinned(centre, half_width: int = 1, damp: float = 1.0, **kwargs) -> LocalAttention:
    """Local attention whose centre is `centre(extent)` (B, 2) and whose content scores are scaled by `damp`."""
    att = _make("local", half_width=half_width, **kwargs)
    att.centre = lambda h, extent: centre(extent)  # the predictor is tested on its own below
    with torch.no_grad():
        for p in att.scorer.parameters():
            p.mul_(damp)
    return att


def _window(pos: torch.Tensor, p: torch.Tensor, half_width: int) -> torch.Tensor:
    """Regions (L,) within half_width of p on both axes: Luong's window, per axis."""
    return ((pos - p).abs() <= half_width).all(-1)


@pytest.mark.parametrize("half_width", [1, 2, 3])
def test_local_gives_zero_weight_outside_its_window(half_width):
    att = _make("local", half_width=half_width)
    torch.manual_seed(4)
    a, h = torch.randn(16, 196, 6), 3 * torch.randn(16, 5)  # centres spread over the grid
    out = att(a, att.prepare(a, (14, 14)), h)
    p = att.centre(h, torch.tensor([14.0, 14.0]))  # (B, 2)
    inside = torch.stack([_window(grid_positions(14, 14), c, half_width) for c in p])  # (B, L)
    assert (out.alpha[~inside] == 0).all() and (out.alpha[inside] > 0).all()
    torch.testing.assert_close(out.alpha.sum(-1), torch.ones(16))
    assert inside.sum(1).max() <= (2 * half_width + 1) ** 2 and p.std(0).min() > 1.0


def test_local_with_flat_scores_is_the_truncated_gaussian():
    centre = torch.tensor([[1.0, 1.4], [1.3, 2.0]])
    att = _pinned(lambda extent: centre, half_width=1, damp=0.0)
    a, h, mask, prev_alpha = _padded_batch()
    out = _run(att, a, h, mask, prev_alpha)
    pos = grid_positions(3, 4)
    for b in range(2):
        g = torch.exp(-((pos - centre[b]) ** 2).sum(1) / (2 * 0.5**2))  # sigma = half_width / 2
        g = g * _window(pos, centre[b], 1) * mask[b]
        torch.testing.assert_close(out.alpha[b], g / g.sum())


def test_local_is_luongs_product_of_window_softmax_and_gaussian_renormalised():
    centre = torch.tensor([[6.2, 7.7]])
    att = _pinned(lambda extent: centre, half_width=2)
    torch.manual_seed(5)
    a, h = torch.randn(1, 196, 6), torch.randn(1, 5)
    keys = att.prepare(a, (14, 14))
    out = att(a, keys, h)
    pos = grid_positions(14, 14)
    inside = _window(pos, centre[0], 2)
    align = torch.softmax(att.scorer.scores(keys[..., :-2], h)[0, inside], -1)  # softmax over the window
    luong = align * torch.exp(-((pos[inside] - centre[0]) ** 2).sum(1) / (2 * 1.0**2))
    torch.testing.assert_close(out.alpha[0, inside], luong / luong.sum())


@pytest.mark.parametrize("corner", ["top-left", "bottom-right"])
def test_local_centre_in_a_corner_stays_on_each_images_own_grid(corner):
    att = _pinned((lambda e: torch.zeros_like(e)) if corner == "top-left" else (lambda e: e - 1), damp=0.2)
    a, h, mask, prev_alpha = _padded_batch()
    out = _run(att, a, h, mask, prev_alpha)
    pos = grid_positions(3, 4)
    # image 1 uses the whole (3, 4) grid; image 0 only its 2x3 top-left, so its bottom-right is (1, 2).
    centres = [(0, 0), (0, 0)] if corner == "top-left" else [(1, 2), (2, 3)]
    for b, c in enumerate(centres):
        inside = _window(pos, torch.tensor(c, dtype=torch.float), 1) & mask[b]
        assert (out.alpha[b, ~inside] == 0).all() and out.alpha[b].argmax().item() == c[0] * 4 + c[1]


def test_local_centre_is_predicted_inside_the_grid_and_learns():
    att = _make("local")
    torch.manual_seed(6)
    h = 5 * torch.randn(64, 5)
    extent = torch.tensor([[3.0, 4.0]]).expand(64, 2)
    p = att.centre(h, extent)  # (B, 2)
    expected = (extent - 1) * torch.sigmoid(att.v_p(torch.tanh(att.W_p(h))))
    torch.testing.assert_close(p, expected)
    assert (p >= 0).all() and (p <= extent - 1).all()
    a = torch.randn(64, 12, 6)
    out = att(a, att.prepare(a, (3, 4)), h)
    (out.alpha * torch.arange(12.0)).sum().backward()  # the Gaussian carries a gradient to the centre
    assert att.W_p.weight.grad.abs().sum() > 0 and att.v_p.weight.grad.abs().sum() > 0


def test_local_with_a_huge_window_is_global_attention():
    att = _make("local", half_width=10**6)
    a, h, mask, prev_alpha = _padded_batch()
    keys = att.prepare(a, (3, 4))
    out = att(a, keys, h, mask)
    expected = torch.softmax(att.scorer.scores(keys[..., :-2], h).masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(out.alpha, expected)


def test_local_dot_score_variant_and_bad_arguments():
    att = _make("local", score="dot")
    a, h, mask, prev_alpha = _padded_batch()
    torch.testing.assert_close(_run(att, a, h, mask, prev_alpha).alpha.sum(-1), torch.ones(2))
    with pytest.raises(ValueError, match="score"):
        LocalAttention(6, 5, score="bilinear")
    with pytest.raises(ValueError, match="half_width"):
        LocalAttention(6, 5, half_width=0)


# --- location-sensitive ---------------------------------------------------------------------------------------

def test_location_uses_prev_alpha_and_soft_ignores_it():
    a, h, mask, prev_alpha = _padded_batch()
    peaked = torch.zeros_like(prev_alpha)
    peaked[:, 0] = 1.0  # all mass on the top-left region (real in both images)
    loc, soft = _make("location"), _make("soft")
    assert not torch.allclose(_run(loc, a, h, mask, prev_alpha).alpha, _run(loc, a, h, mask, peaked).alpha)
    torch.testing.assert_close(_run(soft, a, h, mask, prev_alpha).alpha, _run(soft, a, h, mask, peaked).alpha)
    # prev_alpha=None means the decoder's step-0 map: uniform over real regions
    torch.testing.assert_close(_run(loc, a, h, mask, None).alpha, _run(loc, a, h, mask, prev_alpha).alpha)


def test_location_features_are_a_row_major_convolution_on_a_non_square_grid():
    att = LocationAttention(6, 5, attention_dim=8, num_filters=2, kernel_size=3)
    with torch.no_grad():
        att.conv.weight.fill_(1.0)
    prev = torch.zeros(1, 15)
    prev[0, 1 * 5 + 4] = 1.0  # region (1, 4) of a (3, 5) grid: the right edge
    f = att.location_features(prev, (3, 5))  # (1, 15, 2)
    touched = {(int(r), int(c)) for r, c in grid_positions(3, 5)[f[0, :, 0] != 0].tolist()}
    assert touched == {(r, c) for r in (0, 1, 2) for c in (3, 4)}  # its 3x3 neighbourhood, clipped at the edge


# --- non-square grids and grid inference ------------------------------------------------------------------------

@pytest.mark.parametrize("name", GRID_NAMES)
def test_non_square_grid(name):
    att = _pinned(lambda e: e - 1, damp=0.2) if name == "local" else _make(name)
    torch.manual_seed(2)
    a, h = torch.randn(2, 15, 6), torch.randn(2, 5)
    mask = torch.ones(2, 15, dtype=torch.bool)
    mask[1] = grid_positions(3, 5)[:, 1] < 4  # image 1 is 3x4 inside the (3, 5) grid
    prev = torch.rand(2, 15) * mask
    prev = prev / prev.sum(1, keepdim=True)
    out = att(a, att.prepare(a, (3, 5)), h, mask, prev)
    assert out.alpha.shape == (2, 15)
    torch.testing.assert_close(out.alpha.sum(-1), torch.ones(2))
    assert (out.alpha[1, ~mask[1]] == 0).all()
    with pytest.raises(ValueError, match="square"):
        att.prepare(a)  # L = 15 is not a perfect square and no grid was given
    with pytest.raises(ValueError, match="grid"):
        att.prepare(a, (4, 4))
    if name == "local":  # the centre is the bottom-right of each image's own grid
        assert out.alpha.argmax(-1).tolist() == [2 * 5 + 4, 2 * 5 + 3]


def test_resolve_grid():
    assert resolve_grid(16, None) == (4, 4)
    assert resolve_grid(15, (3, 5)) == (3, 5)
    with pytest.raises(ValueError, match="perfect square"):
        resolve_grid(15, None)


def test_soft_attention_is_loaded_from_its_config():
    assert isinstance(_make("soft"), SoftAttention)
