"""decoder=luong: what only it holds (its config, a trained run's checkpoint). What every decoder holds (shapes, maps,
gradients, packed = plain, beam 1 = greedy, overfitting) is tests/models/test_decoders.py's."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures import TINY_MODEL, compose_tiny_train
from omegaconf import OmegaConf

from captioning.factory.load import load_model
from captioning.factory.models import build_captioner
from captioning.models.decoders.luong import LuongDecoder
from captioning.runtime import CONF_DIR
from captioning.train import train

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
