"""Multi-representational attention (`attention=multirep`, captioning/models/multirep.py) and the encoder that gives
it several representations (`encoder=multi`, captioning/models/multi_encoder.py): one representation is the single
encoder's model exactly; two weigh their maps and contexts by a softmax over representations; each encoder gets the
input it gets alone; a cache per encoder reads as the multi encoder computes; and what cannot work is refused in one
line. (The family's shared suite runs `multirep-2` with every decoder; the export test `multi-encoder-multirep`.)"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from fixtures import compose_tiny_train
from PIL import Image

from captioning.factory import registry
from captioning.factory.models import build_captioner
from captioning.features.cache import open_features
from captioning.features.extract import extract_features
from captioning.models.attention import SoftAttention
from captioning.models.encoder import SmallCNN
from captioning.models.multi_encoder import MultiEncoder
from captioning.models.multirep import MultiRepAttention
from captioning.train import train

REPO = Path(__file__).resolve().parents[2]
CHILDREN = [{"encoder": "small_cnn", "channels": [8, 16], "num_pools": 2, "image_size": 32},
            {"encoder": "small_cnn", "channels": [4, 6], "num_pools": 2, "image_size": 32, "coord_channels": False}]


def _data(B: int = 3, k: int = 2, D: int = 10, L: int = 20):
    g = torch.Generator().manual_seed(3)
    a, h = torch.randn(B, L, D, generator=g, dtype=torch.float64), torch.randn(B * k, 7, generator=g,
                                                                               dtype=torch.float64)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[0, 13:] = False  # image 0 has 13 real regions
    return a, h, mask


def test_one_representation_is_soft_attention_bit_for_bit():
    a, h, mask = _data()
    torch.manual_seed(0)
    soft = SoftAttention(10, 7, 8).double()
    torch.manual_seed(0)
    multi = MultiRepAttention(10, 7, 8).double()
    assert multi.P is None and sum(p.numel() for p in multi.parameters()) == sum(p.numel() for p in soft.parameters())
    for m in (None, mask):
        want, got = soft(a, soft.prepare(a), h, m), multi(a, multi.prepare(a), h, m)
        assert torch.equal(want.context, got.context) and torch.equal(want.alpha, got.alpha) and got.channels is None


def test_the_default_attention_size_is_soft_attentions_shared_among_the_representations():
    a, h, mask = _data()
    torch.manual_seed(0)
    soft = SoftAttention(10, 7)  # its default attention_dim, 128
    torch.manual_seed(0)
    one = MultiRepAttention(10, 7)  # attention_dim null: 128 / 1
    assert one.attention_dim == soft.W_a.out_features == 128
    want, got = soft(a.float(), soft.prepare(a.float()), h.float()), one(a.float(), one.prepare(a.float()), h.float())
    assert torch.equal(want.context, got.context) and torch.equal(want.alpha, got.alpha)
    two = MultiRepAttention(10, 7, representations=(4, 6))  # 64 each: two hidden layers of soft's one's size
    assert two.attention_dim == 64 and [rep.W_a.out_features for rep in two.reps] == [64, 64]
    assert two.prepare(a.float()).shape == (3, 20, 128)
    assert MultiRepAttention(10, 7, representations=(4, 6), total_attention_dim=96).attention_dim == 48
    assert MultiRepAttention(10, 7, 16, representations=(4, 6)).attention_dim == 16  # given: each gets it


def test_two_representations_weigh_each_ones_map_and_context():
    a, h, mask = _data()
    torch.manual_seed(1)
    att = MultiRepAttention(10, 7, 8, score_dim=5, representations=(4, 6)).double()
    out = att(a, att.prepare(a), h, mask)
    beta = out.channels
    assert beta.shape == (6, 2) and torch.allclose(beta.sum(1), torch.ones(6, dtype=torch.float64))
    # by hand: each representation's soft attention over its own channels, then the scorer's softmax
    a1, a2 = a[..., :4], a[..., 4:]
    o1 = att.reps[0](a1, att.reps[0].prepare(a1), h, mask)
    o2 = att.reps[1](a2, att.reps[1].prepare(a2), h, mask)
    q = att.W_r(h)
    s = torch.cat([att.u(torch.tanh(att.P[0](o1.context) + q)), att.u(torch.tanh(att.P[1](o2.context) + q))], 1)
    want_beta = torch.softmax(s, 1)
    torch.testing.assert_close(beta, want_beta, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.context, torch.cat([want_beta[:, :1] * o1.context, want_beta[:, 1:] * o2.context],
                                                      1), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.alpha, want_beta[:, :1] * o1.alpha + want_beta[:, 1:] * o2.alpha,
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(out.alpha.sum(1), torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-12)
    assert (out.alpha[:2, 13:] == 0).all()  # image 0's padded regions (its k = 2 rows) get exactly nothing
    # a scorer with zero weights scores the representations alike: half each, each context halved
    with torch.no_grad():
        for p in (att.W_r.weight, att.W_r.bias, att.P[0].weight, att.P[1].weight):
            p.zero_()
    out = att(a, att.prepare(a), h, mask)
    assert torch.equal(out.channels, torch.full((6, 2), 0.5, dtype=torch.float64))
    assert torch.equal(out.context, torch.cat([0.5 * o1.context, 0.5 * o2.context], 1))


def test_representation_widths_that_do_not_add_up_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^attention=multirep: the representations' widths \[4, 5\] add up to 9, "
                                         r"not to the annotations' 10 channels[^\n]*$"):
        MultiRepAttention(10, 7, representations=(4, 5))


def _image(seed: int, size: int = 40) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size, size + 3, 3), dtype=np.uint8))


def test_the_multi_encoder_gives_each_encoder_the_input_it_gets_alone():
    torch.manual_seed(0)
    first = SmallCNN(channels=(8, 16), num_pools=2, image_size=32)
    second = SmallCNN(channels=(4, 6), num_pools=2, image_size=32, coord_channels=False)
    multi = MultiEncoder([first, second]).eval()
    assert multi.widths == (16, 6) and multi.out_dim == 22
    images = [_image(i) for i in range(3)]
    with torch.no_grad():
        got = multi(torch.stack([multi.transform()(im) for im in images]))
        alone = [enc(torch.stack([enc.transform()(im) for im in images])) for enc in (first, second)]
    assert torch.equal(got, torch.cat(alone, 1))
    assert multi.view(images[0]).size == first.view(images[0]).size == (32, 32)
    assert not any(k.startswith(("mean", "std")) for k in multi.state_dict())  # the normalisation is config


def test_encoders_that_see_other_pixels_or_give_other_grids_are_refused():
    with pytest.raises(ValueError, match=r"^encoder=multi: encoder\.encoders\[1\] resizes and crops the image as "
                                         r"[^\n]*same image_size\)$"):
        MultiEncoder([SmallCNN(image_size=32), SmallCNN(image_size=40)])
    other_grid = MultiEncoder([SmallCNN(num_pools=2, image_size=32), SmallCNN(num_pools=3, image_size=32)])
    with pytest.raises(ValueError, match=r"^encoder=multi: the encoders' grids differ \(\(8, 8\), \(4, 4\)\)"):
        other_grid(torch.zeros(1, 3, 32, 32))
    with pytest.raises(ValueError, match="at least one encoder"):
        MultiEncoder([])


@pytest.mark.parametrize(("encoders", "message"), [
    ([{"encoder": "multi", "encoders": []}], r"encoder\.encoders\[0\]\.encoder: an encoder=multi cannot hold"),
    ([{"channels": [8]}], r"encoder\.encoders\[0\] must be a mapping whose `encoder` key names"),
    ([{"encoder": "small_cnn", "widht": 3}], r"encoder\.encoders\[0\]\.widht is not an argument of SmallCNN"),
    ([{"encoder": "small_cnn", "_target_": "vgg"}], r"encoder\.encoders\[0\]\._target_ is a Hydra instantiation"),
])
def test_a_bad_multi_encoder_spec_is_refused_naming_the_entry(encoders, message):
    with pytest.raises(registry.ModelSpecError, match=message):
        registry.build("encoder", {"_target_": "multi", "encoders": encoders})


def test_a_checkpoint_of_pretrained_encoders_loads_without_downloading_any():
    from captioning.factory.load import no_downloads

    spec = {"_target_": "multi", "encoders": [{"encoder": "resnet", "arch": "resnet18", "pretrained": True},
                                              {"encoder": "small_cnn"}, {"encoder": "vgg", "pretrained": True}]}
    assert no_downloads(spec)["encoders"] == [{"encoder": "resnet", "arch": "resnet18", "pretrained": False},
                                              {"encoder": "small_cnn"}, {"encoder": "vgg", "pretrained": False}]
    assert spec["encoders"][0]["pretrained"] is True  # the stored config is not changed
    assert no_downloads({"_target_": "resnet", "pretrained": True}) == {"_target_": "resnet", "pretrained": False}


def _spec(encoder: dict, attention: str) -> dict:
    return {"encoder": encoder, "attention": {"_target_": attention, "attention_dim": 8},
            "decoder": {"_target_": "sat", "embed_dim": 6, "hidden_dim": 7, "dropout": 0.0}}


def test_multi_with_one_encoder_and_multirep_is_the_single_encoder_soft_model():
    """Same seed, same draws: encoder=multi of one small_cnn with attention=multirep computes what small_cnn with
    attention=soft computes, teacher-forced and decoding, to the bit."""
    single = {"_target_": "small_cnn", **{k: v for k, v in CHILDREN[0].items() if k != "encoder"}}
    models = []
    for encoder, attention in ((single, "soft"), ({"_target_": "multi", "encoders": CHILDREN[:1]}, "multirep")):
        torch.manual_seed(0)
        models.append(build_captioner(_spec(encoder, attention), 11).eval())
    images = [_image(i) for i in range(4)]
    pixels = [torch.stack([m.encoder.transform()(im) for im in images]) for m in models]
    captions = torch.randint(3, 11, (4, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = (m(x, captions) for m, x in zip(models, pixels))
    assert torch.equal(want.logits, got.logits) and torch.equal(want.alphas, got.alphas)
    (d1, _), (d2, _) = (m.generate(x, beam_size=3, max_len=8) for m, x in zip(models, pixels))
    assert d1.tokens == d2.tokens and all(torch.equal(x, y) for x, y in zip(d1.alphas, d2.alphas))


def test_two_encoders_give_multirep_their_widths_and_decoding_their_weights():
    torch.manual_seed(0)
    model = build_captioner(_spec({"_target_": "multi", "encoders": CHILDREN}, "multirep"), 11).eval()
    assert model.decoder.attention.widths == (16, 6)
    decoded, grid = model.generate(torch.stack([model.encoder.transform()(_image(i)) for i in range(2)]),
                                   beam_size=2, max_len=5)
    assert grid == (8, 8)
    for channels in decoded.channels:  # each word's representation weights, beside its map
        assert channels.shape[1] == 2 and torch.allclose(channels.sum(1), torch.ones(len(channels)))
    torch.manual_seed(0)  # another attention reads the concatenated channels as one representation
    assert build_captioner(_spec({"_target_": "multi", "encoders": CHILDREN}, "soft"), 11).decoder.attention.annotation_dim == 22


def test_one_cache_per_encoder_reads_as_the_multi_encoder_computes(shapes_json, tmp_path):
    from captioning.data.readers.karpathy import read_karpathy

    records = read_karpathy(shapes_json, "test")[:5]
    torch.manual_seed(0)
    multi = registry.build("encoder", {"_target_": "multi", "encoders": CHILDREN}).requires_grad_(False).eval()
    spec = {"_target_": "multi", "encoders": CHILDREN}
    for i, (child, cfg) in enumerate(zip(multi.encoders, CHILDREN)):
        extract_features(records, child, {"_target_": "small_cnn", **{k: v for k, v in cfg.items() if k != "encoder"}},
                         tmp_path / f"cache{i}", progress=False)
    stacked = open_features([str(tmp_path / "cache0"), str(tmp_path / "cache1")], multi, spec)
    from captioning.data.images import load_image

    with torch.no_grad():
        want = multi(torch.stack([multi.transform()(load_image(r.path)) for r in records])).flatten(2).transpose(1, 2)
    for r, grid in zip(records, want):
        torch.testing.assert_close(stacked[r.image_id], grid, rtol=1e-3, atol=1e-3)  # float16 on disk
    with pytest.raises(ValueError, match=r"^dataset\.features lists 1 caches: a list needs encoder=multi with one "
                                         r"encoder per cache \(this model has 2 encoders\)"):
        open_features([str(tmp_path / "cache0")], multi, spec)
    with pytest.raises(ValueError, match="made by a different encoder"):  # each cache checked against its encoder
        open_features([str(tmp_path / "cache1"), str(tmp_path / "cache0")], multi, spec)


def test_train_app_with_two_encoders_and_multirep(shapes_json, tmp_path):
    """debug=tiny with encoder=multi attention=multirep trains, draws its figures and reloads from its checkpoint."""
    from captioning import load

    cfg = compose_tiny_train(shapes_json, "encoder=multi", "attention=multirep", "trainer.max_epochs=2")
    assert [e["channels"] for e in cfg.encoder.encoders] == [[8, 16], [4, 8]]  # conf/debug/encoder/tiny_multi.yaml
    metrics = train(cfg, tmp_path)
    assert metrics["attention"] == "multirep" and len(list((tmp_path / "figures").glob("*.png"))) >= 1
    captioner = load(tmp_path / "checkpoints" / "best.pt")
    result = captioner.caption(_image(0), beam_size=2)
    if result.words:
        assert result.channels.shape == (len(result.words), 2)
        np.testing.assert_allclose(result.channels.sum(1), 1, atol=1e-5)
    assert json.loads((tmp_path / "metrics.json").read_text())["attention"] == "multirep"
    # the survey's figure (experiments/survey_figure.py) draws one row per run from such run folders
    out = tmp_path / "survey.png"
    with mock.patch.object(sys, "argv", ["survey_figure.py", f"multirep={tmp_path}", f"again={tmp_path}",
                                         "--out", str(out)]):
        runpy.run_path(str(REPO / "experiments" / "survey_figure.py"), run_name="__main__")
    assert Image.open(out).size[1] > 100
