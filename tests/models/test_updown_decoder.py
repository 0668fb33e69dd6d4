"""decoder=updown: what only it holds (two LSTMs with zero states, padded regions, a trained run). What every
decoder holds (shapes, maps, gradients, packed = plain, beam 1 = greedy, overfitting) is tests/models/test_decoders.py's,
and one SCST step per attention tests/training/test_scst.py's."""

from __future__ import annotations

import pytest
import torch
from fixtures import TINY_MODEL, compose_tiny_train, masked_annotations, padded_captions
from omegaconf import OmegaConf

from captioning.factory.load import load_model
from captioning.factory.models import build_captioner
from captioning.models.decoders.base import mean_annotation
from captioning.models.decoders.updown import UpDownDecoder
from captioning.runtime import CONF_DIR
from captioning.train import train

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


def test_train_app_with_the_updown_decoder(shapes_json, tmp_path):
    cfg = compose_tiny_train(shapes_json, "decoder=updown", "decoder.embed_dim=16", "decoder.hidden_dim=32",
                             "attention=soft", "attention.attention_dim=16", "trainer.max_epochs=1")
    metrics = train(cfg, tmp_path)
    assert 0 <= metrics["Bleu_4"] <= 1 and len(list((tmp_path / "figures").glob("*.png"))) >= 1
    model, _, _ = load_model(tmp_path / "checkpoints" / "best.pt")
    assert isinstance(model.decoder, UpDownDecoder)
