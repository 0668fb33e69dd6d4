"""Hard (stochastic) attention: sampling, test-time modes, and the REINFORCE estimator itself."""

import pytest
import torch

from captioning.models.attention import HardAttention, SoftAttention
from captioning.training.losses import MovingAverageBaseline, caption_loss, hard_attention_loss, reinforce_loss

L, D, N_HID = 5, 6, 4


def _module(**kw) -> HardAttention:
    torch.manual_seed(0)
    return HardAttention(annotation_dim=D, hidden_dim=N_HID, attention_dim=8, **kw)


def _estimates(att, a, h, rewards, batches, batch_size, baseline=None):
    """One REINFORCE gradient estimate (w.r.t. the score vector w) per batch of sampled regions."""
    att.train()
    att.sample_this_batch = True
    A, H = a.expand(batch_size, L, D), h.expand(batch_size, N_HID)
    grads = []
    for _ in range(batches):
        att.zero_grad()
        out = att(A, att.prepare(A), H)
        r = rewards[out.index]  # (M,) reward of each sampled region
        b = 0.0 if baseline is None else (baseline.value if baseline.value is not None else r.mean().item())
        # reinforce_loss is a loss: its negative gradient estimates grad E_s[r(s)].
        reinforce_loss(out.log_prob.unsqueeze(1), r, b).backward()
        grads.append(-att.w.weight.grad.clone().flatten())
        if baseline is not None:
            baseline.update(r)
    return torch.stack(grads)  # (batches, P)


def test_reinforce_matches_exact_gradient_and_baseline_reduces_variance():
    att = _module()
    torch.manual_seed(1)
    a, h = torch.randn(1, L, D), torch.randn(1, N_HID)
    rewards = torch.tensor([1.0, 3.0, -2.0, 0.5, 0.0]) + 10.0  # an offset that a baseline removes
    # Exact gradient of E_{s ~ alpha}[r(s)] = sum_s alpha_s r_s, enumerating the L regions.
    att.zero_grad()
    alpha = torch.softmax(att.scores(att.prepare(a), h), -1)  # (1, L)
    (alpha[0] * rewards).sum().backward()
    exact = att.w.weight.grad.clone().flatten()

    torch.manual_seed(2)
    plain = _estimates(att, a, h, rewards, batches=40, batch_size=1000)
    torch.manual_seed(2)
    with_baseline = _estimates(att, a, h, rewards, batches=40, batch_size=1000, baseline=MovingAverageBaseline(0.9))
    for est in (plain, with_baseline):
        # Tolerance: 4 standard errors of the mean estimate, per coordinate.
        stderr = est.std(0) / est.shape[0] ** 0.5
        assert (est.mean(0) - exact).abs().le(4 * stderr + 1e-4).all(), (est.mean(0), exact, stderr)
    torch.testing.assert_close(with_baseline.mean(0), exact, atol=0.02 * exact.abs().max().item(), rtol=0)
    # The moving-average baseline removes the offset: far lower variance (measured over 40 estimates).
    assert with_baseline.var(0).sum() < 0.1 * plain.var(0).sum()


def test_sampling_respects_alpha_and_mask():
    att = _module()
    att.train()
    att.sample_this_batch = True
    torch.manual_seed(3)
    a, h = torch.randn(4000, L, D), torch.randn(1, N_HID).expand(4000, N_HID)
    a[:] = a[:1]
    mask = torch.tensor([True, True, False, True, True]).expand(4000, L)
    out = att(a, att.prepare(a), h, mask)
    assert (out.index != 2).all()  # a padded region is never sampled
    freq = torch.bincount(out.index, minlength=L).float() / 4000
    torch.testing.assert_close(freq, out.alpha[0], atol=0.03, rtol=0)
    torch.testing.assert_close(out.context, a[torch.arange(4000), out.index])
    torch.testing.assert_close(out.log_prob, out.alpha.gather(1, out.index[:, None]).log().squeeze(1))
    ent = -(out.alpha[0, mask[0]] * out.alpha[0, mask[0]].log()).sum()
    torch.testing.assert_close(out.entropy[0], ent)


def test_test_time_modes():
    torch.manual_seed(4)
    a, h = torch.randn(3, L, D), torch.randn(3, N_HID)
    soft = SoftAttention(D, N_HID, 8)
    for mode in HardAttention.TEST_MODES:
        att = _module(test_mode=mode)
        att.load_state_dict(soft.state_dict())
        att.eval()
        out = att(a, att.prepare(a), h)
        ref = soft(a, soft.prepare(a), h)
        torch.testing.assert_close(out.alpha, ref.alpha)
        if mode == "expectation":
            torch.testing.assert_close(out.context, ref.context)
        elif mode == "argmax":
            torch.testing.assert_close(out.context, a[torch.arange(3), ref.alpha.argmax(1)])
        else:
            assert out.index is not None and torch.equal(out.context, a[torch.arange(3), out.index])
    with pytest.raises(ValueError, match="test_mode"):
        _module(test_mode="mean")


def test_minibatch_coin():
    torch.manual_seed(5)
    always = _module(expected_context_prob=0.0)
    never = _module(expected_context_prob=1.0)
    half = _module(expected_context_prob=0.5)
    draws = []
    for _ in range(400):
        always.begin_batch(), never.begin_batch(), half.begin_batch()
        assert always.sample_this_batch and not never.sample_this_batch
        draws.append(half.sample_this_batch)
    assert 0.4 < sum(draws) / 400 < 0.6


