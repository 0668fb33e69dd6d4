"""decoder=transformer: what only it holds (its cross-attention choice, cancelling biases, incremental decoding against
full recomputation, the chosen map, positions, bf16). Shapes, maps, gradients, packed = plain, beam 1 = greedy and
overfitting: tests/models/test_decoders.py."""

from __future__ import annotations

import pytest
import torch
from fixtures import (
    TINY_MODEL,
    cancelling_entries,
    compose_config,
    masked_annotations,
    padded_captions,
    shift_cancelling_entries,
)
from omegaconf import OmegaConf

from captioning.factory.models import build_captioner
from captioning.models.decoders.transformer import TransformerDecoder
from captioning.models.decoders.transformer_layers import sinusoid
from captioning.models.decoding import greedy_decode
from captioning.runtime import CONF_DIR
from captioning.training.losses import caption_loss

CROSS = ["multihead", "soft", "dot", "general", "concat", "local"]  # the attention types a layer can run
SMALL = {"attention_dim": 8, "num_heads": 2, "head_dim": 8, "half_width": 2}
V = 12


def _model(name: str = "multihead", **decoder):
    """A tiny captioner: SmallCNN, conf/attention/<name>.yaml and conf/decoder/transformer.yaml shrunk."""
    attention = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "attention" / f"{name}.yaml"))
    attention = {k: SMALL.get(k, v) for k, v in attention.items()}
    dec = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(CONF_DIR / "decoder" / "transformer.yaml")).items()
           if k != "defaults"}
    dec = {**dec, "d_model": 16, "num_layers": 2, "num_heads": 2, "ff_dim": 24, "dropout": 0.0, **decoder}
    torch.manual_seed(0)
    return build_captioner({**TINY_MODEL, "attention": attention, "decoder": dec}, vocab_size=V)


def test_conf_decoder_transformer_selects_multihead_cross_attention():
    model = _model()
    assert isinstance(model.decoder, TransformerDecoder) and len(model.decoder.layers) == 2
    chosen = compose_config("decoder=transformer")
    asked = compose_config("decoder=transformer", "attention=soft")
    sat = compose_config("decoder=sat")
    assert chosen.attention._target_ == "multihead"
    assert asked.attention._target_ == "soft" and sat.attention._target_ == "soft"


def test_the_key_and_score_biases_change_no_output():
    """What assert_every_parameter_learns expects a zero gradient of: the self-attentions' key biases (q^T b_k, the
    same for every key) and the soft cross-attention's score bias change no logit or map."""
    model = _model("soft", encoder_layers=1).eval()
    captions, idx, images = padded_captions(), torch.arange(3).repeat_interleave(2), torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        want = model(images, captions, idx)
        shift_cancelling_entries(model)
        got = model(images, captions, idx)
    assert set(cancelling_entries(model)) == {
        "decoder.attention.encoder.0.self_attn.qkv.bias", "decoder.layers.0.self_attn.qkv.bias",
        "decoder.layers.1.self_attn.qkv.bias", "decoder.attention.cross.0.w.bias", "decoder.attention.cross.1.w.bias"}
    torch.testing.assert_close(got.logits, want.logits)
    torch.testing.assert_close(got.alphas, want.alphas)


@pytest.mark.parametrize("name", ["hard", "location", "monotonic", "mean"])
def test_attention_a_layer_cannot_run_in_parallel_is_refused(name):
    with pytest.raises(ValueError, match=f"cannot use attention={name}"):
        _model(name)


@pytest.mark.parametrize("name", CROSS)
@pytest.mark.parametrize("options", [{}, {"encoder_layers": 2, "tie_embeddings": True, "positions": "learned"},
                                     {"encoder_layers": 1, "region_positions": "sinusoidal"},
                                     {"region_positions": "learned"}])
