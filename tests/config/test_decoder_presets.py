"""The COCO presets of the compared decoders carry the published settings (not run here: no COCO, no GPU). That
every preset validates is tests/config/test_schema.py's test."""

import pytest
import torch
from fixtures import compose_config
from hydra.utils import instantiate

from captioning.factory.models import build_captioner, model_config
from captioning.models.decoders.transformer import TransformerDecoder
from captioning.models.decoders.updown import UpDownDecoder


def test_updown_has_anderson_et_als_sizes_and_ruotianluos_schedule():
    cfg = compose_config("experiment=coco_updown", "encoder.pretrained=false")
    model = build_captioner(model_config(cfg), 10000)
    dec = model.decoder
    assert isinstance(dec, UpDownDecoder) and model.encoder.out_dim == 2048
    assert dec.att_lstm.hidden_size == 1000 and dec.lang_lstm.hidden_size == 1000 and dec.embed.embedding_dim == 1000
    assert dec.attention.W_a.out_features == 512 and cfg.decoder.dropout == 0.5
    opt = instantiate(cfg.optim)([torch.nn.Parameter(torch.zeros(1))])
    sched = instantiate(cfg.scheduler)(opt)
    rates = []
    for _ in range(7):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates == pytest.approx([5e-4] * 3 + [4e-4] * 3 + [3.2e-4])
    assert (cfg.dataset.batch_unit, cfg.dataset.batch_size, cfg.trainer.max_epochs) == ("images", 10, 30)


def test_transformer_has_the_published_sizes_and_warmup():
    cfg = compose_config("experiment=coco_transformer", "encoder.pretrained=false")
    dec = build_captioner(model_config(cfg), 10000).decoder
    assert isinstance(dec, TransformerDecoder)
    assert (len(dec.layers), len(dec.attention.encoder), dec.d_model, dec.num_heads) == (6, 6, 512, 8)
    assert dec.layers[0].ff.w_1.out_features == 2048 and dec.attention.layer(0).num_heads == 8
    opt = instantiate(cfg.optim)([torch.nn.Parameter(torch.zeros(1))])
    assert tuple(opt.param_groups[0]["betas"]) == (0.9, 0.98) and opt.param_groups[0]["eps"] == 1e-9
    sched = instantiate(cfg.scheduler)(opt)
    for _ in range(19999):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(512 ** -0.5 * 20000 ** -0.5)  # NoamOpt's peak, step 20000
    assert (cfg.dataset.batch_size, cfg.trainer.max_epochs) == (10, 15)
