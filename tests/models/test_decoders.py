"""The decoder family, every registered decoder x every attention (timm's manner): what each must hold.

A decoder registered in captioning/factory/registry.py is picked up here with no edit: its conf/decoder/ YAML is
built at test sizes (`SIZES` shrinks the known ones) with every conf/attention/ choice; a pair the decoder refuses
must say why in one line (`test_a_refused_attention_says_why_in_one_line`). For each pair:

- the outputs' shapes; alphas sum to 1 over the valid regions at every real step (0 on padded regions);
- every parameter entry that can change the loss gets a gradient (`fixtures.assert_every_parameter_learns`);
- packed teacher forcing (real tokens only, images dropping out, running captions gathered or not, shared or
  irregular image rows) equals the plain step-by-step loop in float64 to 1e-9: logits, maps, gates, every gradient;
- the plain kernels (what a GPU runs) compute what the fused CPU kernels compute, in training and beam search;
- beam search with beam 1 is greedy decoding; shared image rows decode as copied ones;

and per decoder: a tiny model overfits one batch. The export round trip of every pair is
tests/export/test_export.py's matrix (it reads the same conf/ groups).
"""

from __future__ import annotations

import functools

import pytest
import torch
from family import (
    ATTENTION_VARIANTS,
    ATTENTIONS,
    DECODERS,
    GRID,
    INDEXES,
    PAIRS,
    REFUSED,
    V,
    assert_same,
    build,
    data,
    loss,
    ragged,
    refusal,
    run,
)
from fixtures import assert_every_parameter_learns
from omegaconf import OmegaConf
from rounding_noise import across_computations

from captioning.factory import registry
from captioning.models import packing
from captioning.models.decoding import beam_search, greedy_decode
from captioning.models.fused import additive as fused_additive
from captioning.models.fused import plain_kernels
from captioning.runtime import CONF_DIR
from captioning.training.losses import caption_loss


def test_every_registered_decoder_and_attention_is_here():
    assert set(registry.DECODERS) <= set(DECODERS)
    named = {OmegaConf.load(CONF_DIR / "attention" / f"{a}.yaml")["_target_"] for a in ATTENTIONS
             if a not in ATTENTION_VARIANTS}
    assert named == set(registry.ATTENTIONS)
    assert {p.values[0] for p in PAIRS} == set(DECODERS)  # each takes some attention


@pytest.mark.parametrize(("kind", "attention"), REFUSED)
def test_a_refused_attention_says_why_in_one_line(kind, attention):
    message = refusal(kind, attention)
    assert message and "\n" not in message and ATTENTION_VARIANTS.get(attention, (attention,))[0] in message, message


@pytest.mark.parametrize(("kind", "attention"), PAIRS)
def test_shapes_maps_and_every_parameter_learns(kind, attention):
    dec = build(kind, attention).double().train()
    a, mask, captions = data()
    captions, lengths = ragged(captions, [3, 6, 1, 2, 5, 4])
    if attention == "hard":
        mask = None  # H(alpha)'s gradient at a padded region's alpha = 0 is NaN (x log x at 0)
    out = dec(a, captions, INDEXES["k=2"], mask=mask, grid=GRID, lengths=lengths)
    N, T, L, R = 6, 6, a.shape[1], int(lengths.sum())
    assert out.logits.shape == (R, V) and out.alphas.shape == (N, T, L) and out.betas.shape == (N, T)
    real = (captions[:, 1:] != 0).double()
    if getattr(dec.attention, "sums_to_one", True):
        torch.testing.assert_close(out.alphas.sum(-1), real)  # 1 at real steps, 0 after each end
    else:  # monotonic: at most 1 (the rest is the scan running off the end), 0 after each end
        assert (out.alphas >= 0).all() and (out.alphas.sum(-1) <= real + 1e-12).all()
        assert (out.alphas.sum(-1) > 0).any()
    if mask is not None:
        assert not out.alphas[:2][..., ~mask[0]].any()  # image 0's padded regions: exactly 0
    loss(out, captions).backward()
    assert_every_parameter_learns(dec)


@pytest.mark.parametrize(("kind", "attention"), PAIRS)
def test_packed_teacher_forcing_is_the_plain_loop(kind, attention, monkeypatch):
    """Real tokens only (running captions always gathered; never), shared and irregular image rows, no lengths
    with dropout: logits, maps, gates and every gradient are the plain loop's, in float64."""
    a, mask, captions = data()
    for index, lengths, gather_below, dropout in (("irregular", [4, 6, 2, 2, 1, 5], 2.0, 0.0),
                                                  ("k=2", [3, 6, 1, 2, 5, 4], 0.0, 0.0),
                                                  ("k=2", None, packing.GATHER_BELOW, 0.3)):
        monkeypatch.setattr(packing, "GATHER_BELOW", gather_below)
        dec = build(kind, attention, dropout).double().train()
        cut, real = captions, None
        if lengths is not None:
            cut, lengths_t = ragged(captions, lengths)
            real = cut[:, 1:] != 0
        module = getattr(dec.attention, "inner", dec.attention)  # aoa, adaptive: the attention over their V
        if attention == "hard":  # sampled regions draw alike only when the same rows run
            module.sample_this_batch = lengths is None
            mask = None
        if attention == "monotonic":  # its training noise is drawn for the rows that run, which differ
            module.sigmoid_noise = 0.0
        if kind in ("transformer", "m2") and dropout > 0:
            dec.eval()  # its parallel and step-by-step paths draw dropout masks in other shapes
        fast_fn = dec if lengths is None else functools.partial(dec, lengths=lengths_t)
        fast, fast_grads = run(dec, fast_fn, a, cut, INDEXES[index], mask)
        plain, plain_grads = run(dec, dec.forward_plain, a, cut, INDEXES[index], mask)
        assert_same(fast, fast_grads, plain, plain_grads, real)


