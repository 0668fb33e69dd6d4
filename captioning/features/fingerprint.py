"""What decides the features an encoder computes: its config, weights (SHA-256), preprocessing and grid size.

A feature cache records this fingerprint in its meta.json; a cache is used only with an encoder of the same
fingerprint (cache.py), and extended only by one (extract.py). Only a frozen encoder makes fixed features.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, cast

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from captioning import __version__
from captioning.features.checks import CACHE_FORMAT
from captioning.models.encoder import Encoder

# Weights are identified by their hash, not by how they were obtained (a checkpoint stores pretrained=false).
_NOT_COMPARED = ("pretrained", "weights", "fine_tune")


def weights_digest(module: nn.Module) -> str:
    """SHA-256 of a module's parameters and buffers (names, shapes, bytes)."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _compared(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config keys that decide the features (encoder=multi: in each of its encoders too)."""
    out = {k: v for k, v in cfg.items() if k not in _NOT_COMPARED}
    if isinstance(out.get("encoders"), list):
        out["encoders"] = [_compared(e) if isinstance(e, dict) else e for e in out["encoders"]]
    return out


def fingerprint(encoder: Encoder, encoder_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What decides the features an encoder computes; two caches are interchangeable iff these are equal."""
    plain = OmegaConf.to_container(encoder_cfg, resolve=True) if isinstance(encoder_cfg, DictConfig) else encoder_cfg
    cfg = _compared(dict(cast(Mapping[str, Any], plain)))
    return {"format": CACHE_FORMAT, "code_version": __version__, "encoder": cfg,
            "weights_sha256": weights_digest(encoder), "transform": repr(encoder.transform()), "dim": encoder.out_dim}


def check_frozen(encoder: Encoder) -> None:
    """A cache holds fixed features: refuse an encoder that training would change."""
    if any(p.requires_grad for p in encoder.parameters()):
        raise ValueError(f"a feature cache needs a frozen encoder, but {type(encoder).__name__} has trainable "
                         "parameters; use a pretrained torchvision backbone with encoder.fine_tune=none, or set "
                         "dataset.features=null to encode images on the fly")


def weights_name(encoder: Encoder) -> str:
    """Human-readable origin of the weights, recorded in meta.json (not compared: the hash is)."""
    children = getattr(encoder, "encoders", None)  # encoder=multi: each of its encoders'
    if children is not None:
        return " + ".join(weights_name(e) for e in children)
    origin = getattr(encoder, "weights_origin", None)
    return origin() if origin is not None else "random initialisation (seeded by the run's `seed`)"
