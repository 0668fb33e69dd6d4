"""The zoo's LSTM decoders (Show and Tell, Att2in/Att2all, adaptive attention, AoA): each model's defining property, by
hand where the paper gives a formula. What every decoder must hold (shapes, gradients, packed teacher forcing equals
the plain loop, beam 1 is greedy, a tiny model overfits, export) is tests/models/test_decoders.py's and
tests/export/test_export.py's, which take these decoders from the registry."""

from __future__ import annotations

import pytest
import torch
from family import GRID, build, data
from hydra import compose, initialize_config_dir

from captioning.models.attention import SoftAttention
from captioning.models.decoders.unroll import PlainStep
from captioning.models.decoding import beam_search, greedy_decode
from captioning.runtime import CONF_DIR


def zero_mean_noise(a: torch.Tensor, mask: torch.Tensor, seed: int = 3) -> torch.Tensor:
    """Noise (B, L, D) on the real regions that sums to 0 over each image's real regions (0 on padding)."""
    noise = torch.randn(a.shape, generator=torch.Generator().manual_seed(seed), dtype=a.dtype)
    m = mask.unsqueeze(-1).to(a.dtype)  # (B, L, 1)
    noise = noise * m
    return (noise - noise.sum(1, keepdim=True) / m.sum(1, keepdim=True)) * m


def test_show_and_tell_sees_only_the_mean_so_rearranged_regions_give_the_same_caption():
    dec = build("fc", "mean").double().eval()
    a, mask, _ = data(B=3)
    perm = torch.randperm(a.shape[1], generator=torch.Generator().manual_seed(2))
    moved = a[:, perm] + zero_mean_noise(a[:, perm], mask[:, perm])  # other regions, the same mean
    with torch.no_grad():
        before = greedy_decode(dec, a, 8, mask=mask, grid=GRID)
        after = greedy_decode(dec, moved, 8, mask=mask[:, perm], grid=GRID)
        beam = beam_search(dec, moved, 3, 8, mask=mask[:, perm], grid=GRID)
    assert after.tokens == before.tokens and beam.tokens == beam_search(dec, a, 3, 8, mask=mask, grid=GRID).tokens
    torch.testing.assert_close(after.scores, before.scores, atol=1e-12, rtol=0)
    # its maps are attention=mean's: uniform over each image's real regions
    real = mask.sum(1).to(a.dtype)
    for alphas, m, n in zip(before.alphas, mask, real):
        torch.testing.assert_close(alphas, (m.to(a.dtype) / n).expand_as(alphas), atol=1e-15, rtol=0)


def test_the_decoders_without_a_default_attention_select_the_one_they_take():
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        assert compose("train", overrides=["decoder=fc"]).attention._target_ == "mean"
        assert compose("train", overrides=["decoder=adaptive"]).attention._target_ == "soft"
        assert compose("train", overrides=["decoder=aoa"]).attention._target_ == "multihead"  # the paper's f_att


@pytest.mark.parametrize(("kind", "into_gates"), [("att2in", False), ("att2all", True)])
def test_att2in_feeds_the_context_to_the_cell_input_only_and_att2all_to_every_gate(kind, into_gates):
    dec = build(kind, "soft")
    n, g = dec.hidden_dim, torch.Generator().manual_seed(4)
    words, h = torch.randn(5, 5 * n, generator=g, dtype=torch.float64), torch.randn(5, n, generator=g).double()
    context = torch.randn(5, dec.W_I.in_features, generator=g, dtype=torch.float64, requires_grad=True)
    pre = dec.double().pre_activations(words, h, context, PlainStep({}))  # (5, 5n): [i; f; o; z_1; z_2]
    gates = torch.autograd.grad(pre[:, : 3 * n].sum(), context, retain_graph=True)[0]
    cell = torch.autograd.grad(pre[:, 3 * n:].sum(), context)[0]
    assert cell.abs().min() > 0
    assert (gates.abs().min() > 0) if into_gates else torch.equal(gates, torch.zeros_like(gates))


