"""Encoder + decoder, and the one place that builds a captioner from a configuration."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from captioning.models.decoder import DecoderOutput, ShowAttendTellDecoder
from captioning.models.encoder import Encoder


class Captioner(nn.Module):
    """Image -> annotation grid a (B, L, D) -> caption."""

    def __init__(self, encoder: Encoder, decoder: ShowAttendTellDecoder):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Annotation vectors a (B, L, D) and the grid size (h, w) with L = h * w.

        `images` are either images (B, 3, H, W), run through the encoder, or precomputed annotations a
        (B, L, D) of this encoder (a feature cache), passed through; their grid is square, h = w = sqrt(L).
        """
        if images.dim() == 3:
            B, L, D = images.shape
            side = math.isqrt(L)
            if side * side != L or D != self.encoder.out_dim:
                raise ValueError(f"precomputed annotations must be (B, L, D) with a square grid L = h * w and "
                                 f"D = {self.encoder.out_dim} (this encoder's), got {tuple(images.shape)}")
            return images, (side, side)  # (B, L, D)
        fmap = self.encoder(images)  # (B, D, h, w)
        return fmap.flatten(2).transpose(1, 2), tuple(fmap.shape[-2:])  # (B, L, D)

    def forward(self, images: torch.Tensor, captions: torch.Tensor, image_index: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher-forced decoding of captions (N, T+1); image_index (N,) says which image each caption is for.

        `images` may be precomputed annotations (B, L, D) instead of images (see `encode`).
        """
        a, grid = self.encode(images)  # encode each image once, however many captions it has
        return self.decoder(a, captions, image_index, grid=grid)


def build_encoder(encoder_cfg: Mapping[str, Any] | DictConfig) -> Encoder:
    """Instantiate the `encoder` config group, raising the encoder's own error as it is.

    Hydra wraps errors in an InstantiationException; unwrapped, a message such as "copy the weights
    file to ... or set encoder.pretrained=false" (no network) is what the user reads first.
    """
    try:
        return instantiate(encoder_cfg)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, (RuntimeError, ValueError, OSError)):
            raise cause from cause.__cause__
        raise


def build_captioner(model_cfg: Mapping[str, Any] | DictConfig, vocab_size: int,
                    encoder: Encoder | None = None) -> Captioner:
    """Build a captioner from the `encoder`, `attention` and `decoder` config groups.

    `encoder` is the one `build_encoder(model_cfg.encoder)` gives, when the caller built it earlier (a
    trainer builds it before reading any data, so missing pretrained weights are reported at once).
    """
    cfg = OmegaConf.create(model_cfg) if not isinstance(model_cfg, DictConfig) else model_cfg
    for key in ("encoder", "attention", "decoder"):
        if key not in cfg or cfg[key] is None:
            raise ValueError(f"model config is missing the '{key}' group")
    encoder = build_encoder(cfg.encoder) if encoder is None else encoder
    attention = instantiate(cfg.attention, _partial_=True)
    decoder = instantiate(cfg.decoder, vocab_size=vocab_size, annotation_dim=encoder.out_dim, attention=attention)
    return Captioner(encoder, decoder)
