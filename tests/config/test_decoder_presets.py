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


@pytest.mark.parametrize(("preset", "sizes"), [
    ("coco_fc", {"lstm.hidden_size": 512, "embed.embedding_dim": 512}),
    ("coco_att2in", {"hidden_dim": 512, "embed.embedding_dim": 512, "attention.W_a.out_features": 512}),
    ("coco_att2all", {"hidden_dim": 512, "embed.embedding_dim": 512, "W_I.out_features": 5 * 512}),
    ("coco_adaptive", {"hidden_dim": 512, "embed.embedding_dim": 512, "attention.inner.W_a.out_features": 512}),
    ("coco_aoa", {"hidden_dim": 1024, "embed.embedding_dim": 1024, "attention.inner.num_heads": 8}),
    ("coco_m2", {"d_model": 512, "num_heads": 8, "attention.levels": 3}),
])
def test_the_zoo_presets_have_their_papers_sizes(preset, sizes):
    cfg = compose_config(f"experiment={preset}", "encoder.pretrained=false")
    model = build_captioner(model_config(cfg), 10000)
    for path, want in sizes.items():
        value = model.decoder
        for part in path.split("."):
            value = getattr(value, part)
        assert value == want, (preset, path)
    assert cfg.decoder.dropout == (0.1 if preset == "coco_m2" else 0.5) and cfg.trainer.monitor == "CIDEr"
    if preset == "coco_aoa":
        assert len(model.decoder.attention.transform.layers) == 6
    if preset == "coco_m2":  # 40 memory slots in each of the 3 encoder layers, 3 decoder layers
        assert [layer.self_attn.slots for layer in model.decoder.attention.encoder] == [40] * 3
        assert len(model.decoder.layers) == 3 and cfg.scheduler.warmup_steps == 10000


@pytest.mark.parametrize("preset", ["coco_att2in_scst", "coco_att2all_scst", "coco_aoa_scst", "coco_m2_scst"])
def test_the_zoo_scst_presets_fine_tune_their_model(preset):
    cfg = compose_config(f"experiment={preset}", "encoder.pretrained=false")
    base = compose_config(f"experiment={preset.removesuffix('_scst')}", "encoder.pretrained=false")
    assert cfg.objective._target_ == "scst" and cfg.decoder == base.decoder and cfg.optim.lr < base.optim.lr
    assert cfg.objective.baseline == ("mean" if preset == "coco_m2_scst" else "greedy")
