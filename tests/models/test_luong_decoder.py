"""decoder=luong with every attention in conf/attention/: shapes, normalisation, gradients, decoding, step parity."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures import TINY_MODEL, assert_every_parameter_learns, compose_tiny_train, masked_annotations, padded_captions
from omegaconf import OmegaConf

from captioning.factory.checkpoints import load_model
from captioning.factory.models import build_captioner
from captioning.models.decoding import beam_search, greedy_decode
from captioning.models.luong_decoder import LuongDecoder
from captioning.runtime import CONF_DIR
from captioning.train import train
from captioning.training.losses import MovingAverageBaseline, caption_loss, hard_attention_loss

CONF = CONF_DIR
NAMES = sorted(p.stem for p in (CONF / "attention").glob("*.yaml"))
SMALL = {"attention_dim": 8, "predictor_dim": 8, "num_filters": 3, "kernel_size": 3, "num_heads": 2, "head_dim": 4,
         "half_width": 2}
V = 12


def _model(name: str, **decoder):
    """A tiny captioner: SmallCNN, conf/attention/<name>.yaml shrunk, conf/decoder/luong.yaml shrunk."""
    attention = OmegaConf.to_container(OmegaConf.load(CONF / "attention" / f"{name}.yaml"))
    attention = {k: SMALL.get(k, v) for k, v in attention.items()}
    dec = {**OmegaConf.to_container(OmegaConf.load(CONF / "decoder" / "luong.yaml")),
           "embed_dim": 16, "hidden_dim": 24, "dropout": 0.0, **decoder}
    torch.manual_seed(0)
    return build_captioner({**TINY_MODEL, "attention": attention, "decoder": dec}, vocab_size=V)


def test_conf_decoder_luong_builds_a_luong_decoder():
    model = _model("soft")
    assert isinstance(model.decoder, LuongDecoder) and model.decoder.input_feeding
    assert model.decoder.lstm.input_size == 16 + 24  # [E y_{t-1}; h~_{t-1}]
    assert _model("soft", input_feeding=False).decoder.lstm.input_size == 16


@pytest.mark.parametrize("name", NAMES)
def test_shapes_alphas_and_every_parameter_gets_a_gradient(name):
    model = _model(name)
    captions, idx = padded_captions(), torch.arange(3).repeat_interleave(2)
    if name == "hard":
        model.decoder.attention.sample_this_batch = False  # the expected context; sampling is tested below
    out = model(torch.randn(3, 3, 32, 32), captions, idx)
    N, T = 6, 6
    assert out.logits.shape == (N, T, V) and out.alphas.shape == (N, T, 64) and out.betas.shape == (N, T)
    torch.testing.assert_close(out.alphas.sum(-1), torch.ones(N, T))
    assert (out.betas == 1).all() and out.log_probs is None
    caption_loss(out.logits, captions[:, 1:], out.alphas, pad_id=0).total.backward()
    assert_every_parameter_learns(model)


def test_hard_attention_samples_and_reinforce_reaches_every_parameter():
    model = _model("hard")
    model.decoder.attention.sample_this_batch = True
    captions = padded_captions()
    torch.manual_seed(3)
    out = model(torch.randn(3, 3, 32, 32), captions, torch.arange(3).repeat_interleave(2))
    assert out.log_probs.shape == (6, 6) and out.entropies.shape == (6, 6)
    # each step's context is one region: the sampled alpha is a proper distribution with log p(s) <= 0
    assert (out.log_probs <= 0).all() and (out.entropies >= 0).all()
    terms = hard_attention_loss(out.logits, captions[:, 1:], out.alphas, out.log_probs, out.entropies, 0,
                                MovingAverageBaseline(0.9), reward_weight=1.0, entropy_weight=0.01)
    terms.total.backward()
    assert_every_parameter_learns(model)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("input_feeding", [True, False])
def test_teacher_forcing_equals_step_by_step(name, input_feeding):
    dec = _model(name, input_feeding=input_feeding).decoder.eval()
    a, mask, grid = masked_annotations()
    captions, idx = padded_captions(), torch.tensor([0, 0, 1, 1, 2, 2])
    with torch.no_grad():
        out = dec(a, captions, idx, mask=mask, grid=grid)
        keys = dec.attention.prepare(a, grid)[idx]
        state = dec.init_state(a[idx], mask[idx])
        for t in range(captions.shape[1] - 1):
            prev_alpha = state[3]
            logits, state, att = dec.step(captions[:, t], state, a[idx], keys, mask[idx])
            torch.testing.assert_close(logits, out.logits[:, t], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(att.alpha, out.alphas[:, t], atol=1e-6, rtol=1e-5)
            # y_t's map is computed from h_t, the state after this step's LSTM update (and alpha_{t-1})
            again = dec.attention(a[idx], keys, state[0], mask[idx], prev_alpha)
            torch.testing.assert_close(att.alpha, again.alpha)
            assert (att.alpha[~mask[idx]] == 0).all()


@pytest.mark.parametrize("name", NAMES)
def test_beam_size_one_is_greedy(name):
    dec = _model(name).decoder.eval()
    a, mask, grid = masked_annotations(4)
    g = greedy_decode(dec, a, max_len=8, mask=mask, grid=grid)
    b = beam_search(dec, a, beam_size=1, max_len=8, mask=mask, grid=grid)
    assert g.tokens == b.tokens
    torch.testing.assert_close(g.scores, b.scores)
    for ga, ba in zip(g.alphas, b.alphas):
        torch.testing.assert_close(ga, ba)
        torch.testing.assert_close(ga.sum(-1), torch.ones(ga.shape[0]))
    assert (g.alphas[0][:, ~mask[0]] == 0).all()
    assert len(beam_search(dec, a, beam_size=3, max_len=8, mask=mask, grid=grid).tokens) == 4


@pytest.mark.parametrize("name", NAMES)
def test_a_tiny_model_overfits_one_batch(name):
    dec = _model(name).decoder.train()
    a, mask, grid = masked_annotations(6)
    captions, idx = padded_captions(), torch.arange(6)  # one caption per image: nothing ambiguous to learn
    if name == "hard":
        dec.attention.expected_context_prob = 1.0  # the expected context: a deterministic gradient
    opt = torch.optim.Adam(dec.parameters(), lr=1e-2)
    losses = []
    for _ in range(100):
        dec.attention.begin_batch()
        out = dec(a, captions, idx, mask=mask, grid=grid)
        loss = caption_loss(out.logits, captions[:, 1:], out.alphas, pad_id=0, attention_weight=0.0).token_nll
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.05 * losses[0], (losses[0], losses[-1])  # about 2.5 -> 0.005 on CPU


@pytest.mark.parametrize("attention", ["hard", pytest.param("local", marks=pytest.mark.slow)])
def test_train_app_with_the_luong_decoder(shapes_json, tmp_path, attention):
    cfg = compose_tiny_train(shapes_json, "decoder=luong", "decoder.embed_dim=16", "decoder.hidden_dim=32",
                   f"attention={attention}", "trainer.max_epochs=1", "objective.attention_weight=1.0",
                   "attention.expected_context_prob=0.0" if attention == "hard" else "attention.half_width=2")
    metrics = train(cfg, tmp_path)
    assert 0 <= metrics["Bleu_4"] <= 1 and len(list((tmp_path / "figures").glob("*.png"))) >= 1
    if attention == "hard":  # every batch sampled regions: the REINFORCE terms were logged
        assert "policy" in json.loads((tmp_path / "history.json").read_text())[0]
    model, _, _ = load_model(tmp_path / "checkpoints" / "best.pt")
    assert isinstance(model.decoder, LuongDecoder)
