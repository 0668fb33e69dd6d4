"""What arctic-captions adds to the paper's decoder, as options the paper presets switch on (experiments/README.md,
"Fidelity"): dropout on h_t before the deep output and on the init MLP's hidden layer, that layer's ReLU, and the
two-layer attention MLP. At their defaults the model is the one it was before them; switched on, each acts where
capgen.py has it, and the fast `forward` still computes what `forward_plain` and `step` compute."""

from __future__ import annotations

import functools

import pytest
import torch
from fixtures import TINY_MODEL, assert_every_parameter_learns, compose_config
from torch import nn

from captioning.factory.models import build_captioner, model_config
from captioning.models.attention import HardAttention, SoftAttention
from captioning.models.decoders.base import mlp as _mlp
from captioning.models.decoders.sat import ShowAttendTellDecoder

V, D, L, A, M, N_HID = 13, 10, 20, 8, 6, 7
ATTENTIONS = {"soft": SoftAttention, "hard": HardAttention}
# ShowAttendTellDecoder(V, D, attention_dim=A, embed_dim=M, hidden_dim=N_HID, init_layers=2) before these options.
OLD_SHAPES = {
    "attention.W_a.weight": (A, D), "attention.W_a.bias": (A,), "attention.W_h.weight": (A, N_HID),
    "attention.w.weight": (1, A), "attention.w.bias": (1,), "embed.weight": (V, M),
    "init_h.0.weight": (D, D), "init_h.0.bias": (D,), "init_h.2.weight": (N_HID, D), "init_h.2.bias": (N_HID,),
    "init_c.0.weight": (D, D), "init_c.0.bias": (D,), "init_c.2.weight": (N_HID, D), "init_c.2.bias": (N_HID,),
    "selector.weight": (1, N_HID), "selector.bias": (1,), "lstm.weight_ih": (4 * N_HID, M + D),
    "lstm.weight_hh": (4 * N_HID, N_HID), "lstm.bias_ih": (4 * N_HID,), "lstm.bias_hh": (4 * N_HID,),
    "L_h.weight": (M, N_HID), "L_h.bias": (M,), "L_z.weight": (M, D), "L_z.bias": (M,), "L_o.weight": (V, M),
    "L_o.bias": (V,)}
OLD_MODULES = ["ShowAttendTellDecoder", "{attention}", "Linear", "Linear", "Linear", "Embedding", "Sequential",
               "Linear", "Tanh", "Linear", "Sequential", "Linear", "Tanh", "Linear", "Linear", "LSTMCell", "Linear",
               "Linear", "Linear", "Dropout"]
PAPER = {"attention_layers": 2, "hidden_dropout": 0.3, "init_dropout": 0.3, "init_activation": "relu"}


def _decoder(attention: str = "soft", attention_layers: int | None = None, dropout: float = 0.0,
             **options) -> ShowAttendTellDecoder:
    """A small decoder with a 2-layer init MLP; `attention_layers` None leaves the attention's default."""
    layers = {} if attention_layers is None else {"attention_layers": attention_layers}
    att = functools.partial(ATTENTIONS[attention], attention_dim=A, **layers)
    torch.manual_seed(0)
    return ShowAttendTellDecoder(V, D, att, embed_dim=M, hidden_dim=N_HID, init_layers=2, dropout=dropout, **options)