@pytest.mark.parametrize(("kind", "attention"), PAIRS)
def test_plain_kernels_compute_what_the_fused_kernels_compute(kind, attention, monkeypatch):
    """`plain_kernels(model)` runs what a GPU runs (one chunk for the additive score, torch's tanh) on the CPU: its
    teacher forcing (logits, loss, every gradient, real words only) and its beam search equal the fused kernels',
    with chunks small enough that those take several. Another model keeps its kernels meanwhile."""
    monkeypatch.setattr(fused_additive, "_CHUNK_ELEMENTS", 2 * 2 * 20 * 8)  # two images x k = 2 rows per chunk
    a, mask, captions = data(B=5, dtype=torch.float32)
    captions, lengths = ragged(captions, [3, 6, 1, 2, 5, 4, 6, 2, 3, 3])
    index = torch.arange(5).repeat_interleave(2)
    if attention == "hard":
        mask = None
    results = {}
    for plain in (False, True):
        dec = build(kind, attention).train()
        if attention == "hard":
            dec.attention.sample_this_batch = False
        other = build(kind, attention)
        with plain_kernels(dec) if plain else torch.enable_grad():
            assert all(getattr(m, "plain_kernels", plain) == plain for m in dec.modules())
            assert not any(getattr(m, "plain_kernels", False) for m in other.modules())
            out, grads = run(dec, functools.partial(dec, lengths=lengths), a, captions, index, mask)
            beams = beam_search(dec.eval(), a, 3, 8, mask=mask, grid=GRID)
        assert not any(getattr(m, "plain_kernels", False) for m in dec.modules())  # restored
        results[plain] = out, grads, beams
    (out_c, grads_c, beams_c), (out_g, grads_g, beams_g) = results[False], results[True]
    assert_same(out_g, grads_g, out_c, grads_c, atol=1e-5, rtol=1e-4)
    assert beams_g.tokens == beams_c.tokens
    torch.testing.assert_close(beams_g.scores, beams_c.scores, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("kind", "attention"), PAIRS)
def test_beam_one_is_greedy_and_shared_rows_decode_as_copies(kind, attention):
    dec = build(kind, attention).double().eval()
    if attention == "hard":
        dec.attention.test_mode = "argmax"
    a, mask, _ = data(B=3)
    with torch.no_grad():
        greedy = greedy_decode(dec, a, 8, mask=mask, grid=GRID)
        beam1 = beam_search(dec, a, 1, 8, mask=mask, grid=GRID)
        beam3 = beam_search(dec, a, 3, 8, mask=mask, grid=GRID)
        dec.rows_share_images = False  # every beam its own copy of a, keys and mask
        copied = beam_search(dec, a, 3, 8, mask=mask, grid=GRID)
    assert beam1.tokens == greedy.tokens
    torch.testing.assert_close(beam1.scores, greedy.scores, atol=1e-12, rtol=0)
    for x, y in zip(beam1.alphas, greedy.alphas):
        torch.testing.assert_close(x, y, atol=1e-12, rtol=0)
    assert copied.tokens == beam3.tokens
    torch.testing.assert_close(copied.scores, beam3.scores, atol=across_computations(1e-12), rtol=0)


@pytest.mark.parametrize("kind", DECODERS)
def test_a_tiny_decoder_overfits_one_batch(kind):
    """Soft attention (the transformer: its multi-head cross-attention; Show and Tell: none, attention=mean), Adam:
    the loss per caption falls from about 9 below 0.1."""
    attention = {"transformer": "multihead", "m2": "multihead", "fc": "mean"}.get(kind, "soft")
    dec = build(kind, attention, hidden_dim=32, embed_dim=16, d_model=16)
    dec.train()
    a, mask, captions = data(B=6, k=1, dtype=torch.float32)  # one caption per image: each can be told apart
    captions, lengths = ragged(captions, [3, 6, 1, 2, 5, 4])
    opt = torch.optim.Adam(dec.parameters(), lr=3e-2)
    first = None
    for _ in range(60):
        opt.zero_grad()
        out = dec(a, captions, mask=mask, grid=GRID, lengths=lengths)
        nll = caption_loss(out.logits, captions[:, 1:], out.alphas, pad_id=0).nll
        nll.backward()
        opt.step()
        first = float(nll.detach()) if first is None else first
    last = float(nll.detach())
    assert first > 5 and last < 0.1, (first, last)