def test_att2in_step_is_the_papers_equations_by_hand():
    dec = build("att2in", "soft").double().eval()
    a, mask, captions = data(B=2, k=1)
    keys = dec.attention.prepare(a, GRID, mask)
    n, g = dec.hidden_dim, torch.Generator().manual_seed(6)
    h, c = torch.randn(2, n, generator=g).double(), torch.randn(2, n, generator=g).double()
    state = (h, c, torch.zeros(2, a.shape[1], dtype=a.dtype))
    with torch.no_grad():
        logits, (h_t, c_t, _), att = dec.step(captions[:, 1], state, a, keys, mask)
        soft = dec.attention
        e = soft.w(torch.tanh(soft.W_a(a) + soft.W_h(h).unsqueeze(1))).squeeze(-1).masked_fill(~mask, -torch.inf)
        alpha = torch.softmax(e, 1)
        context = (alpha.unsqueeze(-1) * a).sum(1)  # I_t
        pre = dec.W_x(dec.embed(captions[:, 1])) + h @ dec.W_h.weight.T  # (2, 5n)
        i, f, o = torch.sigmoid(pre[:, : 3 * n]).chunk(3, 1)
        z1, z2 = (pre[:, 3 * n:] + context @ dec.W_I.weight.T).chunk(2, 1)
        c_hand = f * c + i * torch.maximum(z1, z2)
        h_hand = o * torch.tanh(c_hand)
    torch.testing.assert_close(att.alpha, alpha, atol=1e-12, rtol=0)
    torch.testing.assert_close(c_t, c_hand, atol=1e-12, rtol=0)
    torch.testing.assert_close(h_t, h_hand, atol=1e-12, rtol=0)
    torch.testing.assert_close(logits, dec.W_o(h_hand), atol=1e-12, rtol=0)


def adaptive_by_hand(dec, a, mask, words, h, m, beta_zero: bool = False):
    """Lu et al.'s equations written out: logits, alpha^ over [regions; sentinel] (B, L + 1)."""
    soft = dec.attention.inner
    x = torch.cat([dec.embed(words), torch.relu(dec.W_b((a * mask.unsqueeze(-1)).sum(1) / mask.sum(1, True)))], 1)
    h_t, m_t = dec.lstm(x, (h, m))
    s = torch.sigmoid(dec.W_x(x) + h @ dec.W_hs.weight.T) * torch.tanh(m_t)
    v = torch.relu(dec.attention.transform.W(a))  # (B, L, n)
    z = soft.w(torch.tanh(soft.W_a(v) + soft.W_h(h_t).unsqueeze(1))).squeeze(-1).masked_fill(~mask, -torch.inf)
    z_s = soft.w(torch.tanh(dec.W_s(s) + soft.W_h(h_t)))  # (B, 1)
    hat = torch.softmax(torch.cat([z, -torch.inf * torch.ones_like(z_s) if beta_zero else z_s], 1), 1)
    c_hat = hat[:, -1:] * s + (hat[:, :-1].unsqueeze(-1) * v).sum(1)
    return dec.W_p(c_hat + h_t), hat


