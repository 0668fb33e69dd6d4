"""The survey's forms beyond the scores: the no-attention control (mean), monotonic attention and its public
alignment function, Luong's local-m, the hybrid attention's normalisations, channel-wise and multi-level attention (tests/models/test_decoders.py runs the
family's shared checks on each: gradients, packed = plain, beam 1 = greedy)."""

from __future__ import annotations

import itertools

import pytest
import torch
from family import GRID, build, data

from captioning.factory import registry
from captioning.models import monotonic_attention
from captioning.models.attention import SoftAttention
from captioning.models.attention_family import MeanAttention
from captioning.models.channel import ChannelAttention
from captioning.models.decoders.base import mean_annotation
from captioning.models.decoding import beam_search, greedy_decode
from captioning.models.grid_attention import LocalAttention, LocationAttention, reading_order
from captioning.models.monotonic import MonotonicAttention
from captioning.models.multilevel import MultiLevelAttention, coarse_cells

D, n = 6, 5


def _batch(B: int = 2, grid: tuple[int, int] = (3, 4)):
    """a (B, L, D) on a (3, 4) grid with image 0's real regions the top-left 2 x 3, and h (B, n), float64."""
    g = torch.Generator().manual_seed(3)
    L = grid[0] * grid[1]
    a, h = torch.randn(B, L, D, generator=g, dtype=torch.float64), torch.randn(B, n, generator=g, dtype=torch.float64)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[0] = torch.tensor([r < 2 and c < 3 for r in range(grid[0]) for c in range(grid[1])])
    return a, h, mask


# -- mean -------------------------------------------------------------------------------------------------------

def test_mean_is_the_masked_mean_with_uniform_weights_and_no_parameters():
    att = MeanAttention(D, n)
    a, h, mask = _batch()
    out = att(a, att.prepare(a, (3, 4)), h, mask)
    mean, uniform = mean_annotation(a, mask)
    torch.testing.assert_close(out.context, mean, atol=1e-15, rtol=1e-14)
    torch.testing.assert_close(out.alpha, uniform, atol=0, rtol=0)
    assert out.alpha[0, mask[0]].eq(1 / 6).all() and out.alpha[1].eq(1 / 12).all()
    assert not list(att.parameters())
    other = att(a, att.prepare(a, (3, 4)), -3 * h, mask)  # nothing is read from h
    assert torch.equal(other.context, out.context)


# -- monotonic_attention: TensorFlow's contract ----------------------------------------------------------------

