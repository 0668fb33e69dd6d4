"""The decoder family at test sizes: every registered decoder (and variants that take another branch of its
recurrence) with every conf/attention/ choice, small data on a padded grid, and the training loss with every term.
tests/models/test_decoders.py runs the family's checks on every pair; other model tests build from here too."""

from __future__ import annotations

import functools

import pytest
import torch
from omegaconf import OmegaConf

from captioning.factory import registry
from captioning.models.attention_family import grid_positions
from captioning.models.decoders.base import DecoderOutput
from captioning.models.packing import prefix_lengths
from captioning.runtime import CONF_DIR
from captioning.training.losses import MovingAverageBaseline, hard_attention_loss

# Every conf/attention/ choice, and variants that take another branch of its module (local-m; location's smoothing
# with sharpening; multirep over two representations, where the file's single encoder gives it one).
ATTENTION_VARIANTS = {"local-m": ("local", {"centre": "monotonic"}),
                      "location-smoothing": ("location", {"normalization": "smoothing", "sharpening": 2.0}),
                      "multirep-2": ("multirep", {"representations": [4, 6]})}  # D = 10: two representations
ATTENTIONS = sorted(p.stem for p in (CONF_DIR / "attention").glob("*.yaml")) + sorted(ATTENTION_VARIANTS)
SMALL_ATTENTION = {"attention_dim": 8, "predictor_dim": 8, "num_filters": 3, "kernel_size": 3, "num_heads": 2,
                   "head_dim": 4, "half_width": 2, "score_dim": 5}
# Test sizes of the registered decoders (a decoder missing here is built at its YAML's sizes), and variants whose
# recurrence takes another branch.
SIZES = {"sat": {"embed_dim": 6, "hidden_dim": 7, "init_layers": 2},
         "luong": {"embed_dim": 6, "hidden_dim": 7},
         "updown": {"embed_dim": 6, "hidden_dim": 7, "init_from_annotations": True},  # gradients reach a via init
         "transformer": {"d_model": 8, "num_layers": 2, "num_heads": 2, "ff_dim": 12, "encoder_layers": 1},
         "fc": {"embed_dim": 6, "hidden_dim": 7},
         "att2in": {"embed_dim": 6, "hidden_dim": 7},
         "att2all": {"embed_dim": 6, "hidden_dim": 7, "init_from_annotations": True},
         "adaptive": {"embed_dim": 6, "hidden_dim": 7},
         "aoa": {"embed_dim": 6, "hidden_dim": 8, "refiner_layers": 1, "refiner_heads": 2},
         "m2": {"d_model": 8, "num_layers": 2, "num_heads": 2, "ff_dim": 12, "encoder_layers": 2, "memory_slots": 3}}
VARIANTS = {"luong-no-feeding": ("luong", {"input_feeding": False}),
            "adaptive-spatial": ("adaptive", {"sentinel": False})}
DECODERS = sorted(registry.DECODERS) + sorted(VARIANTS)
V, D, GRID = 13, 10, (4, 5)
INDEXES = {"k=2": torch.arange(3).repeat_interleave(2), "irregular": torch.tensor([2, 0, 0, 1, 2, 1])}


def decoder_spec(kind: str) -> tuple[str, dict]:
    """The registered name and the constructor arguments of decoder `kind` (conf/decoder/<name>.yaml shrunk)."""
    name, extra = VARIANTS.get(kind, (kind, {}))
    yaml = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "decoder" / f"{name}.yaml"))
    spec = {k: v for k, v in yaml.items() if k not in ("_target_", "defaults")}
    return name, {**spec, **SIZES.get(name, {}), **extra}