def _data(B: int = 3, k: int = 2, T: int = 5, dtype=torch.float64):
    """a (B, L, D), k captions of T + 1 tokens per image (N = B k, consecutive) and their image index (N,)."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(B, L, D, generator=g).relu().to(dtype)
    captions = torch.randint(3, V, (B * k, T + 1), generator=g)
    captions[:, 0] = 1  # <start>
    return a, captions, torch.arange(B).repeat_interleave(k)


def _shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_defaults_are_the_old_model_and_the_dropouts_add_no_parameters(attention):
    explicit = {"hidden_dropout": 0.0, "init_dropout": 0.0, "init_activation": "tanh"}
    for dec in (_decoder(attention, dropout=0.1), _decoder(attention, 1, dropout=0.1, **explicit)):
        assert _shapes(dec) == OLD_SHAPES
        names = [type(m).__name__ for m in dec.modules()]
        assert names == [n.format(attention=ATTENTIONS[attention].__name__) for n in OLD_MODULES]
        assert dec.hidden_dropout is None and dec.attention.key_mlp is None and not dec.init_draws
    on = _decoder(attention, dropout=0.5, hidden_dropout=0.5, init_dropout=0.5, init_activation="relu")
    assert _shapes(on) == OLD_SHAPES  # a checkpoint's keys do not depend on the dropout rates or the activation


def test_mlp_keeps_its_three_argument_form():
    assert [type(m).__name__ for m in _mlp(D, N_HID, 3)] == ["Linear", "Tanh", "Linear", "Tanh", "Linear"]
    mlp = _mlp(D, N_HID, 2, activation="relu", dropout=0.5)
    assert isinstance(mlp[1], nn.Sequential) and isinstance(mlp[1][0], nn.ReLU) and mlp[1][1].p == 0.5
    assert [type(m).__name__ for m in _mlp(D, N_HID, 1, activation="relu", dropout=0.5)] == ["Linear"]


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_init_state_is_tanh_of_the_mlp_with_its_hidden_activation(activation):
    dec = _decoder(init_activation=activation).double().eval()
    a, _, _ = _data()
    act = torch.relu if activation == "relu" else torch.tanh
    for mlp, state in zip((dec.init_h, dec.init_c), dec.init_state(a)[:2]):
        assert mlp is not None
        hidden = act(mlp[0](a.mean(1)))  # (B, D): the hidden layer of the mean annotation
        torch.testing.assert_close(state, torch.tanh(mlp[2](hidden)))  # (B, n)


def _capture(module: nn.Module, store: list, pre: bool = True) -> None:
    """Keep every input (pre) or output of `module`."""
    if pre:
        module.register_forward_pre_hook(lambda m, args: store.append(args))
    else:
        module.register_forward_hook(lambda m, args, out: store.append(out))


def test_hidden_dropout_drops_h_where_it_enters_the_deep_output_only():
    dec = _decoder(hidden_dropout=0.5).double().train()
    a, captions, index = _data()
    lstm_in: list = []
    lstm_out: list = []
    deep_in: list = []
    _capture(dec.lstm, lstm_in)
    _capture(dec.lstm, lstm_out, pre=False)
    _capture(dec.L_h, deep_in)
    dec.forward_plain(a, captions, index)
    hs = torch.stack([h for h, _ in lstm_out], 1)  # (N, T, n): the LSTM's h_t
    dropped = deep_in[0][0]  # (N, T, n): what L_h reads
    assert torch.all((dropped == 0) | torch.isclose(dropped, 2 * hs))  # kept units scaled by 1 / (1 - p)
    assert 0.3 < (dropped == 0).double().mean() < 0.7
    for t in range(1, hs.shape[1]):  # the recurrence reads h_t itself, not the dropped copy
        assert torch.equal(lstm_in[t][1][0], hs[:, t - 1])
    dec.eval()
    deep_in.clear()
    lstm_out.clear()
    dec.forward_plain(a, captions, index)
    assert torch.equal(deep_in[0][0], torch.stack([h for h, _ in lstm_out], 1))  # no dropout at test time


@pytest.mark.parametrize("plain", [True, False])
def test_init_dropout_drops_the_hidden_layer_with_a_mask_per_caption(plain):
    dec = _decoder(init_dropout=0.5).double().train()
    assert dec.init_h is not None and dec.init_draws
    a, captions, index = _data()
    last_in: list = []
    _capture(dec.init_h[2], last_in)
    (dec.forward_plain if plain else dec.forward)(a, captions, index)
    dropped = last_in[0][0]  # (N, D): what the last layer reads, one row per caption
    hidden = torch.tanh(dec.init_h[0](a.mean(1))).repeat_interleave(2, 0)  # (N, D) before dropout
    assert torch.all((dropped == 0) | torch.isclose(dropped, 2 * hidden))
    kept = dropped != 0  # (N, D)
    assert 0.2 < kept.double().mean() < 0.8
    assert not torch.equal(kept[0::2], kept[1::2])  # the two captions of an image draw their own masks
    dec.eval()
    with torch.no_grad():
        h0 = dec.init_state(a)[0]  # (B, n)
    torch.testing.assert_close(h0, torch.tanh(dec.init_h[2](torch.tanh(dec.init_h[0](a.mean(1))))))


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_attention_layers_add_tanh_layers_on_the_keys(attention, layers):
    att = ATTENTIONS[attention](D, N_HID, A, attention_layers=layers).double()
    base = ATTENTIONS[attention](D, N_HID, A).double()
    extra = {f"key_mlp.{2 * i}.{p}": (A, A) if p == "weight" else (A,) for i in range(layers - 1)
             for p in ("weight", "bias")}
    assert _shapes(att) == {**_shapes(base), **extra}
    a, _, _ = _data()
    keys = att.W_a(a)  # (B, L, A)
    for i in range(layers - 1):
        keys = torch.tanh(att.key_mlp[2 * i](keys))  # capgen.py:L357-362
    torch.testing.assert_close(att.prepare(a), keys)


@pytest.mark.parametrize(("attention", "sampled"), [("soft", False), ("hard", False), ("hard", True)])
def test_every_parameter_gets_a_gradient_with_the_options_on(attention, sampled):
    dec = _decoder(attention, dropout=0.3, **PAPER).double().train()
    if attention == "hard":
        dec.attention.sample_this_batch = sampled
    a, captions, index = _data()
    out = dec(a, captions, index)
    loss = nn.functional.cross_entropy(out.logits.reshape(-1, V), captions[:, 1:].reshape(-1))
    if out.log_probs is not None:  # REINFORCE: the only path from the loss to the attention's weights
        loss = loss + out.log_probs.sum()
    loss.backward()
    assert_every_parameter_learns(dec)


def _grads(dec: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in dec.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("index", ["none", "k=2", "irregular"])
@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_fast_forward_is_forward_plain_with_the_options_on(attention, index):
    """In training too: with one row per caption in caption order both draw the same dropout masks."""
    dec = _decoder(attention, dropout=0.3, **PAPER).double().train()
    a, captions, image_index = _data(k=1 if index == "none" else 2)
    indexes = {"none": None, "k=2": image_index, "irregular": torch.tensor([2, 0, 0, 1, 2, 1])}
    if attention == "hard":
        dec.attention.sample_this_batch = True
    outs, grads = [], []
    for fn in (type(dec).forward, type(dec).forward_plain):
        torch.manual_seed(5)
        dec.zero_grad()
        out = fn(dec, a, captions, indexes[index])
        loss = out.logits.logsumexp(-1).sum() + out.alphas.pow(2).sum()
        (loss + out.log_probs.sum() if out.log_probs is not None else loss).backward()
        outs.append(out)
        grads.append(_grads(dec))
    for field in ("logits", "alphas", "betas", "log_probs"):
        f, p = getattr(outs[0], field), getattr(outs[1], field)
        assert (f is None) == (p is None)
        if f is not None:
            torch.testing.assert_close(f, p, atol=1e-9, rtol=1e-7, msg=field)
    assert grads[0].keys() == grads[1].keys() and "attention.key_mlp.0.weight" in grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-9, rtol=1e-7, msg=name)


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_step_and_packed_forward_are_forward_plain_with_the_options_on(attention):
    dec = _decoder(attention, dropout=0.3, **PAPER).double().eval()
    a, captions, index = _data()
    captions[0, 3:] = 0  # a shorter caption: two real targets, then padding
    lengths = (captions[:, 1:] != 0).sum(1)  # (N,)
    with torch.no_grad():
        plain = dec.forward_plain(a, captions, index)
        packed = dec(a, captions, index, lengths=lengths)
        torch.testing.assert_close(packed.logits, plain.logits[captions[:, 1:] != 0])
        state, keys = dec.init_state(a), dec.attention.prepare(a)  # per image, k = 2 rows each
        state = tuple(s.repeat_interleave(2, 0) for s in state)
        for t in range(captions.shape[1] - 1):
            logits, state, _ = dec.step(captions[:, t], state, a, keys)
            torch.testing.assert_close(logits, plain.logits[:, t])


@pytest.mark.parametrize("preset", ["coco_soft", "flickr8k_hard"])
def test_a_paper_preset_builds_the_decoder_with_arctic_captions_options(preset):
    small = ["attention.attention_dim=8", "decoder.embed_dim=6", "decoder.hidden_dim=7"]
    cfg = compose_config(f"experiment={preset}", *small)
    spec = {**model_config(cfg), "encoder": TINY_MODEL["encoder"]}  # ImageNet weights are not needed here
    dec = build_captioner(spec, V).decoder
    assert dec.attention.key_mlp is not None and len(dec.attention.key_mlp) == 2  # one extra layer and its tanh
    assert dec.hidden_dropout is not None and dec.hidden_dropout.p == 0.5 and dec.dropout.p == 0.5
    assert dec.init_h is not None and isinstance(dec.init_h[1], nn.Sequential)
    assert isinstance(dec.init_h[1][0], nn.ReLU) and dec.init_h[1][1].p == 0.5
    shapes = build_captioner({**model_config(compose_config(*small)), "encoder": TINY_MODEL["encoder"]}, V).decoder
    assert shapes.hidden_dropout is None and shapes.attention.key_mlp is None  # the `shapes` defaults: none of it