def test_incremental_decoding_equals_full_recomputation(name, options):
    """step() over the key/value cache gives forward()'s logits and maps, position by position, with padded
    regions, k captions per image and the encoder stack."""
    dec = _model(name, **options).decoder.eval()
    a, mask, grid = masked_annotations()
    captions, idx = padded_captions(), torch.tensor([0, 0, 1, 1, 2, 2])
    with torch.no_grad():
        out = dec(a, captions, idx, mask=mask, grid=grid)
        keys = dec.attention.prepare(a, grid, mask)  # (B, L, ...) once per image; the state has 2 rows per image
        state = dec.init_state(a[idx], mask[idx])
        for t in range(captions.shape[1] - 1):
            logits, state, att = dec.step(captions[:, t], state, a, keys, mask)
            torch.testing.assert_close(logits, out.logits[:, t], atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(att.alpha, out.alphas[:, t], atol=1e-6, rtol=1e-5)
            assert (att.alpha[~mask[idx]] == 0).all()
            assert all(k.shape == (6, 2, t + 1, 8) and v.shape == k.shape for k, v in state)  # (N, H, t, d_k)
        plain = dec.forward_plain(a, captions, idx, mask=mask, grid=grid)
    torch.testing.assert_close(plain.logits, out.logits, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("positions", ["none", "sinusoidal", "learned"])
def test_without_region_positions_the_grid_is_a_set(positions):
    """Permuting the cells only permutes the encoder's outputs (the memory) and leaves every logit as it was,
    unless the regions' 2-D positions are added: then the captions' logits change."""
    dec = _model(encoder_layers=2, region_positions=positions).decoder.eval()
    a, _, grid = masked_annotations(B=2)
    perm = torch.randperm(a.shape[1], generator=torch.Generator().manual_seed(1))
    captions, idx = padded_captions(N=4), torch.tensor([0, 0, 1, 1])
    with torch.no_grad():
        memory, memory_permuted = (dec.attention.split(dec.attention.prepare(x, grid))[0] for x in (a, a[:, perm]))
        out, permuted = dec(a, captions, idx, grid=grid), dec(a[:, perm], captions, idx, grid=grid)
    if positions == "none":
        torch.testing.assert_close(memory_permuted, memory[:, perm], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(permuted.logits, out.logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(permuted.alphas, out.alphas[..., perm], atol=1e-6, rtol=1e-5)
    else:
        assert (permuted.logits - out.logits).abs().max() > 1e-2


def test_sinusoidal_region_positions_are_row_then_column_halves_on_any_grid():
    memory = _model(d_model=10, num_heads=2, region_positions="sinusoidal").decoder.attention
    P = memory.positions(15, (3, 5))  # (L, d): 3 rows of 5
    assert P.shape == (15, 10)
    rows, cols = torch.arange(3).repeat_interleave(5), torch.arange(5).repeat(3)
    torch.testing.assert_close(P[:, :5], sinusoid(rows, 5))
    torch.testing.assert_close(P[:, 5:], sinusoid(cols, 5))
    assert len({tuple(p.tolist()) for p in P}) == 15  # every cell its own position
    learned = _model(region_positions="learned", max_grid_side=4).decoder.attention
    with pytest.raises(ValueError, match="larger than the learned region positions"):
        learned.positions(15, (3, 5))


def test_a_checkpoint_config_without_region_positions_builds_the_set_model():
    """Configs written before the key: no positions, the state dict they saved loads unchanged."""
    new = _model(region_positions="none")
    spec = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(CONF_DIR / "decoder" / "transformer.yaml")).items()
            if k not in ("defaults", "region_positions", "max_grid_side")}
    torch.manual_seed(0)
    old = build_captioner({**TINY_MODEL, "attention": {"_target_": "multihead", "num_heads": 2, "head_dim": 8},
                           "decoder": {**spec, "d_model": 16, "num_layers": 2, "num_heads": 2, "ff_dim": 24,
                                       "dropout": 0.0}}, vocab_size=V)
    assert old.decoder.attention.region_positions == "none"
    old.load_state_dict(new.state_dict())
    assert compose_config("experiment=coco_transformer").decoder.region_positions == "sinusoidal"


def test_a_decoding_step_runs_one_position_not_the_prefix():
    """The cache makes step t cost O(t): each layer projects one new position, whatever t is."""
    dec = _model().decoder.eval()
    a, _, grid = masked_annotations()
    rows = []
    hook = dec.layers[0].self_attn.qkv.register_forward_hook(lambda m, i, o: rows.append(tuple(i[0].shape)))
    greedy_decode(dec, a, max_len=6, grid=grid)
    hook.remove()
    assert rows and all(r[1] == 1 for r in rows), rows  # (N, 1, d) every step


def test_packed_lengths_give_the_dense_logits_of_the_real_tokens():
    dec = _model(encoder_layers=1).decoder.eval()
    a, mask, grid = masked_annotations()
    captions, idx = padded_captions(), torch.arange(3).repeat_interleave(2)
    lengths = torch.tensor([4, 6, 2, 6, 5, 1])
    with torch.no_grad():
        dense = dec(a, captions, idx, mask=mask, grid=grid)
        packed = dec(a, captions, idx, mask=mask, grid=grid, lengths=lengths)
    real = torch.arange(6) < lengths.unsqueeze(1)
    torch.testing.assert_close(packed.logits, dense.logits[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.alphas, dense.alphas * real.unsqueeze(-1), atol=1e-6, rtol=1e-5)
    assert packed.alphas.shape == dense.alphas.shape and torch.equal(packed.betas, real.float())


def test_the_map_is_a_chosen_layer_and_head_of_the_cross_attention():
    dec = _model().decoder.eval()
    a, mask, grid = masked_annotations()
    keys = dec.attention.prepare(a, grid, mask)
    words = torch.full((3,), 1)
    memory, *layer_keys = dec.attention.split(keys)
    with torch.no_grad():
        _, _, last = dec.step(words, dec.init_state(a), a, keys, mask)
        dec.select_map(0, 1)
        _, _, head = dec.step(words, dec.init_state(a), a, keys, mask)
        x = dec._inputs(words.unsqueeze(1), 0).squeeze(1)
        y, _ = dec.layers[0].self_attn.step(dec.layers[0].norms[0](x), dec.init_state(a)[0])
        want = dec.attention.cross[0](memory, layer_keys[0], dec.layers[0].norms[1](x + y), mask)
    torch.testing.assert_close(head.alpha, want.heads[:, 1])
    assert not torch.allclose(head.alpha, last.alpha)
    torch.testing.assert_close(head.alpha.sum(-1), torch.ones(3))
    with pytest.raises(ValueError, match="layer 2 does not exist"):
        dec.select_map(2)
    with pytest.raises(ValueError, match="head 2 does not exist"):
        dec.select_map(-1, 2)
    with pytest.raises(ValueError, match="needs attention=multihead"):
        _model("soft").decoder.select_map(-1, 0)


def test_learned_positions_refuse_captions_past_their_table():
    dec = _model(positions="learned", max_positions=4).decoder
    a, _, grid = masked_annotations()
    with pytest.raises(ValueError, match="max_positions"):
        dec(a, padded_captions(3, 6), grid=grid)  # 5 positions
    state = dec.init_state(a)
    keys = dec.attention.prepare(a, grid)
    for _ in range(4):
        _, state, _ = dec.step(torch.full((3,), 4), state, a, keys)
    with pytest.raises(ValueError, match="max_positions"):
        dec.step(torch.full((3,), 4), state, a, keys)


def test_bf16_autocast_gives_the_float32_loss_and_float32_gradients():
    model = _model(encoder_layers=1)
    captions, idx = padded_captions(), torch.arange(3).repeat_interleave(2)
    images = torch.randn(3, 3, 32, 32)
    ref = caption_loss(model(images, captions, idx).logits, captions[:, 1:], None, pad_id=0,
                       attention_weight=0.0).token_nll
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(images, captions, idx)
    assert out.logits.dtype == torch.bfloat16
    low = caption_loss(out.logits.float(), captions[:, 1:], None, pad_id=0, attention_weight=0.0).token_nll
    assert low.item() == pytest.approx(ref.item(), rel=2e-2)
    low.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()
               for p in model.parameters())
