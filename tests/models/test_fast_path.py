"""The fast paths beyond what every decoder is checked for (tests/models/test_decoders.py): bf16 casts, hard
attention's draws over real steps, the step plan, freed graphs, the fused additive score and its chunks, shared
image rows in attention, decoding and sampling that drop finished images, and the FLOP count the benchmark
divides by."""

from __future__ import annotations

import functools

import pytest
import torch
from family import ATTENTIONS, GRID, INDEXES, D, V, assert_same, build, data, loss, ragged, run
from torch.utils.flop_counter import FlopCounterMode

from captioning.models import packing
from captioning.models.attention import SoftAttention, additive_scores
from captioning.models.decoders.sat import ShowAttendTellDecoder
from captioning.models.decoding import beam_search, greedy_decode
from captioning.models.flops import DecoderSizes, decoding_flops, teacher_forcing_flops
from captioning.models.fused import additive as fused_additive
from captioning.models.packing import StepPlan, prefix_lengths
from captioning.training.losses import caption_loss
from captioning.training.scst.sampling import sample_captions

NAMES = ATTENTIONS  # soft, hard, dot, general, concat, local, location, multihead
DECODERS = ["sat", "luong", "luong-no-feeding", "updown"]  # the recurrent ones
OUTPUT_LAYER = {"sat": "L_o", "updown": "W_p"}  # each decoder's vocabulary projection (Luong's: W_s)


RAGGED = {"none": [6, 2, 5], "k=2": [3, 6, 1, 2, 5, 4], "irregular": [4, 6, 2, 2, 1, 5], "k=2 equal": [4, 4, 2, 2, 6, 6]}


