import math

import pytest
import torch

from captioning.training.losses import caption_loss, doubly_stochastic


def test_doubly_stochastic_matches_hand_computation():
    # One caption, 2 real steps + 1 padded step, 3 regions.
    alphas = torch.tensor([[[0.5, 0.25, 0.25], [0.2, 0.2, 0.6], [0.9, 0.05, 0.05]]])
    step_mask = torch.tensor([[True, True, False]])
    # Coverage over real steps: (0.7, 0.45, 0.85) -> (0.3^2 + 0.55^2 + 0.15^2) = 0.09 + 0.3025 + 0.0225
    assert math.isclose(doubly_stochastic(alphas, step_mask).item(), 0.415, rel_tol=1e-6)
    # A second caption with full coverage 1 everywhere adds 0: the mean over captions halves it.
    alphas2 = torch.cat([alphas, torch.tensor([[[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]]])])
    mask2 = torch.tensor([[True, True, False], [True, True, True]])
    assert math.isclose(doubly_stochastic(alphas2, mask2).item(), 0.415 / 2, rel_tol=1e-6)
    region_mask = torch.tensor([[True, False, True], [True, True, True]])
    assert math.isclose(doubly_stochastic(alphas2, mask2, region_mask).item(), (0.09 + 0.0225) / 2, rel_tol=1e-6)


def test_caption_loss_sums_over_time_and_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    targets = torch.tensor([[4, 2, 0], [3, 4, 2]])
    alphas = torch.full((2, 3, 4), 0.25)
    terms = caption_loss(logits, targets, alphas, pad_id=0, attention_weight=0.5)
    logp = torch.log_softmax(logits, -1)
    nll0 = -(logp[0, 0, 4] + logp[0, 1, 2])
    nll1 = -(logp[1, 0, 3] + logp[1, 1, 4] + logp[1, 2, 2])
    torch.testing.assert_close(terms.nll, (nll0 + nll1) / 2)
    torch.testing.assert_close(terms.token_nll, (nll0 + nll1) / 5)
    reg = ((1 - 0.5) ** 2 * 4 + (1 - 0.75) ** 2 * 4) / 2
    torch.testing.assert_close(terms.attention_reg, torch.tensor(reg))
    torch.testing.assert_close(terms.total, terms.nll + 0.5 * reg)


def test_doubly_stochastic_summed_over_captions_and_averaged_over_regions():
    # arctic-captions' normalisation (capgen.py:L1177): sum over captions of the mean over regions.
    alphas = torch.tensor([[[0.5, 0.25, 0.25], [0.2, 0.2, 0.6], [0.9, 0.05, 0.05]],
                           [[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    got = doubly_stochastic(alphas, mask, reduction="batch_sum_region_mean")
    assert math.isclose(got.item(), 0.415 / 3 + 0.0, rel_tol=1e-6)
    # N captions of the same penalty: N / L times the per-caption mean (the authors' effective lambda).
    same = alphas[:1].expand(4, -1, -1)
    ratio = doubly_stochastic(same, mask[:1].expand(4, -1), reduction="batch_sum_region_mean") / doubly_stochastic(
        same, mask[:1].expand(4, -1))
    assert math.isclose(ratio.item(), 4 / 3, rel_tol=1e-6)
    # Padded regions count neither in the sum nor in the number of regions.
    region_mask = torch.tensor([[True, False, True], [True, True, True]])
    got = doubly_stochastic(alphas, mask, region_mask, reduction="batch_sum_region_mean")
    assert math.isclose(got.item(), (0.09 + 0.0225) / 2, rel_tol=1e-6)
    with pytest.raises(ValueError, match="attention_reduction must be one of"):
        doubly_stochastic(alphas, mask, reduction="mean")
