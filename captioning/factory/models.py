"""Building a model from a config: the one place a captioner is assembled from the `encoder`, `attention` and
`decoder` groups, by their `_target_` names in the registry (never imported from the config)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from captioning.base.signature import parameters
from captioning.factory import registry
from captioning.models.captioner import Captioner
from captioning.models.encoder import Encoder


def _plain(cfg: Any) -> Any:
    """Plain containers: a Hydra config (code the user wrote) with its interpolations resolved; a dict as it is."""
    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True)
    if isinstance(cfg, Mapping):
        return {k: _plain(v) for k, v in cfg.items()}
    return cfg


def build_encoder(encoder_cfg: Mapping[str, Any] | DictConfig, prefix: str = "") -> Encoder:
    """Build the `encoder` config group through the registry of this project's encoders."""
    return registry.build("encoder", _plain(encoder_cfg), f"{prefix}encoder")


def build_captioner(model_cfg: Mapping[str, Any] | DictConfig, vocab_size: int,
                    encoder: Encoder | None = None, prefix: str = "") -> Captioner:
    """Build a captioner from the `encoder`, `attention` and `decoder` specs; the one place that builds a model.

    Classes come from `captioning.factory.registry` by their `_target_` (never imported from the config), so a
    Hydra config and a checkpoint build the same way. `encoder` is the one `build_encoder(model_cfg.encoder)`
    gave, when the caller built it earlier (a trainer builds it before reading any data, so missing pretrained
    weights are reported at once). `prefix` is put before key names in errors (e.g. "model." for a checkpoint).
    """
    cfg = _plain(model_cfg)
    if not isinstance(cfg, Mapping):
        raise registry.ModelSpecError(f"{prefix or 'the model config '}must be a mapping of encoder, attention and "
                                      f"decoder, got {type(cfg).__name__}")
    for key in ("encoder", "attention", "decoder"):
        if cfg.get(key) is None:
            raise registry.ModelSpecError(f"model config is missing the '{prefix}{key}' group")
    # Every spec is checked before anything is built (an encoder may load weights for a while).
    enc_cls, enc_kwargs = registry.resolve("encoder", cfg["encoder"], f"{prefix}encoder")
    att_cls, att_kwargs = registry.resolve("attention", cfg["attention"], f"{prefix}attention")
    dec_cls, dec_kwargs = registry.resolve("decoder", cfg["decoder"], f"{prefix}decoder")
    encoder = enc_cls(**enc_kwargs) if encoder is None else encoder
    widths = getattr(encoder, "widths", None)  # encoder=multi: the representations' channels
    takes = "representations" in parameters(att_cls) and not att_kwargs.get("representations")
    if takes and widths and len(widths) > 1:
        att_kwargs = {**att_kwargs, "representations": list(widths)}  # attention=multirep: one attention each
    attention = functools.partial(att_cls, **att_kwargs)
    decoder = dec_cls(vocab_size=vocab_size, annotation_dim=encoder.out_dim, attention=attention, **dec_kwargs)
    return Captioner(encoder, decoder)


def model_config(cfg: DictConfig) -> dict[str, Any]:
    """The part of a run's config that defines the network (what a checkpoint needs to rebuild it)."""
    return {k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("encoder", "attention", "decoder")}