def test_hard_attention_loss_terms():
    torch.manual_seed(6)
    logits, targets = torch.randn(3, 4, 7, requires_grad=True), torch.tensor([[5, 6, 2, 0], [4, 2, 0, 0], [6, 6, 5, 2]])
    alphas = torch.softmax(torch.randn(3, 4, 5), -1)
    base = caption_loss(logits, targets, alphas, pad_id=0)
    b = MovingAverageBaseline(0.9)
    same = hard_attention_loss(logits, targets, alphas, None, None, 0, b)
    torch.testing.assert_close(same.total, base.total)
    assert b.value is None  # no sampled batch, no baseline update
    theta = torch.zeros(3, 4, requires_grad=True)
    log_probs, entropies = theta - 1.0, theta + 2.0
    terms = hard_attention_loss(logits, targets, alphas, log_probs, entropies, 0, b, reward_weight=0.5, entropy_weight=0.1)
    step_mask = (targets != 0).float()
    seq_ll = -torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none", ignore_index=0).sum(1)
    # First sampled batch: the baseline is the batch mean, then it is updated to it.
    adv = seq_ll - seq_ll.mean()
    expected_policy = -(adv.detach() * ((log_probs * step_mask).sum(1))).mean()
    torch.testing.assert_close(terms.policy, expected_policy)
    torch.testing.assert_close(terms.entropy, ((entropies * step_mask).sum(1)).mean())
    torch.testing.assert_close(terms.total, base.total + 0.5 * expected_policy - 0.1 * terms.entropy)
    assert b.value == pytest.approx(seq_ll.mean().item())


def _hard_batch():
    torch.manual_seed(6)
    logits = torch.randn(3, 4, 7, requires_grad=True)
    targets = torch.tensor([[5, 6, 2, 0], [4, 2, 0, 0], [6, 6, 5, 2]])  # 3, 2 and 4 real steps
    alphas = torch.softmax(torch.randn(3, 4, 5), -1).requires_grad_()
    return logits, targets, alphas


def test_token_mean_reward_and_summed_reduction():
    logits, targets, alphas = _hard_batch()
    theta = torch.zeros(3, 4, requires_grad=True)
    log_probs, entropies = theta - 1.0, theta + 2.0
    b = MovingAverageBaseline(0.9)
    b.value = -1.0
    terms = hard_attention_loss(logits, targets, alphas, log_probs, entropies, 0, b, attention_weight=0.0,
                                reward_weight=0.5, entropy_weight=0.1, reward="token_mean", reduction="sum")
    step_mask = (targets != 0).float()
    seq_ll = -torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none", ignore_index=0).sum(1)
    rewards = seq_ll / torch.tensor([3.0, 2.0, 4.0])  # each caption's own steps (words + <end>), not the padded 4
    policy = -((rewards - -1.0).detach() * (log_probs * step_mask).sum(1)).mean()
    torch.testing.assert_close(terms.policy, policy)  # reported per caption, whatever the reduction
    entropy = (entropies * step_mask).sum(1).mean()
    torch.testing.assert_close(terms.total, terms.nll + 3 * (0.5 * policy - 0.1 * entropy))  # summed: N x mean
    assert b.value == pytest.approx(0.9 * -1.0 + 0.1 * rewards.mean().item())


def test_expected_context_batches_of_hard_attention():
    logits, targets, alphas = _hard_batch()
    b = MovingAverageBaseline(0.9)
    base = caption_loss(logits, targets, alphas, pad_id=0, attention_weight=1.0)
    # Default: an expected-context minibatch of hard attention gets the soft loss and leaves the baseline alone.
    plain = hard_attention_loss(logits, targets, alphas, None, None, 0, b, 1.0, 0.1, 0.002, samples_regions=True)
    torch.testing.assert_close(plain.total, base.total)
    assert b.value is None and plain.entropy is None
    # every_batch: the entropy of the alphas it computed, and the baseline update; doubly_stochastic_term=False
    # leaves lambda's term out.
    terms = hard_attention_loss(logits, targets, alphas, None, None, 0, b, 1.0, 0.1, 0.002, samples_regions=True,
                                every_batch=True, doubly_stochastic_term=False)
    h = -(alphas * alphas.log()).sum(-1)  # (N, T)
    entropy = (h * (targets != 0)).sum(1).mean()
    torch.testing.assert_close(terms.entropy, entropy)
    torch.testing.assert_close(terms.total, base.nll - 0.002 * entropy)
    assert terms.policy is None and terms.attention_reg.item() == 0 and b.value == pytest.approx(-base.nll.item())
    # A soft model is never touched by these options.
    soft = hard_attention_loss(logits, targets, alphas, None, None, 0, MovingAverageBaseline(), 1.0, 0.1, 0.002,
                               samples_regions=False, every_batch=True, doubly_stochastic_term=False)
    torch.testing.assert_close(soft.total, base.total)


def test_unknown_normalisation_is_refused():
    logits, targets, alphas = _hard_batch()
    with pytest.raises(ValueError, match="reward must be one of"):
        hard_attention_loss(logits, targets, alphas, None, None, 0, MovingAverageBaseline(), reward="mean_padded")
    with pytest.raises(ValueError, match="reduction must be one of"):
        hard_attention_loss(logits, targets, alphas, None, None, 0, MovingAverageBaseline(), reduction="avg")