class _CastsOf(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts dtype conversions of tensors of one shape (any number of rows: a step's a[:b] too)."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.count = tuple(shape[1:]), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and tuple(args[0].shape[1:]) == self.shape:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["sat", "luong", "updown"])
@pytest.mark.parametrize("name", ["soft", "dot", "multihead"])
def test_bf16_casts_the_annotations_once_not_at_every_step(kind, name):
    dec = build(kind, name).train()
    a, mask, captions = data(dtype=torch.float32)
    captions, lengths = ragged(captions, RAGGED["k=2"])
    with torch.autocast("cpu", dtype=torch.bfloat16), _CastsOf(a.shape) as casts:
        out = dec(a, captions, INDEXES["k=2"], mask, GRID, lengths)
    # attention.prepare's linears (multi-head: keys and values) and one cast for all 6 steps
    assert casts.count <= 3 and out.logits.dtype == torch.bfloat16, casts.count
    with _CastsOf(a.shape) as casts:  # float32: no cast at all
        dec(a, captions, INDEXES["k=2"], mask, GRID, lengths)
    assert casts.count == 0


def test_hard_attention_samples_regions_for_real_steps_only():
    dec = build("sat", "hard").double().train()
    a, _, captions = data()
    captions, lengths = ragged(captions, RAGGED["k=2"])
    dec.attention.sample_this_batch = True
    out, grads = run(dec, functools.partial(dec, lengths=lengths), a, captions, INDEXES["k=2"], None)
    real = captions[:, 1:] != 0
    assert out.log_probs is not None and out.entropies is not None
    assert torch.all(out.log_probs[~real] == 0) and torch.all(out.log_probs[real] < 0)
    assert torch.all(out.entropies[~real] == 0) and torch.all(out.entropies[real] > 0)
    torch.testing.assert_close(out.alphas.sum(-1), real.double())  # alphas sum to 1 at real steps, 0 after
    assert grads and all(torch.isfinite(g).all() for g in grads.values())


def test_lengths_that_fill_the_batch_give_the_dense_result():
    dec = build("sat", "soft").double().eval()
    a, mask, captions = data()
    captions = captions.clone()
    captions[0, 4:] = 5  # no padding at all
    lengths = torch.full((captions.shape[0],), captions.shape[1] - 1)
    with torch.no_grad():
        dense = dec(a, captions, INDEXES["k=2"], mask, GRID)
        packed = dec(a, captions, INDEXES["k=2"], mask, GRID, lengths=lengths)
    assert torch.equal(packed.logits, dense.logits.reshape(-1, V))
    assert torch.equal(packed.alphas, dense.alphas)


@pytest.mark.parametrize(("gather_below", "counts"), [(2.0, [6, 5, 4, 3, 1]), (0.75, [6, 6, 4, 4, 1]),
                                                     (0.0, [6, 6, 6, 4, 2])])
def test_step_plan_runs_each_caption_for_its_own_steps(gather_below, counts, monkeypatch):
    """Rows computed per step: the running captions (always gathered), all rows of the running images (never), or
    the default's mix; every real token is computed once and gathered caption by caption."""
    monkeypatch.setattr(packing, "GATHER_BELOW", gather_below)
    lengths = torch.tensor([2, 5, 1, 3, 4, 4])  # image 0: 2, 5; image 1: 1, 3; image 2: 4, 4
    plan = StepPlan.of(lengths, 3, 2, 7)
    assert plan.steps == 5 and plan.counts == counts and plan.images == [3, 3, 3, 2, 1]
    assert plan.image_order is not None and plan.image_order.tolist() == [0, 2, 1]  # longest caption first
    assert plan.packed_flat is not None and plan.row_major is not None and plan.real_flat is not None
    tokens = [r * 7 + t for r, n in enumerate(lengths.tolist()) for t in range(n)]  # every real token, in order
    assert plan.packed_flat[plan.row_major].tolist() == plan.real_flat.tolist() == tokens
    with pytest.raises(ValueError, match="one per caption"):
        StepPlan.of(lengths[:5], 3, 2, 7)
    with pytest.raises(ValueError, match=r"lie in \[0, 4\]"):
        StepPlan.of(lengths, 3, 2, 4)
    assert prefix_lengths(torch.tensor([[4, 0, 5]]), 0) is None  # a pad before a word: only the masked path is right


@pytest.mark.parametrize("kind", DECODERS)
def test_float32_and_eval_mode(kind):
    dec = build(kind, "soft").train()
    a, mask, captions = data(dtype=torch.float32)
    fast, fast_grads = run(dec, dec, a, captions, INDEXES["k=2"], mask)
    plain, plain_grads = run(dec, dec.forward_plain, a, captions, INDEXES["k=2"], mask)
    assert_same(fast, fast_grads, plain, plain_grads, atol=1e-5, rtol=1e-4)
    with torch.no_grad():
        fast, plain = dec.eval()(a, captions, INDEXES["k=2"], mask, GRID), dec.forward_plain(a, captions,
                                                                                          INDEXES["k=2"], mask, GRID)
    torch.testing.assert_close(fast.logits, plain.logits, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", DECODERS)
def test_a_training_step_frees_its_graph_without_the_cycle_collector(kind, monkeypatch):
    """The unrolled LSTM's tapes are freed by reference counting once the step's tensors go: a tape that held a
    tensor of the graph closed a cycle, and each step's activations stayed until the cycle collector ran (25 MB
    a step on the default `shapes` model)."""
    import gc
    import weakref

    from captioning.models.fused import unrolled as decoder_module

    tapes: list[weakref.ref] = []

    class Recorded(decoder_module._Tape):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            tapes.append(weakref.ref(self))

    class RecordedLSTM(decoder_module._LSTMTape):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            tapes.append(weakref.ref(self))

    monkeypatch.setattr(decoder_module, "_Tape", Recorded)
    monkeypatch.setattr(decoder_module, "_LSTMTape", RecordedLSTM)
    dec = build(kind, "soft").train()
    a, mask, captions = data(dtype=torch.float32)
    gc.collect()
    gc.disable()
    try:
        loss(dec(a, captions, INDEXES["k=2"], mask, GRID), captions).backward()
        assert tapes and all(ref() is None for ref in tapes)
    finally:
        gc.enable()


def test_hard_attention_draws_the_same_regions_as_the_loop():
    dec = build("sat", "hard").train()
    a, mask, captions = data(dtype=torch.float32)
    index = INDEXES["k=2"]
    dec.attention.sample_this_batch = True
    torch.manual_seed(7)
    fast = dec(a, captions, index, mask, GRID)
    after_fast = torch.rand(3)
    torch.manual_seed(7)
    plain = dec.forward_plain(a, captions, index, mask, GRID)
    torch.testing.assert_close(fast.log_probs, plain.log_probs, atol=1e-5, rtol=1e-5)
    assert torch.equal(after_fast, torch.rand(3))  # the same number of random draws


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_additive_score_gradients_and_inference_chunks(k, bias, monkeypatch):
    g = torch.Generator().manual_seed(2)
    keys = torch.randn(4, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)  # (B, L, A)
    q = torch.randn(4 * k, 3, generator=g, dtype=torch.float64, requires_grad=True)  # (N, A)
    w = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(1, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    torch.autograd.gradcheck(additive_scores, (keys, q, w, b))
    plain = torch.tanh(keys.repeat_interleave(k, 0) + q.unsqueeze(1)) @ w + (0 if b is None else b)  # (N, L)
    torch.testing.assert_close(additive_scores(keys, q, w, b), plain)
    monkeypatch.setattr(fused_additive, "_CHUNK_ELEMENTS", 2 * k * 5 * 3 + 1)  # two images per chunk, one left
    with torch.no_grad():
        torch.testing.assert_close(additive_scores(keys, q, w, b), plain)
    plain_formula = functools.partial(additive_scores, plain=True)  # the model's plain formula, what a GPU runs
    torch.autograd.gradcheck(plain_formula, (keys, q, w, b))
    torch.testing.assert_close(plain_formula(keys, q, w, b), plain)


def test_tanh_as_a_sigmoid_is_torchs_tanh_within_rounding():
    y = torch.linspace(-9, 9, 1 << 10)
    torch.testing.assert_close(fused_additive.tanh_(y.clone()), torch.tanh(y), atol=2e-7, rtol=0)


def test_soft_attention_is_the_papers_formula():
    torch.manual_seed(0)
    att = SoftAttention(6, 5, attention_dim=4)
    a, h = torch.randn(2, 9, 6), torch.randn(2, 5)
    out = att(a, att.prepare(a), h)
    e = att.w(torch.tanh(att.W_a(a) + att.W_h(h).unsqueeze(1))).squeeze(-1)  # (B, L)
    torch.testing.assert_close(out.alpha, torch.softmax(e, -1))
    torch.testing.assert_close(out.context, torch.einsum("bl,bld->bd", out.alpha, a))


@pytest.mark.parametrize("name", NAMES)
def test_k_rows_per_image_equal_k_copies_of_the_image(name):
    dec = build("sat", name).eval()
    a, mask, _ = data(dtype=torch.float32)
    keys = dec.attention.prepare(a, GRID)
    h = torch.randn(9, 7)  # 3 rows per image
    prev = torch.softmax(torch.randn(9, a.shape[1]).masked_fill(~mask.repeat_interleave(3, 0), -1e9), -1)
    with torch.no_grad():
        shared = dec.attention(a, keys, h, mask, prev)
        copied = dec.attention(*(x.repeat_interleave(3, 0) for x in (a, keys)), h, mask.repeat_interleave(3, 0), prev)
    torch.testing.assert_close(shared.alpha, copied.alpha, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(shared.context, copied.context, atol=1e-6, rtol=1e-5)


class _Copies:
    """A decoder seen without `rows_share_images`: beam search gives it k copies of a, keys and mask."""

    def __init__(self, dec):
        self.dec, self.attention = dec, dec.attention

    def init_state(self, a, mask=None):
        return self.dec.init_state(a, mask)

    def step(self, words, state, a, keys, mask=None):
        return self.dec.step(words, state, a, keys, mask)


class _EndsAtItsOwnStep:
    """A decoder whose <end> grows likelier step by step at a rate read from the image, so that captions end at
    different steps; it records how many rows each step ran."""

    def __init__(self, dec):
        self.dec, self.attention, self.rows_share_images, self.rows = dec, dec.attention, True, []

    def init_state(self, a, mask=None):
        rate = 0.3 + a[:, 0, :3].sum(-1).remainder(1.0) * 1.5  # (B,) per image
        return self.dec.init_state(a, mask), rate, torch.zeros_like(rate)

    def step(self, words, state, a, keys, mask=None):
        self.rows.append(words.shape[0])
        inner, rate, t = state
        logits, inner, att = self.dec.step(words, inner, a, keys, mask)
        logits = logits.clone()
        logits[:, 2] += rate * t - 3.0  # <end>
        return logits, (inner, rate, t + 1), att


@pytest.mark.parametrize("kind", DECODERS)
@pytest.mark.parametrize("name", ["soft", "location", "multihead"])
def test_decoding_drops_finished_images_and_decodes_the_rest_as_if_alone(kind, name):
    a, mask, _ = data(B=6, dtype=torch.float32)
    mask = mask.repeat(2, 1)[:6]
    for k in (1, 3):
        dec = _EndsAtItsOwnStep(build(kind, name).eval())
        together = greedy_decode(dec, a, 15, mask=mask, grid=GRID) if k == 1 else beam_search(
            dec, a, k, 15, mask=mask, grid=GRID)
        lengths = {len(t) for t in together.tokens}
        assert len(lengths) > 2 and min(dec.rows) < max(dec.rows) // 2, (lengths, dec.rows)  # fewer rows ran
        for i in range(6):
            args = (a[i:i + 1], 15) if k == 1 else (a[i:i + 1], k, 15)
            alone = (greedy_decode if k == 1 else beam_search)(dec, *args, mask=mask[i:i + 1], grid=GRID)
            assert alone.tokens[0] == together.tokens[i]
            torch.testing.assert_close(alone.scores[0], together.scores[i], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(alone.alphas[0], together.alphas[i], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("k", [1, 3])
def test_decoding_under_bf16_autocast_drops_finished_images_too(k):
    a = data(B=6, dtype=torch.float32)[0]
    dec = _EndsAtItsOwnStep(build("sat", "soft").eval())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = greedy_decode(dec, a, 15) if k == 1 else beam_search(dec, a, k, 15)
    assert min(dec.rows) < max(dec.rows) // 2  # it compacted, writing bf16 maps into float32 buffers
    assert all(m.dtype == torch.float32 and m.shape[0] == len(t) for m, t in zip(out.alphas, out.tokens))
    assert out.scores.dtype == torch.float32 and torch.isfinite(out.scores).all()


def _median_draw(probs: torch.Tensor, n: int) -> torch.Tensor:
    """torch.multinomial made deterministic per row: the category where the row's CDF passes 0.6."""
    cdf = probs.cumsum(1) / probs.sum(1, keepdim=True)
    return (cdf < 0.6).sum(1, keepdim=True).clamp(max=probs.shape[1] - 1)


def _sample_loss(s):
    """A loss that reaches words' and attention's parameters through the steps that count (mask)."""
    return s.log_probs.sum() + (s.alphas * s.mask.unsqueeze(-1)).square().sum()


@pytest.mark.parametrize("kind", ["sat", "luong", "updown"])
@pytest.mark.parametrize("name", ["soft", "multihead", "hard"])
def test_sampling_drops_finished_images_and_samples_the_rest_as_if_alone(kind, name, monkeypatch):
    monkeypatch.setattr(torch, "multinomial", _median_draw)  # each row's draw a function of its own distribution
    a = data(B=6, dtype=torch.float32)[0]
    extra = {"expected_context_prob": 0.0} if name == "hard" else {}  # hard: a region drawn at every step
    dec = _EndsAtItsOwnStep(build(kind, name, attention_args=extra).train())  # training mode as in SCST, dropout 0
    together = sample_captions(dec, a, GRID, 3, 15)
    rows, lengths = list(dec.rows), together.mask.sum(1)
    assert len(set(lengths.tolist())) > 2
    if name == "hard":  # its regions are drawn inside the step: every row runs to the end
        assert set(rows) == {18}
    else:
        assert min(rows) < max(rows) // 2 and max(rows) == 18, rows
    dec.dec.zero_grad()
    _sample_loss(together).backward()
    grads = [p.grad.clone() for p in dec.dec.parameters()]
    dec.dec.zero_grad()
    for i in range(6):
        alone = sample_captions(dec, a[i:i + 1], GRID, 3, 15)
        T = alone.tokens.shape[1]
        for field in ("tokens", "mask", "log_probs", "alphas", "region_log_probs", "entropies"):
            x, y = getattr(alone, field), getattr(together, field)
            if x is not None:  # words and masks exactly; the rest from batches of another size: to rounding
                torch.testing.assert_close(x, y[3 * i:3 * i + 3, :T], atol=1e-5, rtol=1e-5)
                if field in ("tokens", "mask", "log_probs"):  # the rest is masked (as the losses do)
                    assert not y[3 * i:3 * i + 3, T:].any()  # nothing after the image's last sample ended
        _sample_loss(alone).backward()
    for g, p in zip(grads, dec.dec.parameters()):
        torch.testing.assert_close(p.grad, g, atol=1e-5, rtol=1e-4)


def _linear_scores(att: SoftAttention):
    """The soft score written out with nn.Linear (what the FLOP count describes), keys copied per row."""
    def scores(keys, h):
        keys = keys.repeat_interleave(h.shape[0] // keys.shape[0], 0)  # (N, L, A)
        return att.w(torch.tanh(keys + att.W_h(h).unsqueeze(1))).squeeze(-1)  # (N, L)
    return scores


def _plain_soft_forward(dec, a, captions):
    """forward_plain with the soft score written out with nn.Linear."""
    att = dec.attention
    original = att.scores
    att.scores = _linear_scores(att)
    try:
        return dec.forward_plain(a, captions)
    finally:
        att.scores = original


@pytest.mark.parametrize("init_layers", [1, 2])
def test_flop_count_matches_flop_counter_mode(init_layers):
    sizes = DecoderSizes(vocab_size=V, annotation_dim=D, regions=20, embed_dim=6, hidden_dim=7, attention_dim=8,
                         init_layers=init_layers)
    torch.manual_seed(0)
    dec = ShowAttendTellDecoder(V, D, functools.partial(SoftAttention, attention_dim=8), embed_dim=6, hidden_dim=7,
                                init_layers=init_layers)
    a, _, captions = data(B=4, k=1)
    a = a.float()
    with FlopCounterMode(display=False) as fwd:
        out = _plain_soft_forward(dec, a, captions)
    assert fwd.get_total_flops() == teacher_forcing_flops(sizes, 4, 4, 6)
    with FlopCounterMode(display=False) as both:
        out = _plain_soft_forward(dec, a, captions)
        caption_loss(out.logits, captions[:, 1:], out.alphas, pad_id=0).total.backward()
    assert both.get_total_flops() == teacher_forcing_flops(sizes, 4, 4, 6, backward=True)
    dec.eval()
    att, scores = dec.attention, dec.attention.scores
    att.scores = _linear_scores(att)
    rows, step = [], dec.step
    dec.step = lambda words, *args: rows.append(words.shape[0]) or step(words, *args)
    with FlopCounterMode(display=False) as dec_flops, torch.no_grad():
        beam_search(dec, a, 3, max_len=5)
    att.scores, dec.step = scores, step
    assert dec_flops.get_total_flops() == decoding_flops(sizes, 4, sum(rows))


# --- the code a GPU runs, run on the CPU: every branch on the device's type ----------------------------------------
