"""Value checks of the soft-attention captioner (shapes, alpha normalisation, masks, gradients) and its registry."""

import re
from typing import Any, Literal

import pytest
import torch
from fixtures import TINY_MODEL, assert_every_parameter_learns, cancelling_entries, shift_cancelling_entries
from omegaconf import OmegaConf

from captioning.checkpoint.moved import NAMED
from captioning.factory import registry
from captioning.factory.models import build_captioner
from captioning.models.attention import SoftAttention
from captioning.runtime import CONF_DIR
from captioning.training.losses import caption_loss


def _batch(B=3, caps_per_image=2, T=7, V=12):
    torch.manual_seed(1)
    images = torch.randn(B, 3, 32, 32)
    captions = torch.randint(4, V, (B * caps_per_image, T))
    captions[:, 0] = 1
    captions[0, 5:] = 0  # a padded caption
    return images, captions, torch.arange(B).repeat_interleave(caps_per_image)


def test_output_shapes_and_alphas_sum_to_one(tiny_model):
    images, captions, idx = _batch()
    a, grid = tiny_model.encode(images)
    assert a.shape == (3, 64, 16) and grid == (8, 8)  # (B, L, D)
    out = tiny_model(images, captions, idx)
    N, T = captions.shape[0], captions.shape[1] - 1
    assert out.logits.shape == (N, T, 12)
    assert out.alphas.shape == (N, T, 64)
    assert out.betas.shape == (N, T) and ((out.betas > 0) & (out.betas < 1)).all()
    torch.testing.assert_close(out.alphas.sum(-1), torch.ones(N, T))


def test_captions_of_one_image_share_its_encoding(tiny_model):
    images, captions, idx = _batch()
    tiny_model.eval()
    out = tiny_model(images, captions, idx)
    # The same caption fed for image 1 alone gives the same logits as inside the batch.
    alone = tiny_model(images[1:2], captions[2:3], torch.zeros(1, dtype=torch.long))
    torch.testing.assert_close(alone.logits[0], out.logits[2], atol=1e-5, rtol=1e-5)


def test_every_parameter_gets_a_gradient(tiny_model):
    images, captions, idx = _batch()
    out = tiny_model(images, captions, idx)
    caption_loss(out.logits, captions[:, 1:], out.alphas, pad_id=0).total.backward()
    assert_every_parameter_learns(tiny_model)


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_the_score_bias_changes_no_output(attention):
    """What assert_every_parameter_learns expects a zero gradient of: the attention's score bias b (e + b on every
    region's score) changes no logit, alpha, sampled region, log p(s_t) or entropy."""
    config = {**TINY_MODEL["attention"], "_target_": attention}
    torch.manual_seed(0)
    model = build_captioner({**TINY_MODEL, "attention": config}, vocab_size=12).train()
    images, captions, idx = _batch()
    outs = []
    for _ in range(2):
        torch.manual_seed(4)
        outs.append(model(images, captions, idx))
        shift_cancelling_entries(model)
    assert set(cancelling_entries(model)) == {"decoder.attention.w.bias"}
    for name in ("logits", "alphas", "log_probs", "entropies"):
        want, got = getattr(outs[0], name), getattr(outs[1], name)
        assert (want is None) == (attention == "soft" and name in ("log_probs", "entropies")), name
        if want is not None:
            torch.testing.assert_close(got, want)


def test_masked_regions_get_zero_weight():
    torch.manual_seed(0)
    att = SoftAttention(annotation_dim=6, hidden_dim=5, attention_dim=4)
    a, h = torch.randn(2, 9, 6), torch.randn(2, 5)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, 4:] = False  # image 0 has a smaller grid
    out = att(a, att.prepare(a), h, mask)
    assert (out.alpha[0, 4:] == 0).all()
    torch.testing.assert_close(out.alpha.sum(-1), torch.ones(2))
    torch.testing.assert_close(out.context[0], out.alpha[0, :4] @ a[0, :4])


