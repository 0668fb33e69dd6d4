"""Encoder + decoder, and the one place that builds a captioner from a configuration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
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
        """Annotation vectors a (B, L, D) and the grid size (h, w) with L = h * w."""
        fmap = self.encoder(images)  # (B, D, h, w)
        return fmap.flatten(2).transpose(1, 2), tuple(fmap.shape[-2:])  # (B, L, D)

    def forward(self, images: torch.Tensor, captions: torch.Tensor, image_index: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher-forced decoding of captions (N, T+1); image_index (N,) says which image each caption is for."""
        a, grid = self.encode(images)  # encode each image once, however many captions it has
        return self.decoder(a, captions, image_index, grid=grid)


def build_captioner(model_cfg: Mapping[str, Any] | DictConfig, vocab_size: int) -> Captioner:
    """Build a captioner from the `encoder`, `attention` and `decoder` config groups."""
    cfg = OmegaConf.create(model_cfg) if not isinstance(model_cfg, DictConfig) else model_cfg
    for key in ("encoder", "attention", "decoder"):
        if key not in cfg or cfg[key] is None:
            raise ValueError(f"model config is missing the '{key}' group")
    encoder = instantiate(cfg.encoder)
    attention = instantiate(cfg.attention, _partial_=True)
    decoder = instantiate(cfg.decoder, vocab_size=vocab_size, annotation_dim=encoder.out_dim, attention=attention)
    return Captioner(encoder, decoder)
