"""The Python API: caption your own images with a trained checkpoint.

    import captioning
    model = captioning.load("outputs/<run>/checkpoints/best.pt")   # device="auto": CUDA when there is one
    result = model.caption("photo.jpg", beam_size=3, alternatives=3)
    print(result.caption, result.log_prob, [(alt.caption, alt.log_prob) for alt in result.alternatives])
    model.plot(result, "photo_attention.png")                       # the image, then each word's attention map

Images are read by the one image loader (captioning/data/images.py: EXIF rotation, 16-bit grey, transparency,
decompression-bomb guard) and preprocessed by the encoder's own `transform()`, so a caption here is the caption
training's validation and `captioning-evaluate` give for the same image. A PIL image given directly gets the
loader's colour rules (captioning.data.images.to_rgb) but no EXIF rotation: it is taken as it is shown. A path that
cannot be read raises an `ImageError` naming it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast, overload

import numpy as np
import torch
from matplotlib.figure import Figure
from PIL import Image

from captioning.base.decoding import BEAM_SIZE, ENSEMBLE_MEAN, MAX_LEN, SUPPRESS_UNK
from captioning.data.images import load_image, to_rgb
from captioning.data.vocab import Vocabulary
from captioning.factory.load import load_ensemble, load_model
from captioning.models.captioner import Captioner, reports_sentinel, select_attention_map, selects_regions
from captioning.models.ensemble import EnsembleMean
from captioning.models.region_encoder import NO_IMAGES, RegionFeatures
from captioning.reporting.figures import attention_figure, chosen_regions, plot_attention, upsample_attention
from captioning.runtime import resolve_device

ImageInput = str | os.PathLike | Image.Image


@dataclass(frozen=True)
class Alternative:
    """One caption the beam search found: its words and raw log-probability (with its <end> when it has one)."""

    words: tuple[str, ...]
    log_prob: float

    @property
    def caption(self) -> str:
        return " ".join(self.words)


@dataclass
class CaptionResult:
    """The caption of one image and where the model looked for each word."""

    source: str  # the path given, or "<image N>" for a PIL image
    words: list[str]
    log_prob: float  # raw log-probability of the caption (with its <end> when it has one)
    attention: np.ndarray  # (T, h, w) float32: word t's map over the encoder's grid (each sums to 1; monotonic
    # attention's to at most 1)
    image: Image.Image  # the image as the encoder saw it (after its resize/crop): what the maps cover
    alternatives: list[Alternative] = field(default_factory=list)  # best first (the caption itself), when asked
    regions: list[int] | None = None  # hard attention: the grid cell each word's map picks
    channels: np.ndarray | None = None  # channel-wise attention: (T, D) float32, word t's channel weights (sum 1);
    # attention=multirep with several representations: (T, K), word t's representation weights (sum 1)
    sentinel: np.ndarray | None = None  # decoder=adaptive: (T,) float32, word t's visual sentinel weight beta_t in
    # [0, 1] (Lu et al. 2017): how much of the word came from the language model rather than the image

    @property
    def caption(self) -> str:
        return " ".join(self.words)

    def heatmap(self, t: int, smooth: bool = True) -> np.ndarray:
        """Word t's map upsampled to `image` (H, W), as the figures and the HTML report draw it."""
        return upsample_attention(self.attention[t], (self.image.height, self.image.width), smooth=smooth)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-friendly part: source, caption, log_prob and the alternatives when there are any."""
        out: dict[str, Any] = {"source": self.source, "caption": self.caption, "log_prob": round(self.log_prob, 6)}
        if self.sentinel is not None:
            out["sentinel"] = [round(float(b), 4) for b in self.sentinel]
        if self.alternatives:
            out["alternatives"] = [{"caption": a.caption, "log_prob": round(a.log_prob, 6)} for a in self.alternatives]
        return out


class CaptionModel:
    """A trained captioner with its vocabulary and preprocessing; build it with `load(checkpoint)`."""

    def __init__(self, model: Captioner, vocab: Vocabulary, device: torch.device, checkpoint: dict[str, Any]):
        self.model, self.vocab, self.device = model.eval(), vocab, device
        self.transform = model.encoder.transform()
        self.config: dict[str, Any] = checkpoint.get("config", {})
        self.marks_regions = selects_regions(model)
        self.sentinel = reports_sentinel(model)  # decoder=adaptive

    def select_attention_map(self, layer: int | None = None, head: int | None = None) -> None:
        """decoder=transformer: caption with the map of cross-attention layer `layer` (-1: the last) and head
        `head` (None: the mean over heads) as each word's attention; None for both keeps the checkpoint's choice."""
        select_attention_map(self.model, layer, head)

    @overload
    def caption(self, images: ImageInput, beam_size: int = ..., max_len: int = ...,  # type: ignore[overload-overlap]
                batch_size: int = ..., alternatives: int = ..., length_penalty: float = ...,
                suppress_unk: bool = ...) -> CaptionResult: ...

    @overload
    def caption(self, images: Sequence[ImageInput], beam_size: int = ..., max_len: int = ..., batch_size: int = ...,
                alternatives: int = ..., length_penalty: float = ...,
                suppress_unk: bool = ...) -> list[CaptionResult]: ...

    def caption(self, images: ImageInput | Sequence[ImageInput], beam_size: int = BEAM_SIZE, max_len: int = MAX_LEN,
                batch_size: int = 16, alternatives: int = 0, length_penalty: float = 0.0,
                suppress_unk: bool = SUPPRESS_UNK) -> CaptionResult | list[CaptionResult]:
        """Caption one image (a path or a PIL image) or a list of them, `batch_size` images per forward pass.

        `alternatives` = n > 0 also returns the n best captions the beam search found (the first is the caption).
        `suppress_unk` (the default): no caption holds <unk>.
        One image gives one CaptionResult, a list gives a list in the same order.
        """
        single = isinstance(images, (str, os.PathLike, Image.Image))
        items = [cast(ImageInput, images)] if single else list(cast(Sequence[ImageInput], images))
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        results: list[CaptionResult] = []
        for start in range(0, len(items), batch_size):
            chunk = items[start:start + batch_size]
            pictures = [x if isinstance(x, Image.Image) else load_image(x) for x in chunk]
            sources = [f"<image {start + i}>" if isinstance(x, Image.Image) else str(x) for i, x in enumerate(chunk)]
            results += self.caption_batch(pictures, sources, beam_size, max_len, alternatives, length_penalty,
                                          suppress_unk)
        return results[0] if single else results

    @torch.no_grad()
    def caption_batch(self, images: Sequence[Image.Image], sources: Sequence[str], beam_size: int = BEAM_SIZE,
                      max_len: int = MAX_LEN, alternatives: int = 0, length_penalty: float = 0.0,
                      suppress_unk: bool = SUPPRESS_UNK) -> list[CaptionResult]:
        """Caption images already read (RGB), in one forward pass per input size; results in the given order."""
        if alternatives < 0:
            raise ValueError(f"alternatives must be >= 0, got {alternatives}")
        images = [to_rgb(im) for im in images]  # the loader's rules for 16-bit grey, transparency, palettes
        tensors = [self.transform(im) for im in images]
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, x in enumerate(tensors):  # an encoder without a fixed input size batches images of one size together
            by_shape.setdefault(tuple(x.shape), []).append(i)
        results: list[CaptionResult | None] = [None] * len(tensors)
        for rows in by_shape.values():
            batch = torch.stack([tensors[i] for i in rows]).to(self.device)
            decoded, (h, w) = self.model.generate(batch, beam_size, max_len, length_penalty,
                                                  n_best=max(alternatives, 1), suppress_unk=suppress_unk)
            for j, i in enumerate(rows):
                maps = decoded.alphas[j].view(-1, h, w)
                alts = [Alternative(tuple(self.vocab.decode(toks)), score)
                        for toks, _, score in (decoded.alternatives[j] if decoded.alternatives else [])]
                if alternatives and not alts:  # greedy (beam 1): its one caption
                    alts = [Alternative(tuple(self.vocab.decode(decoded.tokens[j])), float(decoded.scores[j]))]
                extra = None if decoded.channels is None else decoded.channels[j].float().numpy()
                sentinel = extra[:, 0] if extra is not None and self.sentinel else None
                results[i] = CaptionResult(
                    source=sources[i], words=self.vocab.decode(decoded.tokens[j]), log_prob=float(decoded.scores[j]),
                    attention=maps.float().numpy(), image=self.model.encoder.view(images[i]),
                    alternatives=alts[:alternatives],
                    regions=chosen_regions(maps) if self.marks_regions and len(maps) else None,
                    channels=None if sentinel is not None else extra, sentinel=sentinel)
        return [r for r in results if r is not None]

    def plot(self, result: CaptionResult, path: str | os.PathLike | None = None) -> Figure | Path:
        """The figure of a result (the image, then one panel per word; an empty caption: the image alone, titled so);
        saved as PNG and its path returned if a path is given, else the matplotlib Figure."""
        if path is None:
            return attention_figure(result.image, result.words, result.attention, regions=result.regions,
                                    sentinel=result.sentinel)
        return plot_attention(result.image, result.words, result.attention, path, regions=result.regions,
                              sentinel=result.sentinel)


def load(checkpoint: str | os.PathLike | Sequence[str | os.PathLike], device: str = "auto",
         ensemble_mean: EnsembleMean = ENSEMBLE_MEAN, maps_from: int = 0) -> CaptionModel:
    """The model of a checkpoint (`best.pt` of a run), ready to caption on `device` ("auto": CUDA if available).

    A list of checkpoints sharing one vocabulary is a test-time ensemble (captioning/models/ensemble.py): one beam
    search over the mean of the models' word probabilities (`ensemble_mean="prob"`) or log-probabilities
    ("logprob"), each model encoding the images itself (their input transforms must be the same); the attention
    maps are model `maps_from`'s. A list of one checkpoint is that checkpoint's model.
    A checkpoint is data, never code (SECURITY.md): a file naming anything but this project's classes is refused.
    """
    dev = resolve_device(device)
    if isinstance(checkpoint, (str, os.PathLike)):
        model, vocab, ckpt = load_model(checkpoint, map_location=dev)
        if isinstance(model.encoder, RegionFeatures):  # it reads a data set's region features, not images
            raise ValueError(NO_IMAGES)
    else:
        model, vocab, ckpt = load_ensemble(list(checkpoint), dev, ensemble_mean, maps_from)
    return CaptionModel(model, vocab, dev, ckpt)
