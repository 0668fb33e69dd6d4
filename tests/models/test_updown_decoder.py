"""decoder=updown with every attention in conf/attention/: shapes, normalisation, gradients, decoding, step parity.

The fast teacher forcing is compared with `forward_plain` (lengths, gradients) in tests/models/test_fast_path.py,
and one SCST step per attention in tests/training/test_scst.py (both loop over conf/decoder/)."""

from __future__ import annotations

import pytest
import torch
from fixtures import TINY_MODEL, assert_every_parameter_learns, compose_tiny_train, masked_annotations, padded_captions
from omegaconf import OmegaConf

from captioning.factory.checkpoints import load_model
from captioning.factory.models import build_captioner
from captioning.models.decoder import mean_annotation
from captioning.models.decoding import beam_search, greedy_decode
from captioning.models.updown_decoder import UpDownDecoder
from captioning.runtime import CONF_DIR
from captioning.train import train
from captioning.training.losses import MovingAverageBaseline, caption_loss, hard_attention_loss

CONF = CONF_DIR
NAMES = sorted(p.stem for p in (CONF / "attention").glob("*.yaml"))
SMALL = {"attention_dim": 8, "predictor_dim": 8, "num_filters": 3, "kernel_size": 3, "num_heads": 2, "head_dim": 4,
         "half_width": 2}
V = 12


def _model(name: str, **decoder):
    """A tiny captioner: SmallCNN, conf/attention/<name>.yaml shrunk, conf/decoder/updown.yaml shrunk."""
    attention = OmegaConf.to_container(OmegaConf.load(CONF / "attention" / f"{name}.yaml"))
    attention = {k: SMALL.get(k, v) for k, v in attention.items()}
    dec = {**OmegaConf.to_container(OmegaConf.load(CONF / "decoder" / "updown.yaml")),
           "embed_dim": 16, "hidden_dim": 24, "dropout": 0.0, **decoder}
    torch.manual_seed(0)
    return build_captioner({**TINY_MODEL, "attention": attention, "decoder": dec}, vocab_size=V)


def test_conf_decoder_updown_builds_the_two_lstms_with_zero_states():
    model = _model("soft")
    dec = model.decoder
    assert isinstance(dec, UpDownDecoder) and dec.init_h is None
    D = dec.lang_lstm.input_size - 24  # [z_t; h1_t]
    assert dec.att_lstm.input_size == 16 + D + 24 and dec.att_lstm.hidden_size == dec.lang_lstm.hidden_size == 24
    _, mask, _ = masked_annotations()
    a = torch.randn(3, 20, D)  # (B, L, D)
    h1, c1, h2, c2, alpha0 = dec.init_state(a, mask)
    assert all((x == 0).all() and x.shape == (3, 24) for x in (h1, c1, h2, c2))  # the paper's zero states
    torch.testing.assert_close(alpha0.sum(-1), torch.ones(3))
    v_mean = mean_annotation(a, mask)[0]  # (B, D): over the valid regions only
    torch.testing.assert_close(v_mean[0], a[0, mask[0]].mean(0))
    torch.testing.assert_close(v_mean[1], a[1].mean(0))
    h1, c1, h2, c2, _ = _model("soft", init_from_annotations=True).decoder.init_state(a, mask)
    assert not torch.equal(h1, h2) and (h1.abs() > 0).all() and (c2.abs() > 0).all()  # an MLP of v_mean each


@pytest.mark.parametrize("name", NAMES)
def test_padded_regions_change_nothing(name):
    """Annotations in padded regions reach neither the mean annotation nor attention: the outputs are the same."""
    dec = _model(name).decoder.eval()
    a, mask, grid = masked_annotations()
    captions, idx = padded_captions(), torch.tensor([0, 0, 1, 1, 2, 2])
    noisy = a.clone()
    noisy[~mask] = 100.0
    with torch.no_grad():
        out, other = dec(a, captions, idx, mask=mask, grid=grid), dec(noisy, captions, idx, mask=mask, grid=grid)
    torch.testing.assert_close(out.logits, other.logits)
    assert (out.alphas[:2][..., ~mask[0]] == 0).all()


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
    assert (out.log_probs <= 0).all() and (out.entropies >= 0).all()
    terms = hard_attention_loss(out.logits, captions[:, 1:], out.alphas, out.log_probs, out.entropies, 0,
                                MovingAverageBaseline(0.9), reward_weight=1.0, entropy_weight=0.01)
    terms.total.backward()
    assert_every_parameter_learns(model)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("init_from_annotations", [False, True])
def test_teacher_forcing_equals_step_by_step(name, init_from_annotations):
    dec = _model(name, init_from_annotations=init_from_annotations).decoder.eval()
    a, mask, grid = masked_annotations()
    captions, idx = padded_captions(), torch.tensor([0, 0, 1, 1, 2, 2])
    with torch.no_grad():
        out = dec(a, captions, idx, mask=mask, grid=grid)
        keys = dec.attention.prepare(a, grid)[idx]
        state = dec.init_state(a[idx], mask[idx])
        for t in range(captions.shape[1] - 1):
            prev_alpha = state[4]
            logits, state, att = dec.step(captions[:, t], state, a[idx], keys, mask[idx])
            torch.testing.assert_close(logits, out.logits[:, t], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(att.alpha, out.alphas[:, t], atol=1e-6, rtol=1e-5)
            # y_t's map is computed from h1_t, the attention LSTM's state after this step (and alpha_{t-1})
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
    assert losses[-1] < 0.05 * losses[0], (losses[0], losses[-1])


def test_train_app_with_the_updown_decoder(shapes_json, tmp_path):
    cfg = compose_tiny_train(shapes_json, "decoder=updown", "decoder.embed_dim=16", "decoder.hidden_dim=32",
                             "attention=soft", "attention.attention_dim=16", "trainer.max_epochs=1")
    metrics = train(cfg, tmp_path)
    assert 0 <= metrics["Bleu_4"] <= 1 and len(list((tmp_path / "figures").glob("*.png"))) >= 1
    model, _, _ = load_model(tmp_path / "checkpoints" / "best.pt")
    assert isinstance(model.decoder, UpDownDecoder)