def test_state_init_uses_the_mean_annotation(tiny_model):
    dec = tiny_model.decoder
    a = torch.randn(2, 10, 16)
    h, c, alpha0 = dec.init_state(a)
    torch.testing.assert_close(h, torch.tanh(dec.init_h(a.mean(1))))
    torch.testing.assert_close(c, torch.tanh(dec.init_c(a.mean(1))))
    torch.testing.assert_close(alpha0, torch.full((2, 10), 0.1))


# -- the registry: the one place a model's classes come from ---------------------------------------------------
CONF = CONF_DIR


@pytest.mark.parametrize("group", ["encoder", "attention", "decoder"])
def test_every_conf_target_is_registered_and_its_arguments_pass_the_check(group):
    files = sorted((CONF / group).glob("*.yaml"))
    assert files
    for path in files:
        spec = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        spec.pop("defaults", None)  # Hydra's, not an argument (conf/decoder/transformer.yaml picks its attention)
        cls, kwargs = registry.resolve(group, spec, f"{path.name}")  # raises, naming the file, when it is not
        assert registry.GROUPS[group][spec["_target_"]] is cls and "_target_" not in kwargs


@pytest.mark.parametrize("group", sorted(registry.GROUPS))
def test_registry_keys_are_names_and_every_old_import_path_maps_to_one(group):
    """Components are registered under stable names, not import paths (a module can move); each import path a
    config or checkpoint named before maps to the name of a registered component (checkpoint/moved.py `NAMED`)."""
    for name in registry.GROUPS[group]:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
    names = {n for table in registry.GROUPS.values() for n in table}
    assert set(NAMED.values()) <= names
    for old, name in NAMED.items():
        module, cls_name = old.rsplit(".", 1)
        cls = next(table[name] for table in registry.GROUPS.values() if name in table)
        assert getattr(cls, "__name__", "") == cls_name, (old, name)


def test_build_captioner_takes_classes_from_the_registry_only():
    spec = {**TINY_MODEL, "encoder": {**TINY_MODEL["encoder"], "_target_": "torch.nn.Identity"}}
    with pytest.raises(registry.ModelSpecError, match=r"^encoder\._target_ 'torch\.nn\.Identity' is not one of this "
                       r"project's encoders \(small_cnn, vgg, resnet"):
        build_captioner(spec, vocab_size=12)
    with pytest.raises(registry.ModelSpecError, match=r"^decoder\.hidden_size is not an argument of "
                       r"ShowAttendTellDecoder \(it takes embed_dim, hidden_dim"):
        build_captioner({**TINY_MODEL, "decoder": {**TINY_MODEL["decoder"], "hidden_size": 8}}, vocab_size=12)


def test_a_hydra_config_and_a_plain_dict_build_the_same_model():
    torch.manual_seed(0)
    from_dict = build_captioner(TINY_MODEL, vocab_size=12)
    torch.manual_seed(0)
    from_cfg = build_captioner(OmegaConf.create(TINY_MODEL), vocab_size=12)
    assert type(from_cfg.decoder.attention) is SoftAttention and from_cfg.decoder.attention.W_a.out_features == 16
    for (n1, p1), (n2, p2) in zip(from_dict.state_dict().items(), from_cfg.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)


@pytest.mark.parametrize("value, annotation, ok", [
    (3, int, True), (True, int, False), (3.0, int, False), (3, float, True), ("3", float, False),
    (None, float | None, True), ([1, 2], tuple[int, ...], True), ([1, "2"], tuple[int, ...], False),
    ("top", Literal["none", "top"], True), ("all", Literal["none", "top"], False), (1, Literal[True], False),
    ({"a": 1}, dict[str, int], False), (["a", 1], Any, True),
])
def test_value_types_are_checked_against_the_signature(value, annotation, ok):
    assert registry._matches(value, annotation) is ok