@pytest.mark.parametrize("beta_zero", [False, True])
def test_adaptive_attention_is_lu_et_al_by_hand_and_soft_attention_without_the_sentinel(beta_zero, monkeypatch):
    dec = build("adaptive", "soft").double().eval()
    a, mask, captions = data(B=2, k=1)
    n, g = dec.hidden_dim, torch.Generator().manual_seed(7)
    h, m = torch.randn(2, n, generator=g).double(), torch.randn(2, n, generator=g).double()
    if beta_zero:  # the sentinel's gate forced shut: the spatial attention alone, soft attention over V from h_t
        monkeypatch.setattr(dec, "sentinel_weight", lambda s, h_t, lse: torch.zeros_like(lse))
    with torch.no_grad():
        logits, _, att = dec.step(captions[:, 1], (h, m), a, dec.attention.prepare(a, GRID, mask), mask)
        want, hat = adaptive_by_hand(dec, a, mask, captions[:, 1], h, m, beta_zero)
    beta = hat[:, -1:]
    torch.testing.assert_close(logits, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(att.channels, beta, atol=1e-12, rtol=0)  # beta_t, the sentinel's weight
    # the maps are the spatial attention alpha_t = softmax(z_t): alpha^ on the regions over (1 - beta_t)
    torch.testing.assert_close(att.alpha * (1 - beta), hat[:, :-1], atol=1e-12, rtol=0)
    torch.testing.assert_close(att.alpha.sum(1), torch.ones(2, dtype=a.dtype), atol=1e-12, rtol=0)
    assert not att.alpha[~mask].any()
    if beta_zero:
        assert not beta.any()
    else:
        assert ((beta > 0) & (beta < 1)).all()


def test_without_the_sentinel_it_is_lu_et_al_spatial_attention_model():
    """sentinel=false, Lu et al.'s ablation: the by-hand step with beta_t = 0, no sentinel parameters, no weight."""
    dec = build("adaptive-spatial", "soft").double().eval()
    full = build("adaptive", "soft").double().eval()
    assert {n for n, _ in full.named_parameters()} - {n for n, _ in dec.named_parameters()} == {
        "W_x.weight", "W_x.bias", "W_hs.weight", "W_s.weight"}
    dec.load_state_dict(full.state_dict(), strict=False)  # the shared weights, so the by-hand helper can read W_s
    a, mask, captions = data(B=2, k=1)
    n, g = dec.hidden_dim, torch.Generator().manual_seed(7)
    h, m = torch.randn(2, n, generator=g).double(), torch.randn(2, n, generator=g).double()
    with torch.no_grad():
        logits, _, att = dec.step(captions[:, 1], (h, m), a, dec.attention.prepare(a, GRID, mask), mask)
        want, hat = adaptive_by_hand(full, a, mask, captions[:, 1], h, m, beta_zero=True)
        greedy = greedy_decode(dec, a, 8, mask=mask, grid=GRID)
    torch.testing.assert_close(logits, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(att.alpha, hat[:, :-1], atol=1e-12, rtol=0)
    assert att.channels is None and greedy.channels is None and dec.extra_weights == "channels"


def test_the_sentinel_weight_of_each_word_is_decoded_with_its_map():
    dec = build("adaptive", "soft").double().eval()
    a, mask, _ = data(B=3)
    with torch.no_grad():
        greedy = greedy_decode(dec, a, 8, mask=mask, grid=GRID)
        beam1 = beam_search(dec, a, 1, 8, mask=mask, grid=GRID)
        beam3 = beam_search(dec, a, 3, 8, mask=mask, grid=GRID, n_best=2)
    assert dec.extra_weights == "sentinel"
    for decoded in (greedy, beam1, beam3):
        assert decoded.channels is not None
        for tokens, alphas, beta in zip(decoded.tokens, decoded.alphas, decoded.channels):
            assert beta.shape == (len(tokens), 1) and alphas.shape == (len(tokens), a.shape[1])
            assert ((beta > 0) & (beta < 1)).all()
    for x, y in zip(greedy.channels or [], beam1.channels or []):
        torch.testing.assert_close(x, y, atol=1e-12, rtol=0)


def test_adaptive_attention_takes_soft_attention_only():
    with pytest.raises(ValueError, match=r"decoder=adaptive .* takes attention=soft, not attention=dot$"):
        build("adaptive", "dot")
    assert type(build("adaptive", "soft").attention.inner) is SoftAttention


def test_aoa_with_its_gate_open_is_the_attention_plus_the_information_term():
    dec = build("aoa", "multihead").double().eval()
    a, mask, captions = data(B=2, k=1)
    n, g = dec.hidden_dim, torch.Generator().manual_seed(8)
    h, c, ctx = (torch.randn(2, n, generator=g).double() for _ in range(3))
    with torch.no_grad():
        dec.aoa.W_g.weight.zero_()
        dec.aoa.W_g.bias.fill_(1e4)  # sigmoid(1e4) = 1 in float64: the gate forced open
        keys = dec.attention.prepare(a, GRID, mask)
        logits, (h_t, c_t, ctx_t, _), att = dec.step(captions[:, 1], (h, c, ctx, mask.double()), a, keys, mask)
        refined, inner_keys = dec.attention.split(keys)
        mean = (refined * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        h_hand, c_hand = dec.lstm(torch.cat([dec.embed(captions[:, 1]), mean + ctx], 1), (h, c))
        f = dec.attention.inner(refined, inner_keys, h_hand, mask).context  # plain multi-head attention
        info = dec.aoa.W_i(torch.cat([f, h_hand], 1))
    torch.testing.assert_close(h_t, h_hand, atol=1e-12, rtol=0)
    torch.testing.assert_close(ctx_t, info, atol=1e-12, rtol=0)
    torch.testing.assert_close(logits, dec.W_p(info), atol=1e-12, rtol=0)
    assert not att.alpha[~mask].any()


def test_aoa_is_the_gate_times_the_information_vector_and_its_refiner_ignores_padding():
    dec = build("aoa", "multihead").double().eval()
    g = torch.Generator().manual_seed(9)
    f, q = torch.randn(4, dec.hidden_dim, generator=g).double(), torch.randn(4, dec.hidden_dim, generator=g).double()
    x = torch.cat([f, q], 1)
    want = torch.sigmoid(x @ dec.aoa.W_g.weight.T + dec.aoa.W_g.bias) * (x @ dec.aoa.W_i.weight.T + dec.aoa.W_i.bias)
    torch.testing.assert_close(dec.aoa(f, q), want, atol=1e-12, rtol=0)
    a, mask, _ = data(B=3)
    other = a.clone()
    other[~mask] = 5.0  # what lies in the padded regions
    with torch.no_grad():
        refined = dec.attention.split(dec.attention.prepare(a, GRID, mask))[0]
        moved = dec.attention.split(dec.attention.prepare(other, GRID, mask))[0]
    torch.testing.assert_close(refined[mask], moved[mask], atol=1e-12, rtol=0)


M2_SIZES = {"d_model": 8, "num_layers": 2, "num_heads": 2, "ff_dim": 12, "encoder_layers": 2}


def test_m2_without_memory_slots_or_mesh_is_the_transformer_weight_for_weight():
    transformer = build("transformer", "multihead", **M2_SIZES).double().eval()
    m2 = build("m2", "multihead", memory_slots=0, mesh=False, **M2_SIZES).double().eval()
    m2.load_state_dict(transformer.state_dict())  # strict: the same parameters
    a, mask, captions = data(B=3)
    index = torch.arange(3).repeat_interleave(2)
    with torch.no_grad():
        want, got = transformer(a, captions, index, mask, GRID), m2(a, captions, index, mask, GRID)
        decoded = [beam_search(dec, a, 3, 8, mask=mask, grid=GRID) for dec in (transformer, m2)]
    torch.testing.assert_close(got.logits, want.logits, atol=0, rtol=0)
    torch.testing.assert_close(got.alphas, want.alphas, atol=0, rtol=0)
    assert decoded[0].tokens == decoded[1].tokens
    # and the full M2 is another model: slots and gates change the logits
    full = build("m2", "multihead", memory_slots=3, **M2_SIZES).double().eval()
    assert set(full.state_dict()) > set(transformer.state_dict())
    assert any(k.endswith("m_k") for k in full.state_dict()) and any("mesh_gates" in k for k in full.state_dict())


def test_m2_padded_regions_get_no_weight_and_the_slots_get_some():
    m2 = build("m2", "multihead", memory_slots=3, **M2_SIZES).double()
    a, mask, captions = data(B=3)
    other = a.clone()
    other[~mask] = 7.0  # what lies in the padded regions
    index = torch.arange(3).repeat_interleave(2)
    m2.train()  # dropout 0 (the family's build): training only records the slots' share
    with torch.no_grad():
        out = m2(a, captions, index, mask, GRID)
        share = m2.stats()["memory_share"]
        moved = m2(other, captions, index, mask, GRID)
        layer = m2.attention.encoder[0].self_attn
        x = m2.attention.embed(a)
        q, k, _ = layer._split(x)
        weights = layer.weights(q, k, mask)  # (B, H, L, L + m)
    torch.testing.assert_close(moved.logits, out.logits, atol=1e-12, rtol=0)
    assert not out.alphas[(~mask)[index].unsqueeze(1).expand_as(out.alphas)].any()
    assert not weights[..., : a.shape[1]][(~mask)[:, None, None, :].expand(-1, 2, a.shape[1], -1)].any()
    assert 0 < share < 1 and torch.allclose(weights.sum(-1), torch.ones((), dtype=a.dtype))


def test_m2_mesh_is_the_gated_sum_over_encoder_layers_by_hand():
    m2 = build("m2", "multihead", memory_slots=3, **M2_SIZES).double().eval()
    a, mask, _ = data(B=2, k=1)
    keys = m2.attention.prepare(a, GRID, mask)
    parts = m2.attention.split(keys)
    q = torch.randn(2, 8, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    with torch.no_grad():
        got = m2._attend(1, parts, mask)(q)
        cross, width = m2.attention.layer(1), 1 + len(m2.layers)
        outs = [cross(parts[j * width], parts[j * width + 2], q, mask, None) for j in range(2)]
        gates = [torch.sigmoid(m2.mesh_gates[1][j](torch.cat([q, o.context], 1))) for j, o in enumerate(outs)]
    want = (gates[0] * outs[0].context + gates[1] * outs[1].context) / 2 ** 0.5
    torch.testing.assert_close(got.context, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(got.alpha.sum(1), torch.ones(2, dtype=a.dtype), atol=1e-12, rtol=0)
    assert m2.attention.levels == 2 and len(parts) == 2 * width
