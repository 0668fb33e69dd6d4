"""The attention family (conf/attention/*.yaml): normalisation, masks, gradients, decoding, local/location specifics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from captioning.decoding import beam_search, greedy_decode
from captioning.losses import caption_loss
from captioning.models.attention import Attention, SoftAttention
from captioning.models.attention_family import (DotAttention, LocalAttention, LocationAttention, grid_positions,
                                                resolve_grid)
from captioning.models.captioner import build_captioner
from conftest import TINY_MODEL

CONF = Path(__file__).resolve().parents[1] / "conf" / "attention"
NAMES = ["soft", "dot", "general", "concat", "local", "location", "multihead"]
GRID_NAMES = ["local", "location"]
SMALL = {"attention_dim": 8, "predictor_dim": 8, "num_filters": 3, "kernel_size": 3, "num_heads": 2, "head_dim": 4}


def _config(name: str) -> dict:
    """conf/attention/<name>.yaml with its sizes shrunk for tests."""
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"))
    assert cfg["_target_"].startswith("captioning.models.attention")
    return {k: SMALL.get(k, v) for k, v in cfg.items()}


def _make(name: str, D: int = 6, n: int = 5, **overrides) -> Attention:
    torch.manual_seed(0)
    return instantiate(OmegaConf.create({**_config(name), **overrides}), annotation_dim=D, hidden_dim=n)


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
    assert (out.alpha[~mask] == 0).all() and (out.alpha[mask] > 0).all()
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


@pytest.mark.parametrize("name", NAMES)
def test_every_parameter_gets_a_gradient_inside_the_captioner(name):
    model = _captioner(name)
    torch.manual_seed(1)
    images, captions = torch.randn(3, 3, 32, 32), torch.randint(4, 12, (6, 7))
    captions[:, 0] = 1
    captions[0, 5:] = 0
    out = model(images, captions, torch.arange(3).repeat_interleave(2))
    assert out.alphas.shape == (6, 6, 64)
    torch.testing.assert_close(out.alphas.sum(-1), torch.ones(6, 6))
    caption_loss(out.logits, captions[:, 1:], out.alphas, pad_id=0).total.backward()
    missing = [n for n, p in model.named_parameters()
               if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)]
    assert not missing, missing


@pytest.mark.parametrize("name", NAMES)
def test_beam_size_one_is_greedy(name):
    model = _captioner(name).eval()
    torch.manual_seed(3)
    a, grid = model.encode(torch.randn(4, 3, 32, 40))  # an (8, 10) grid: not square
    assert grid == (8, 10)
    mask = torch.ones(4, 80, dtype=torch.bool)
    mask[0] = (grid_positions(*grid)[:, 0] < 6) & (grid_positions(*grid)[:, 1] < 7)  # a smaller image, padded
    g = greedy_decode(model.decoder, a, max_len=8, mask=mask, grid=grid)
    b = beam_search(model.decoder, a, beam_size=1, max_len=8, mask=mask, grid=grid)
    assert g.tokens == b.tokens
    torch.testing.assert_close(g.scores, b.scores)
    for ga, ba in zip(g.alphas, b.alphas):
        torch.testing.assert_close(ga, ba)
    assert all((alpha[:, ~mask[0]] == 0).all() for alpha in g.alphas[:1])


# --- local-p --------------------------------------------------------------------------------------------------

def _local(bias: float, damp: float = 0.2, **kwargs) -> LocalAttention:
    """Local attention whose centre logits get `bias` and whose content scores are damped (O(0.1-1) spread)."""
    att = _make("local", **kwargs)
    with torch.no_grad():
        att.W_p.bias.fill_(bias)  # sigmoid -> 1 (bias > 0): bottom-right corner; -> 0 (bias < 0): top-left
        for p in att.scorer.parameters():
            p.mul_(damp)
    return att


@pytest.mark.parametrize("bias, corner", [(30.0, (2, 3)), (-30.0, (0, 0))])
def test_local_centre_pushed_to_a_corner_concentrates_there(bias, corner):
    att = _local(bias, sigma=0.5)
    a, h, mask, prev_alpha = _padded_batch()
    out = _run(att, a, h, mask, prev_alpha)
    pos = grid_positions(3, 4)
    # image 1 uses the whole (3, 4) grid; image 0 only its 2x3 top-left, so its bottom-right is (1, 2).
    corners = [(min(corner[0], 1), min(corner[1], 2)), corner]
    for b, c in enumerate(corners):
        near = (pos - torch.tensor(c, dtype=torch.float)).norm(dim=1) <= 2 * 0.5  # within 2 sigma
        assert out.alpha[b, near].sum() > 0.9, (b, out.alpha[b])
        assert out.alpha[b].argmax().item() == c[0] * 4 + c[1]


def test_local_window_is_exactly_the_gaussian_when_scores_are_flat():
    att = _local(30.0, damp=0.0, sigma=1.3)
    a, h, mask, prev_alpha = _padded_batch()
    out = _run(att, a, h, mask, prev_alpha)
    pos = grid_positions(3, 4)
    for b, c in enumerate([(1.0, 2.0), (2.0, 3.0)]):
        g = torch.exp(-((pos - torch.tensor(c)) ** 2).sum(1) / (2 * 1.3**2)) * mask[b]
        torch.testing.assert_close(out.alpha[b], g / g.sum())


@pytest.mark.parametrize("sigma", [0.5, 1.0])
def test_local_window_width_is_respected(sigma):
    def mass_near(att, radius):
        """Per state, the attention mass within `radius` regions of the predicted centre on an (8, 8) grid."""
        torch.manual_seed(4)
        a, h = torch.randn(32, 64, 6), torch.randn(32, 5)
        out = att(a, att.prepare(a, (8, 8)), h)
        dist = (grid_positions(8, 8) - att.centre(h, torch.tensor([8.0, 8.0])).unsqueeze(1)).norm(dim=-1)  # (B, L)
        return (out.alpha * (dist <= radius)).sum(1)  # (B,)

    narrow = _local(0.0, sigma=sigma)  # the centre is wherever the state puts it, usually between regions
    assert mass_near(narrow, 3 * sigma).min() > 0.9
    assert mass_near(narrow, 2 * sigma).mean() > 0.8  # a continuous 2-D Gaussian has 86% within 2 sigma
    wide = _local(0.0, sigma=20.0)
    assert mass_near(wide, 2 * sigma).mean() < 0.3  # the same content scores, but no window


def test_local_with_a_huge_window_is_global_attention():
    att = _make("local", sigma=1e6)
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
    with pytest.raises(ValueError, match="sigma"):
        LocalAttention(6, 5, sigma=0.0)


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
    att = _local(30.0, sigma=0.5) if name == "local" else _make(name)
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


def test_dot_without_projection_is_the_plain_dot_product():
    att = _make("dot", D=5, n=5, project=False, scale=False)
    assert not list(att.parameters())
    a, h, mask, prev_alpha = _padded_batch(D=5)
    out = _run(att, a, h, mask, prev_alpha)
    expected = torch.softmax(torch.einsum("bld,bd->bl", a, h).masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(out.alpha, expected)
    with pytest.raises(ValueError, match="annotation_dim"):
        DotAttention(6, 5, project=False)


def test_soft_attention_is_loaded_from_its_config():
    assert isinstance(_make("soft"), SoftAttention)
