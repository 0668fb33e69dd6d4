"""Encoder + decoder, and the one place that builds a captioner from a configuration."""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import nn

from captioning.base.decoding import BEAM_SIZE, MAX_LEN, SUPPRESS_UNK
from captioning.models.attention import HardAttention, core_of
from captioning.models.decoded import Decoded
from captioning.models.decoders.base import Decoder, DecoderOutput
from captioning.models.decoding import decode
from captioning.models.encoder import Encoder

logger = logging.getLogger(__name__)


class Captioner(nn.Module):
    """Image -> annotation grid a (B, L, D) -> caption."""

    def __init__(self, encoder: Encoder, decoder: Decoder):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def encode(self, images: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple[int, int]]:
        """Annotation vectors a (B, L, D) and the grid size (h, w) with L = h * w.

        `images` are either images (B, 3, H, W), run through the encoder, or precomputed annotations a
        (B, L, D) of this encoder (a feature cache), passed through; their grid is square, h = w = sqrt(L).
        With `mask` (B, L), true at real regions, they are region sets padded to L (`dataset.pad_regions`): a row
        of L regions, grid (1, L), whose padding the attention gives exactly zero weight.
        """
        if images.dim() == 3:
            B, L, D = images.shape
            side = math.isqrt(L)
            if mask is not None:
                if tuple(mask.shape) != (B, L) or mask.dtype != torch.bool or D != self.encoder.out_dim:
                    raise ValueError(f"region sets must be (B, L, D) with D = {self.encoder.out_dim} and a boolean "
                                     f"mask (B, L), got {tuple(images.shape)} and {mask.dtype} {tuple(mask.shape)}")
                return images, (1, L)
            if side * side != L or D != self.encoder.out_dim:
                raise ValueError(f"precomputed annotations must be (B, L, D) with a square grid L = h * w and "
                                 f"D = {self.encoder.out_dim} (this encoder's), got {tuple(images.shape)}")
            return images, (side, side)  # (B, L, D)
        if mask is not None:
            raise ValueError("a region mask goes with region sets (B, L, D), not with images")
        fmap = self.encoder(images)  # (B, D, h, w)
        return fmap.flatten(2).transpose(1, 2), tuple(fmap.shape[-2:])  # (B, L, D)

    def forward(self, images: torch.Tensor, captions: torch.Tensor, image_index: torch.Tensor | None = None,
                lengths: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher-forced decoding of captions (N, T+1); image_index (N,) says which image each caption is for.

        `images` may be precomputed annotations (B, L, D) instead of images, or region sets with their `mask`
        (see `encode`). Given the captions' lengths (N,) (real targets, `packing.prefix_lengths`), each caption
        runs its own steps only and the logits are (R, V), one row per real token.
        """
        a, grid = self.encode(images, mask)  # encode each image once, however many captions it has
        if lengths is None:
            return self.decoder(a, captions, image_index, mask=mask, grid=grid)
        return self.decoder(a, captions, image_index, mask=mask, grid=grid, lengths=lengths)

    @torch.no_grad()
    def generate(self, images: torch.Tensor, beam_size: int = BEAM_SIZE, max_len: int = MAX_LEN,
                 length_penalty: float = 0.0, n_best: int = 1, mask: torch.Tensor | None = None,
                 suppress_unk: bool = SUPPRESS_UNK) -> tuple[Decoded, tuple[int, int]]:
        """Caption a batch of images (or cached annotations, or region sets with their `mask`); returns the captions
        and the attention grid (h, w) (region sets: (1, L), each row's maps zero past its own regions).

        With n_best > 1 the beam search also returns up to n_best alternatives per image (`Decoded.alternatives`).
        With `suppress_unk` (the default) no caption holds <unk>.
        """
        a, grid = self.encode(images, mask)  # (B, L, D)
        return decode(self.decoder, a, beam_size, max_len, length_penalty, n_best, mask, grid, suppress_unk), grid


class CompiledStep:
    """A decoder's `step` through `torch.compile`, or the plain step where compiling fails.

    Compiling happens at the first call; where it fails (no C++ compiler for the CPU backend, no Triton for CUDA,
    an operation the compiler does not support), one warning says why and every call runs the plain step, which
    computes the same thing. An error of the step itself is raised by the plain step as usual.
    """

    def __init__(self, step: Any, backend: Any = "inductor"):
        self.plain, self.failed = step, False
        self.compiled = torch.compile(step, dynamic=True, backend=backend)  # row counts vary (beams, last batch)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.failed:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as err:  # any compiler failure; the plain step re-raises errors of its own
                self.failed = True
                lines = [line.strip() for line in str(err).splitlines() if line.strip()][:2]  # the cause's line
                logger.warning("torch.compile of the decoding step failed, decoding without it: %s: %s",
                               type(err).__name__, " ".join(lines)[:300])
        return self.plain(*args, **kwargs)


def compile_decoding(model: Captioner, enabled: bool, backend: Any = "inductor") -> None:
    """eval.compile: decode (greedy, beam search, validation) through a compiled `decoder.step` (see CompiledStep);
    the weights and checkpoints are unchanged. Off by default: on the CPU it compiles for minutes and gained nothing
    here (experiments/README.md, "Decoder benchmark")."""
    if enabled and not isinstance(model.decoder.step, CompiledStep):
        model.decoder.step = CompiledStep(model.decoder.step, backend)  # type: ignore[method-assign]


def selects_regions(model: Captioner) -> bool:
    """Whether the model's attention picks single regions (hard attention), so figures should mark them."""
    return isinstance(core_of(model.decoder.attention), HardAttention)


def reports_sentinel(model: Captioner) -> bool:
    """Whether decoding's extra per-word weights (`Decoded.channels`) are the visual sentinel's beta_t
    (decoder=adaptive), reported as `sentinel`, rather than channel or representation weights."""
    return getattr(model.decoder, "extra_weights", "channels") == "sentinel"


def select_attention_map(model: Captioner, layer: int | None = None, head: int | None = None) -> None:
    """Which cross-attention map decoding returns as each word's alpha (figures, reports, attention correctness):
    layer `layer` (-1: the last), head `head` (None: the mean over heads). None for both keeps the decoder's own
    choice; only a decoder with layers of cross-attention (decoder=transformer) takes either."""
    if layer is None and head is None:
        return
    select = getattr(model.decoder, "select_map", None)
    if select is None:
        raise ValueError(f"an attention map layer or head applies to decoder=transformer only; this checkpoint's "
                         f"{type(model.decoder).__name__} has one map per word (leave them unset)")
    select(model.decoder.map_layer if layer is None else layer, head)