def _stops_by_enumeration(p: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """P(stop at j) = sum_{i <= j} previous_i prod_{i <= m < j} (1 - p_m) p_j, summed out term by term."""
    B, L = p.shape
    out = torch.zeros_like(p)
    for b, i, j in itertools.product(range(B), range(L), range(L)):
        if i <= j:
            out[b, j] += previous[b, i] * torch.prod(1 - p[b, i:j]) * p[b, j]
    return out


def test_recursive_is_the_stopping_distribution_and_parallel_equals_it():
    g = torch.Generator().manual_seed(0)
    p = 0.05 + 0.9 * torch.rand(3, 7, generator=g, dtype=torch.float64)
    previous = torch.softmax(torch.randn(3, 7, generator=g, dtype=torch.float64), 1)
    recursive = monotonic_attention(p, previous, "recursive")
    torch.testing.assert_close(recursive, _stops_by_enumeration(p, previous), atol=1e-15, rtol=1e-12)
    torch.testing.assert_close(monotonic_attention(p, previous, "parallel"), recursive, atol=1e-13, rtol=1e-10)
    # the mass that stops nowhere ran off the end: prod_{m >= i} (1 - p_m) from each start i
    off = sum(previous[:, i] * torch.prod(1 - p[:, i:], dim=1) for i in range(7))
    torch.testing.assert_close(recursive.sum(1) + off, torch.ones(3, dtype=torch.float64))


def test_a_hand_computed_alignment():
    p, start = torch.tensor([[0.5, 0.5, 0.5]]), torch.tensor([[1.0, 0.0, 0.0]])
    for mode in ("recursive", "parallel"):
        torch.testing.assert_close(monotonic_attention(p, start, mode), torch.tensor([[0.5, 0.25, 0.125]]))
    # from the second entry on, the first is never chosen again
    torch.testing.assert_close(monotonic_attention(p, torch.tensor([[0.0, 1.0, 0.0]]), "recursive"),
                               torch.tensor([[0.0, 0.5, 0.25]]))


def test_parallel_clips_where_the_closed_form_breaks():
    """p = 1 early makes the cumulative product 0: the closed form divides by its clip, stays finite and in [0, 1]."""
    p = torch.tensor([[1.0, 1.0, 0.3, 0.6]])
    previous = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    out = monotonic_attention(p, previous, "parallel")
    assert torch.isfinite(out).all() and (out >= 0).all() and out.sum() <= 1 + 1e-6


def test_hard_is_recursive_on_binary_probabilities_and_never_moves_backwards():
    g = torch.Generator().manual_seed(2)
    previous = torch.nn.functional.one_hot(torch.tensor([0, 3, 5, 1]), 8).double()
    for _ in range(20):
        p = (torch.rand(4, 8, generator=g) < 0.3).double()
        hard = monotonic_attention(p, previous, "hard")
        assert torch.equal(hard, monotonic_attention(p, previous, "recursive"))
        assert set(hard.unique().tolist()) <= {0.0, 1.0} and (hard.sum(1) <= 1).all()
        was, now = previous.argmax(1), hard.argmax(1)
        moved = hard.sum(1) > 0
        assert (now[moved] >= was[moved]).all()  # forwards or where it was
        assert not hard[previous.sum(1) == 0].any()  # attending to nothing stays so
        previous = hard


def test_bad_shapes_and_modes_are_refused():
    with pytest.raises(ValueError, match=r"both be \(B, L\)"):
        monotonic_attention(torch.rand(2, 3), torch.rand(2, 4), "parallel")
    with pytest.raises(ValueError, match="one of parallel, recursive, hard"):
        monotonic_attention(torch.rand(2, 3), torch.rand(2, 3), "soft")  # type: ignore[arg-type]


# -- monotonic attention, the module -----------------------------------------------------------------------------

def _monotonic(**kwargs) -> MonotonicAttention:
    torch.manual_seed(0)
    return MonotonicAttention(D, n, attention_dim=8, **kwargs).double()


def test_reading_orders_start_at_the_top_left():
    assert reading_order(2, 3, "row").tolist() == [0, 1, 2, 3, 4, 5]
    assert reading_order(2, 3, "column").tolist() == [0, 3, 1, 4, 2, 5]
    assert reading_order(2, 3, "snake").tolist() == [0, 1, 2, 5, 4, 3]


@pytest.mark.parametrize("energy", ["bahdanau", "luong"])
@pytest.mark.parametrize("mode", ["parallel", "recursive"])
def test_the_first_step_starts_on_the_first_real_region_and_padding_gets_nothing(energy, mode):
    att = _monotonic(energy=energy, mode=mode, test_mode=mode).eval()
    a, h, mask = _batch()
    keys = att.prepare(a, (3, 4))
    uniform = mask.double() / mask.sum(1, keepdim=True)
    start = att.initial_carry(uniform)
    assert start.tolist()[0][0] == 1 and start.sum(1).tolist() == [1, 1]
    out = att(a, keys, h, mask, start)
    assert not out.alpha[0, ~mask[0]].any() and (out.alpha.sum(1) <= 1).all() and (out.alpha > 0).any()
    torch.testing.assert_close(out.context, torch.einsum("bl,bld->bd", out.alpha, a))  # the weights, unnormalised
    # with no previous alignment given, the module starts there itself
    torch.testing.assert_close(att(a, keys, h, mask).alpha, out.alpha)


def test_the_reading_order_decides_where_the_scan_goes():
    """With every energy equal the scan stops with the same probability everywhere: its weights fall along the
    reading order, so the column order's second region is the row order's (1, 0)."""
    att = _monotonic(test_mode="recursive").eval()
    with torch.no_grad():
        att.scorer.v.weight.zero_()
        att.score_bias.fill_(0.0)  # p = 1/2 everywhere
    a, h, _ = _batch()
    start = att.initial_carry(torch.full((2, 12), 1 / 12, dtype=torch.float64))
    for order, second in (("row", 1), ("column", 4), ("snake", 1)):
        att.order = order
        alpha = att(a, att.prepare(a, (3, 4)), h, None, start).alpha
        assert alpha[0, 0] == 0.5 and alpha[0, second] == 0.25


def test_hard_training_is_refused_in_one_line():
    with pytest.raises(ValueError, match="cannot train with mode=hard") as err:
        MonotonicAttention(D, n, mode="hard")
    assert "\n" not in str(err.value)


def test_a_fixed_noise_seed_reproduces_the_noise_and_resumes_from_the_checkpoint():
    a, h, mask = _batch()

    def alphas(att: MonotonicAttention, steps: int) -> list[torch.Tensor]:
        keys, out = att.prepare(a, (3, 4)), []
        for _ in range(steps):
            out.append(att(a, keys, h, mask).alpha.detach())
        return out

    one, two = _monotonic(sigmoid_noise_seed=7).train(), _monotonic(sigmoid_noise_seed=7).train()
    torch.manual_seed(1)
    first = alphas(one, 3)
    torch.manual_seed(2)  # the global generator plays no part
    assert all(torch.equal(x, y) for x, y in zip(first, alphas(two, 3)))
    assert not torch.equal(first[0], first[1])  # a new draw each call
    assert not torch.equal(first[0], alphas(_monotonic(sigmoid_noise_seed=8).train(), 1)[0])
    resumed = _monotonic(sigmoid_noise_seed=7).train()
    resumed.load_state_dict(one.state_dict())  # a checkpoint after 3 calls carries its draw count
    assert int(resumed.noise_draws) == 3 and torch.equal(alphas(resumed, 1)[0], alphas(one, 1)[0])
    assert torch.equal(alphas(one.eval(), 1)[0], alphas(two.eval(), 1)[0])  # no noise outside training
    assert int(one.noise_draws) == 4


def test_unseeded_noise_comes_from_the_global_generator():
    att = _monotonic().train()
    a, h, mask = _batch()
    keys = att.prepare(a, (3, 4))
    torch.manual_seed(4)
    x = att(a, keys, h, mask).alpha
    torch.manual_seed(4)
    assert torch.equal(att(a, keys, h, mask).alpha, x)
    assert int(att.noise_draws) == 0


def test_hard_decoding_never_moves_backwards_and_sums_to_at_most_one():
    dec = build("sat", "monotonic").double().eval()
    a, mask, _ = data(B=3)
    with torch.no_grad():
        dec.attention.score_bias.fill_(0.5)  # stop somewhere, usually
        out = greedy_decode(dec, a, 8, mask=mask, grid=GRID)
    order = reading_order(*GRID)
    for alphas in out.alphas:  # (T, L) per image
        assert set(alphas.unique().tolist()) <= {0.0, 1.0} and (alphas.sum(1) <= 1).all()
        place = alphas[:, order].argmax(1)[alphas.sum(1) > 0]  # where each word stopped, in reading order
        assert (place[1:] >= place[:-1]).all()
        stopped = (alphas.sum(1) == 0).nonzero()
        if len(stopped):  # once the scan runs off the end it attends to nothing
            assert not alphas[int(stopped[0]):].any()


# -- local-m ---------------------------------------------------------------------------------------------------

def test_local_m_steps_its_centre_along_the_real_regions_and_stops_at_the_last():
    torch.manual_seed(0)
    att = LocalAttention(D, n, half_width=1, centre="monotonic").double()
    assert not hasattr(att, "W_p") and att.reads_previous
    a, h, mask = _batch()
    keys = att.prepare(a, (3, 4))
    carry = att.initial_carry(mask.double())
    assert not carry.any()
    centres = []
    for _ in range(8):
        out = att(a, keys, h, mask, carry)
        carry = out.carry
        assert carry.sum(1).tolist() == [1, 1]
        centres.append(carry.argmax(1).tolist())
        torch.testing.assert_close(out.alpha.sum(1), torch.ones(2, dtype=torch.float64))
        assert not out.alpha[0, ~mask[0]].any()
    assert [c[0] for c in centres] == [0, 1, 2, 4, 5, 6, 6, 6]  # image 0: the 2 x 3 real regions, row by row
    assert [c[1] for c in centres] == [0, 1, 2, 3, 4, 5, 6, 7]


def test_local_m_is_the_softmax_of_the_score_in_the_window():
    torch.manual_seed(0)
    att = LocalAttention(D, n, half_width=1, centre="monotonic").double()
    a, h, _ = _batch()
    keys = att.prepare(a, (3, 4))
    centre = torch.zeros(2, 12, dtype=torch.float64)
    centre[:, 4] = 1  # the previous centre (1, 0): this step's is (1, 1)
    out = att(a, keys, h, None, centre)
    window = torch.tensor([abs(r - 1) <= 1 and abs(c - 1) <= 1 for r in range(3) for c in range(4)])
    scores = att.scorer.scores(keys[..., :-2], h)
    expected = torch.softmax(scores.masked_fill(~window, float("-inf")), 1)
    torch.testing.assert_close(out.alpha, expected, atol=1e-15, rtol=1e-13)


# -- location: Chorowski et al.'s normalisations ------------------------------------------------------------------

@pytest.mark.parametrize(("normalization", "sharpening"), [("softmax", 2.0), ("smoothing", 1.0), ("smoothing", 0.5)])
def test_location_normalisations(normalization, sharpening):
    torch.manual_seed(0)
    att = LocationAttention(D, n, attention_dim=8, num_filters=3, kernel_size=3, normalization=normalization,
                            sharpening=sharpening).double()
    a, h, mask = _batch()
    prev = mask.double() / mask.sum(1, keepdim=True)
    keys = att.prepare(a, (3, 4))
    out = att(a, keys, h, mask, prev)
    e = att.w(torch.tanh(keys.view(2, 1, 12, 8) + att.W_h(h).view(2, 1, 1, 8)
                         + att.U(att.location_features(prev, (3, 4))).view(2, 1, 12, 8))).view(2, 12)
    if normalization == "softmax":
        expected = torch.softmax((sharpening * e).masked_fill(~mask, float("-inf")), 1)
    else:
        weights = torch.sigmoid(sharpening * e) * mask
        expected = weights / weights.sum(1, keepdim=True)
    torch.testing.assert_close(out.alpha, expected, atol=1e-14, rtol=1e-12)
    torch.testing.assert_close(out.alpha.sum(1), torch.ones(2, dtype=torch.float64))
    assert not out.alpha[0, ~mask[0]].any()


def test_smoothing_flattens_what_softmax_concentrates():
    torch.manual_seed(0)
    a, h, _ = _batch()
    prev = torch.full((2, 12), 1 / 12, dtype=torch.float64)
    entropy = {}
    for norm in ("softmax", "smoothing"):
        torch.manual_seed(0)
        att = LocationAttention(D, n, attention_dim=8, normalization=norm).double()
        with torch.no_grad():
            att.w.weight.mul_(20)  # large scores: softmax near one-hot
        alpha = att(a, att.prepare(a, (3, 4)), h, None, prev).alpha
        entropy[norm] = float(-(alpha * alpha.log()).sum(1).mean().detach())
    assert entropy["smoothing"] > entropy["softmax"] + 0.5


def test_bad_options_are_refused_by_the_config_check():
    for spec, message in (({"_target_": "location", "sharpening": 0.0}, "sharpening"),
                          ({"_target_": "location", "normalization": "sparsemax"}, "normalization"),
                          ({"_target_": "local", "centre": "fixed"}, "centre"),
                          ({"_target_": "monotonic", "order": "spiral"}, "order"),
                          ({"_target_": "monotonic", "sigmoid_noise": -1.0}, "sigmoid_noise")):
        with pytest.raises(registry.ModelSpecError, match=message):
            registry.resolve("attention", spec, "attention")


# -- channel-wise attention (SCA-CNN) ----------------------------------------------------------------------------

def _channel(order: str) -> ChannelAttention:
    torch.manual_seed(0)
    return ChannelAttention(D, n, attention_dim=8, channel_dim=4, order=order).double()


@pytest.mark.parametrize("order", ["cs", "sc"])
def test_channel_attention_with_zero_channel_weights_is_soft_attention_exactly(order):
    att = _channel(order)
    soft = SoftAttention(D, n, attention_dim=8).double()
    soft.load_state_dict(att.spatial.state_dict())
    with torch.no_grad():
        att.w_out.weight.zero_()  # every channel scores alike: beta = 1/D, gamma = 1
    a, h, mask = _batch()
    out, want = att(a, att.prepare(a, (3, 4)), h, mask), soft(a, soft.prepare(a, (3, 4)), h, mask)
    assert torch.equal(out.context, want.context) and torch.equal(out.alpha, want.alpha)  # bit for bit
    torch.testing.assert_close(out.channels, torch.full((2, D), 1 / D, dtype=torch.float64))


def test_channel_only_with_zero_channel_weights_is_the_mean():
    att = _channel("c")
    assert att.spatial is None
    with torch.no_grad():
        att.w_out.weight.zero_()
    a, h, mask = _batch()
    out = att(a, att.prepare(a, (3, 4)), h, mask)
    mean, uniform = mean_annotation(a, mask)
    assert torch.equal(out.context, mean) and torch.equal(out.alpha, uniform)


@pytest.mark.parametrize("order", ["cs", "sc", "c"])
def test_channel_weights_sum_to_one_and_scale_the_features(order):
    att = _channel(order)
    a, h, mask = _batch()
    keys = att.prepare(a, (3, 4))
    out = att(a, keys, h, mask)
    beta = out.channels
    torch.testing.assert_close(beta.sum(1), torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(out.alpha.sum(1), torch.ones(2, dtype=torch.float64))
    assert not out.alpha[0, ~mask[0]].any() and beta.std(1).gt(0).all()
    gamma = D * beta
    if order == "cs":  # z = sum_i alpha_i (gamma * a_i)
        want = gamma * torch.einsum("bl,bld->bd", out.alpha, a)
    elif order == "sc":  # gamma scales the spatially attended context; v is its mean over the real regions
        want = gamma * torch.einsum("bl,bld->bd", out.alpha, a)
        v = torch.einsum("bl,bld->bd", out.alpha, a) / mask.sum(1, keepdim=True)
        torch.testing.assert_close(att.channel_weights(v, h)[0], beta)
    else:
        want = gamma * mean_annotation(a, mask)[0]
    torch.testing.assert_close(out.context, want)
    if order != "sc":  # the summary is each channel's masked mean
        torch.testing.assert_close(att.channel_weights(mean_annotation(a, mask)[0], h)[0], beta)


def test_channel_weights_are_carried_through_beam_search_and_greedy():
    dec = build("sat", "channel").double().eval()
    a, mask, _ = data(B=3)
    with torch.no_grad():
        greedy = greedy_decode(dec, a, 6, mask=mask, grid=GRID)
        beam1 = beam_search(dec, a, 1, 6, mask=mask, grid=GRID)
        beam3 = beam_search(dec, a, 3, 6, mask=mask, grid=GRID, n_best=2)
    for out in (greedy, beam1, beam3):
        assert out.channels is not None
        for words, alphas, channels in zip(out.tokens, out.alphas, out.channels):
            assert alphas.shape == (len(words), GRID[0] * GRID[1]) and channels.shape == (len(words), 10)
            torch.testing.assert_close(channels.sum(1), torch.ones(len(words), dtype=torch.float64))
    for x, y in zip(beam1.channels, greedy.channels):
        torch.testing.assert_close(x, y, atol=1e-12, rtol=0)
    assert beam3.alternatives is not None and all(m.shape[1] == 20 for alt in beam3.alternatives for _, m, _ in alt)
    assert greedy_decode(build("sat", "soft").double().eval(), a, 6, mask=mask, grid=GRID).channels is None


# -- multi-level attention ------------------------------------------------------------------------------------------

def _multilevel(**kwargs) -> MultiLevelAttention:
    torch.manual_seed(0)
    return MultiLevelAttention(D, n, attention_dim=8, **kwargs).double()


def test_one_coarse_cell_is_soft_attention_over_the_fine_grid():
    att = _multilevel(pool=4)  # a 3 x 4 grid in one 4 x 4 block
    soft = SoftAttention(D, n, attention_dim=8).double()
    soft.load_state_dict(att.fine.state_dict())
    a, h, mask = _batch()
    out, want = att(a, att.prepare(a, (3, 4), mask), h, mask), soft(a, soft.prepare(a, (3, 4), mask), h, mask)
    torch.testing.assert_close(out.alpha, want.alpha, atol=1e-15, rtol=1e-13)
    torch.testing.assert_close(out.context, want.context, atol=1e-15, rtol=1e-13)


def test_hierarchical_weights_are_the_coarse_weight_times_a_softmax_over_the_children():
    att = _multilevel(pool=2)
    a, h, mask = _batch()  # (3, 4) grid -> 2 x 2 coarse cells; image 0's real regions: the top-left 2 x 3
    out = att(a, att.prepare(a, (3, 4), mask), h, mask)
    parent, cells = coarse_cells(3, 4, 2)
    assert parent.tolist() == [0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3] and cells == 4
    pooled = torch.stack([torch.stack([a[b][(parent == c) & mask[b]].mean(0) if ((parent == c) & mask[b]).any()
                                       else torch.zeros(D, dtype=a.dtype) for c in range(4)]) for b in range(2)])
    E = att.coarse.scores(att.coarse.prepare(pooled), h)  # (B, C)
    has_child = torch.stack([torch.stack([((parent == c) & mask[b]).any() for c in range(4)]) for b in range(2)])
    A_c = torch.softmax(E.masked_fill(~has_child, float("-inf")), 1)
    e = att.fine.scores(att.fine.prepare(a), h)
    for b in range(2):
        for c in range(4):
            kids = (parent == c) & mask[b]
            if kids.any():
                want = A_c[b, c] * torch.softmax(e[b, kids], 0)
                torch.testing.assert_close(out.alpha[b, kids], want, atol=1e-15, rtol=1e-12)
    assert not out.alpha[0, ~mask[0]].any()
    torch.testing.assert_close(out.alpha.sum(1), torch.ones(2, dtype=torch.float64))


@pytest.mark.parametrize("combine", ["concat", "gate"])
def test_concat_and_gate_combine_the_levels_contexts_and_draw_the_fine_map(combine):
    att = _multilevel(combine=combine)
    a, h, mask = _batch()
    out = att(a, att.prepare(a, (3, 4), mask), h, mask)
    fine = torch.softmax(att.fine.scores(att.fine.prepare(a), h).masked_fill(~mask, float("-inf")), 1)
    torch.testing.assert_close(out.alpha, fine, atol=1e-15, rtol=1e-12)
    assert out.context.shape == (2, D)
    if combine == "gate":
        with torch.no_grad():
            att.gate.bias.fill_(1e3)  # g = 1: the fine level alone
        torch.testing.assert_close(att(a, att.prepare(a, (3, 4), mask), h, mask).context,
                                   torch.einsum("bl,bld->bd", fine, a), atol=1e-12, rtol=1e-10)
