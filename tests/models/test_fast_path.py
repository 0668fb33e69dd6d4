"""The fast paths compute what the plain step-by-step implementation computes: teacher forcing (logits, alphas,
losses, every gradient) for both decoders and every attention type, shared-image attention rows, the fused
additive score, beam search / greedy without copies of a, and the FLOP count the benchmark divides by."""

from __future__ import annotations

import functools

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.flop_counter import FlopCounterMode

from captioning.factory import registry
from captioning.models import fused, packing
from captioning.models.attention import SoftAttention, additive_scores
from captioning.models.attention_family import grid_positions
from captioning.models.decoder import DecoderOutput, ShowAttendTellDecoder
from captioning.models.decoding import beam_search, greedy_decode
from captioning.models.flops import DecoderSizes, decoding_flops, teacher_forcing_flops
from captioning.models.luong_decoder import LuongDecoder
from captioning.models.packing import StepPlan, prefix_lengths
from captioning.models.updown_decoder import UpDownDecoder
from captioning.runtime import CONF_DIR
from captioning.training.losses import MovingAverageBaseline, caption_loss, hard_attention_loss
from captioning.training.scst.sampling import sample_captions

CONF = CONF_DIR / "attention"
NAMES = sorted(p.stem for p in CONF.glob("*.yaml"))  # soft, hard, dot, general, concat, local, location, multihead
SMALL = {"attention_dim": 8, "predictor_dim": 8, "num_filters": 3, "kernel_size": 3, "num_heads": 2, "head_dim": 4,
         "half_width": 2}
V, D, GRID = 13, 10, (4, 5)
DECODERS = ["sat", "luong", "luong_no_feeding", "updown"]
OUTPUT_LAYER = {"sat": "L_o", "updown": "W_p"}  # each decoder's vocabulary projection (Luong's: W_s)