def build(kind: str, attention: str, dropout: float = 0.0, attention_args: dict | None = None,
          **sizes) -> torch.nn.Module:
    """Decoder `kind` with conf/attention/<attention>.yaml at test sizes (or these sizes, these attention
    arguments), seeded."""
    file, variant = ATTENTION_VARIANTS.get(attention, (attention, {}))
    spec = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "attention" / f"{file}.yaml"))
    spec = {**{k: SMALL_ATTENTION.get(k, v) for k, v in spec.items()}, **variant, **(attention_args or {})}
    att_cls, att_kwargs = registry.resolve("attention", spec, attention)
    name, kwargs = decoder_spec(kind)
    torch.manual_seed(0)
    kwargs = {**kwargs, **{k: v for k, v in sizes.items() if k in kwargs}, "dropout": dropout}
    return registry.DECODERS[name](V, D, functools.partial(att_cls, **att_kwargs), **kwargs)


def refusal(kind: str, attention: str) -> str | None:
    """The decoder's one-line refusal of this attention, or None when it takes it."""
    try:
        build(kind, attention)
    except ValueError as err:
        return str(err)
    return None


PAIRS = [pytest.param(k, a, id=f"{k}-{a}") for k in DECODERS for a in ATTENTIONS if refusal(k, a) is None]
REFUSED = [pytest.param(k, a, id=f"{k}-{a}") for k in DECODERS for a in ATTENTIONS if refusal(k, a) is not None]


def data(B: int = 3, k: int = 2, T: int = 6, dtype=torch.float64):
    """a (B, L, D) on a (4, 5) grid with image 0 padded to 3 x 4, and k captions (T + 1 tokens) per image."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(B, GRID[0] * GRID[1], D, generator=g).relu().to(dtype)
    mask = torch.ones(B, a.shape[1], dtype=torch.bool)
    pos = grid_positions(*GRID)
    mask[0] = (pos[:, 0] < 3) & (pos[:, 1] < 4)
    captions = torch.randint(3, V, (B * k, T + 1), generator=g)
    captions[:, 0] = 1  # <start>
    return a, mask, captions


def ragged(captions: torch.Tensor, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The captions cut to these numbers of real targets (pads after), and the lengths the loss finds in them."""
    captions = captions.clone()
    for r, n in enumerate(lengths):
        captions[r, n + 1:] = 0
    lengths_t = prefix_lengths(captions[:, 1:], 0)
    assert lengths_t is not None and lengths_t.tolist() == lengths
    return captions, lengths_t


def loss(out: DecoderOutput, captions: torch.Tensor) -> torch.Tensor:
    """The training loss with every term that reaches the model: NLL, doubly stochastic, REINFORCE, entropy."""
    return hard_attention_loss(out.logits, captions[:, 1:], out.alphas, out.log_probs, out.entropies, 0,
                               MovingAverageBaseline(0.9), attention_weight=1.0, reward_weight=0.5,
                               entropy_weight=0.1).total


def run(dec, fn, a, captions, index, mask, seed: int = 5):
    """fn's outputs and every parameter's gradient of `loss`, from this seed."""
    torch.manual_seed(seed)
    dec.zero_grad()
    out = fn(a, captions, index, mask=mask, grid=GRID)
    loss(out, captions).backward()
    return out, {n: p.grad.clone() for n, p in dec.named_parameters() if p.grad is not None}


def assert_same(fast, fast_grads, plain, plain_grads, real: torch.Tensor | None = None, atol=1e-9, rtol=1e-7):
    """Outputs and gradients equal; with `real` (N, T), the fast logits are the real tokens' and its maps and gates
    are zero after each caption's end."""
    if real is None:
        torch.testing.assert_close(fast.logits, plain.logits, atol=atol, rtol=rtol)
        real = torch.ones(plain.betas.shape, dtype=torch.bool)
    else:
        torch.testing.assert_close(fast.logits, plain.logits[real], atol=atol, rtol=rtol)
    steps = real.to(plain.alphas.dtype)
    torch.testing.assert_close(fast.alphas, plain.alphas * steps.unsqueeze(-1), atol=atol, rtol=rtol)
    torch.testing.assert_close(fast.betas, plain.betas * steps, atol=atol, rtol=rtol)
    assert (fast.log_probs is None) == (plain.log_probs is None)
    assert fast_grads.keys() == plain_grads.keys()
    for n in plain_grads:
        torch.testing.assert_close(fast_grads[n], plain_grads[n], atol=atol, rtol=rtol, msg=n)