def _decoder(kind: str, name: str, dropout: float = 0.0, **attention) -> torch.nn.Module:
    """A small decoder of `kind` with conf/attention/<name>.yaml shrunk."""
    spec = {k: SMALL.get(k, v) for k, v in OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml")).items()}
    cls, kwargs = registry.resolve("attention", {**spec, **attention}, name)
    att = functools.partial(cls, **kwargs)
    torch.manual_seed(0)
    if kind == "sat":
        return ShowAttendTellDecoder(V, D, att, embed_dim=6, hidden_dim=7, dropout=dropout, init_layers=2)
    if kind == "updown":  # the MLP init, so that gradients reach a through the initial state too
        return UpDownDecoder(V, D, att, embed_dim=6, hidden_dim=7, dropout=dropout, init_from_annotations=True)
    return LuongDecoder(V, D, att, embed_dim=6, hidden_dim=7, dropout=dropout, input_feeding=kind == "luong")


def _data(B: int = 3, k: int = 2, T: int = 6, dtype=torch.float64):
    """a (B, L, D) on a (4, 5) grid with image 0 padded to 3 x 4, and k captions (T + 1 tokens) per image."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(B, GRID[0] * GRID[1], D, generator=g).relu().to(dtype)
    mask = torch.ones(B, a.shape[1], dtype=torch.bool)
    pos = grid_positions(*GRID)
    mask[0] = (pos[:, 0] < 3) & (pos[:, 1] < 4)
    captions = torch.randint(3, V, (B * k, T + 1), generator=g)
    captions[:, 0] = 1  # <start>
    captions[0, 4:] = 0  # a padded caption
    return a, mask, captions


def plain_forward(dec, a, captions, image_index=None, mask=None, grid=None) -> DecoderOutput:
    """The model's own step-by-step teacher forcing: every caption with its own copy of a and keys, the LSTM cell
    per step (`forward_plain` of either decoder)."""
    return dec.forward_plain(a, captions, image_index, mask, grid)


def _loss(out: DecoderOutput, captions: torch.Tensor) -> torch.Tensor:
    """The training loss with every term that reaches the model: NLL, doubly stochastic, REINFORCE, entropy."""
    return hard_attention_loss(out.logits, captions[:, 1:], out.alphas, out.log_probs, out.entropies, 0,
                               MovingAverageBaseline(0.9), attention_weight=1.0, reward_weight=0.5,
                               entropy_weight=0.1).total


def _run(dec, fn, a, captions, index, mask, seed: int = 5):
    torch.manual_seed(seed)
    dec.zero_grad()
    out = fn(dec, a, captions, index, mask=mask, grid=GRID)
    _loss(out, captions).backward()
    return out, {n: p.grad.clone() for n, p in dec.named_parameters() if p.grad is not None}


def _compare(dec, a, mask, captions, index, atol=1e-9, rtol=1e-7):
    fast, fast_grads = _run(dec, type(dec).forward, a, captions, index, mask)
    plain, plain_grads = _run(dec, plain_forward, a, captions, index, mask)
    for field in ("logits", "alphas", "betas", "log_probs", "entropies"):
        f, p = getattr(fast, field), getattr(plain, field)
        assert (f is None) == (p is None), field
        if f is not None:
            torch.testing.assert_close(f, p, atol=atol, rtol=rtol, msg=field)
    assert fast_grads.keys() == plain_grads.keys()
    for n in plain_grads:
        torch.testing.assert_close(fast_grads[n], plain_grads[n], atol=atol, rtol=rtol, msg=n)


INDEXES = {"none": None, "k=2": torch.arange(3).repeat_interleave(2), "irregular": torch.tensor([2, 0, 0, 1, 2, 1])}


@pytest.mark.parametrize("kind", DECODERS)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("index", list(INDEXES))
def test_teacher_forcing_matches_the_step_by_step_loop(kind, name, index):
    dec = _decoder(kind, name, dropout=0.3).double().train()
    a, mask, captions = _data(k=1 if index == "none" else 2)
    if name == "hard":
        dec.attention.sample_this_batch = True  # sampled regions; the same draws in the same order
        mask = None  # H(alpha)'s gradient at a padded region's alpha = 0 is NaN in both paths (x log x at 0)
    _compare(dec, a, mask, captions, INDEXES[index])


def _ragged(captions: torch.Tensor, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The captions cut to these numbers of real targets (pads after), and the lengths the loss finds in them."""
    captions = captions.masked_fill(captions == 0, 5)  # words everywhere, then cut
    for r, n in enumerate(lengths):
        captions[r, n + 1:] = 0
    lengths_t = prefix_lengths(captions[:, 1:], 0)
    assert lengths_t is not None and lengths_t.tolist() == lengths
    return captions, lengths_t


RAGGED = {"none": [6, 2, 5], "k=2": [3, 6, 1, 2, 5, 4], "irregular": [4, 6, 2, 2, 1, 5], "k=2 equal": [4, 4, 2, 2, 6, 6]}


@pytest.mark.parametrize("kind", DECODERS)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("index", list(RAGGED))
@pytest.mark.parametrize("gather_below", [0.0, 0.75, 2.0])  # never, the default, always gather running captions
def test_teacher_forcing_over_real_words_only_matches_the_padded_loop(kind, name, index, gather_below, monkeypatch):
    """Given the lengths, each step runs the captions still running only: the logits of the real tokens, the
    alphas and gates of real steps, the loss and every gradient are the padded loop's (whose padded steps the
    loss masks)."""
    monkeypatch.setattr(packing, "GATHER_BELOW", gather_below)
    dec = _decoder(kind, name, dropout=0.0).double().train()
    a, mask, captions = _data(k=1 if index == "none" else 2)
    captions, lengths = _ragged(captions, RAGGED[index])
    image_index = INDEXES["k=2" if index == "k=2 equal" else index]
    if name == "hard":
        dec.attention.sample_this_batch = False  # sampled regions draw differently when fewer rows run
        mask = None
    real = captions[:, 1:] != 0  # (N, T)
    fast, fast_grads = _run(dec, functools.partial(type(dec).forward, lengths=lengths), a, captions, image_index, mask)
    plain, plain_grads = _run(dec, plain_forward, a, captions, image_index, mask)
    torch.testing.assert_close(fast.logits, plain.logits[real], atol=1e-9, rtol=1e-7)
    steps = real.unsqueeze(-1).double()  # (N, T, 1)
    torch.testing.assert_close(fast.alphas, plain.alphas * steps, atol=1e-9, rtol=1e-7)
    torch.testing.assert_close(fast.betas, plain.betas * real, atol=1e-9, rtol=1e-7)
    assert fast_grads.keys() == plain_grads.keys()
    for n in plain_grads:
        torch.testing.assert_close(fast_grads[n], plain_grads[n], atol=1e-9, rtol=1e-7, msg=n)


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
    dec = _decoder(kind, name).train()
    a, mask, captions = _data(dtype=torch.float32)
    captions, lengths = _ragged(captions, RAGGED["k=2"])
    with torch.autocast("cpu", dtype=torch.bfloat16), _CastsOf(a.shape) as casts:
        out = dec(a, captions, INDEXES["k=2"], mask, GRID, lengths)
    # attention.prepare's linears (multi-head: keys and values) and one cast for all 6 steps
    assert casts.count <= 3 and out.logits.dtype == torch.bfloat16, casts.count
    with _CastsOf(a.shape) as casts:  # float32: no cast at all
        dec(a, captions, INDEXES["k=2"], mask, GRID, lengths)
    assert casts.count == 0


def test_hard_attention_samples_regions_for_real_steps_only():
    dec = _decoder("sat", "hard").double().train()
    a, _, captions = _data()
    captions, lengths = _ragged(captions, RAGGED["k=2"])
    dec.attention.sample_this_batch = True
    out, grads = _run(dec, functools.partial(type(dec).forward, lengths=lengths), a, captions, INDEXES["k=2"], None)
    real = captions[:, 1:] != 0
    assert out.log_probs is not None and out.entropies is not None
    assert torch.all(out.log_probs[~real] == 0) and torch.all(out.log_probs[real] < 0)
    assert torch.all(out.entropies[~real] == 0) and torch.all(out.entropies[real] > 0)
    torch.testing.assert_close(out.alphas.sum(-1), real.double())  # alphas sum to 1 at real steps, 0 after
    assert grads and all(torch.isfinite(g).all() for g in grads.values())


def test_lengths_that_fill_the_batch_give_the_dense_result():
    dec = _decoder("sat", "soft").double().eval()
    a, mask, captions = _data()
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
    dec = _decoder(kind, "soft").train()
    a, mask, captions = _data(dtype=torch.float32)
    _compare(dec, a, mask, captions, INDEXES["k=2"], atol=1e-5, rtol=1e-4)
    with torch.no_grad():
        fast, plain = dec.eval()(a, captions, INDEXES["k=2"], mask, GRID), plain_forward(dec, a, captions,
                                                                                          INDEXES["k=2"], mask, GRID)
    torch.testing.assert_close(fast.logits, plain.logits, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", DECODERS)
def test_a_training_step_frees_its_graph_without_the_cycle_collector(kind, monkeypatch):
    """The unrolled LSTM's tapes are freed by reference counting once the step's tensors go: a tape that held a
    tensor of the graph closed a cycle, and each step's activations stayed until the cycle collector ran (25 MB
    a step on the default `shapes` model)."""
    import gc
    import weakref

    from captioning.models import fused as decoder_module

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
    dec = _decoder(kind, "soft").train()
    a, mask, captions = _data(dtype=torch.float32)
    gc.collect()
    gc.disable()
    try:
        _loss(dec(a, captions, INDEXES["k=2"], mask, GRID), captions).backward()
        assert tapes and all(ref() is None for ref in tapes)
    finally:
        gc.enable()


def test_hard_attention_draws_the_same_regions_as_the_loop():
    dec = _decoder("sat", "hard").train()
    a, mask, captions = _data(dtype=torch.float32)
    index = INDEXES["k=2"]
    dec.attention.sample_this_batch = True
    torch.manual_seed(7)
    fast = dec(a, captions, index, mask, GRID)
    after_fast = torch.rand(3)
    torch.manual_seed(7)
    plain = plain_forward(dec, a, captions, index, mask, GRID)
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
    monkeypatch.setattr(fused, "_CHUNK_ELEMENTS", 2 * k * 5 * 3 + 1)  # two images per chunk, one left
    with torch.no_grad():
        torch.testing.assert_close(additive_scores(keys, q, w, b), plain)
    with fused.device_path("generic"):  # the model's plain formula, what a GPU runs
        torch.autograd.gradcheck(additive_scores, (keys, q, w, b))
        torch.testing.assert_close(additive_scores(keys, q, w, b), plain)


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
    dec = _decoder("sat", name).eval()
    a, mask, _ = _data(dtype=torch.float32)
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


@pytest.mark.parametrize("kind", DECODERS)
@pytest.mark.parametrize("name", NAMES)
def test_beam_search_on_shared_rows_equals_copied_rows(kind, name):
    dec = _decoder(kind, name).eval()
    a, mask, _ = _data(B=4, dtype=torch.float32)
    with torch.no_grad():
        getattr(dec, OUTPUT_LAYER.get(kind, "W_s")).bias[2] += 1.5  # some captions end before max_len
    for k in (1, 3):
        fast = beam_search(dec, a, k, 8, mask=mask, grid=GRID)
        plain = beam_search(_Copies(dec), a, k, 8, mask=mask, grid=GRID)
        assert fast.tokens == plain.tokens
        torch.testing.assert_close(fast.scores, plain.scores, atol=1e-5, rtol=1e-5)
        for f, p in zip(fast.alphas, plain.alphas):
            torch.testing.assert_close(f, p, atol=1e-6, rtol=1e-5)
    greedy = greedy_decode(dec, a, 8, mask=mask, grid=GRID)
    assert greedy.tokens == beam_search(dec, a, 1, 8, mask=mask, grid=GRID).tokens


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
    a, mask, _ = _data(B=6, dtype=torch.float32)
    mask = mask.repeat(2, 1)[:6]
    for k in (1, 3):
        dec = _EndsAtItsOwnStep(_decoder(kind, name).eval())
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
    a = _data(B=6, dtype=torch.float32)[0]
    dec = _EndsAtItsOwnStep(_decoder("sat", "soft").eval())
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
    a = _data(B=6, dtype=torch.float32)[0]
    extra = {"expected_context_prob": 0.0} if name == "hard" else {}  # hard: a region drawn at every step
    dec = _EndsAtItsOwnStep(_decoder(kind, name, **extra).train())  # training mode as in SCST, dropout 0
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
    """plain_forward with the soft score written out with nn.Linear."""
    att = dec.attention
    original = att.scores
    att.scores = _linear_scores(att)
    try:
        return plain_forward(dec, a, captions)
    finally:
        att.scores = original


@pytest.mark.parametrize("init_layers", [1, 2])
def test_flop_count_matches_flop_counter_mode(init_layers):
    sizes = DecoderSizes(vocab_size=V, annotation_dim=D, regions=20, embed_dim=6, hidden_dim=7, attention_dim=8,
                         init_layers=init_layers)
    torch.manual_seed(0)
    dec = ShowAttendTellDecoder(V, D, functools.partial(SoftAttention, attention_dim=8), embed_dim=6, hidden_dim=7,
                                init_layers=init_layers)
    a, _, captions = _data(B=4, k=1)
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


@pytest.mark.parametrize("kind", DECODERS)
@pytest.mark.parametrize("name", NAMES)
def test_the_generic_device_path_computes_what_the_cpu_path_computes(kind, name, monkeypatch):
    """`device_path("generic")` runs what a GPU runs (one chunk for the additive score, torch's tanh) on the CPU;
    its teacher forcing (logits, loss, every gradient, real words only) and its beam search equal the CPU path's,
    where the chunks are made small enough that the CPU path takes several."""
    monkeypatch.setattr(fused, "_CHUNK_ELEMENTS", 2 * 2 * 20 * 8)  # two images x k = 2 rows per chunk
    a, mask, captions = _data(B=5, dtype=torch.float32)
    captions, lengths = _ragged(captions, [3, 6, 1, 2, 5, 4, 6, 2, 3, 3])
    index = torch.arange(5).repeat_interleave(2)
    if name == "hard":
        mask = None
    results = {}
    for path in ("cpu", "generic"):
        dec = _decoder(kind, name).train()
        if name == "hard":
            dec.attention.sample_this_batch = False
        with fused.device_path(path):
            assert fused.cpu_path(a) == (path == "cpu")
            out, grads = _run(dec, functools.partial(type(dec).forward, lengths=lengths), a, captions, index, mask)
            beams = beam_search(dec.eval(), a, 3, 8, mask=mask, grid=GRID)
        results[path] = out, grads, beams
    (out_c, grads_c, beams_c), (out_g, grads_g, beams_g) = results["cpu"], results["generic"]
    torch.testing.assert_close(out_g.logits, out_c.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_g.alphas, out_c.alphas, atol=1e-6, rtol=1e-5)
    assert grads_g.keys() == grads_c.keys()
    for n in grads_c:
        torch.testing.assert_close(grads_g[n], grads_c[n], atol=1e-5, rtol=1e-4, msg=n)
    assert beams_g.tokens == beams_c.tokens
    torch.testing.assert_close(beams_g.scores, beams_c.scores, atol=1e-5, rtol=1e-5)


def test_device_path_is_restored_and_follows_the_device_by_default():
    x = torch.zeros(2)
    assert fused.cpu_path(x)
    with fused.device_path("generic"):
        assert not fused.cpu_path(x)
        with fused.device_path("cpu"):
            assert fused.cpu_path(x)
        assert not fused.cpu_path(x)
    assert fused.cpu_path(x)
    y = torch.full((1 << 10,), 0.7)
    with fused.device_path("generic"):
        generic = fused.tanh_(y.clone())
    torch.testing.assert_close(fused.tanh_(y.clone()), generic, atol=2e-7, rtol=0)
    assert torch.equal(generic, torch.tanh(y))
