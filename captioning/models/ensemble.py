"""Test-time ensembles: several captioners decode as one, through the one greedy decoding and beam search.

Each model encodes the images with its own encoder and keeps its own annotations a, keys and state; at every step
the word distribution is the mean over the n models of

- their probabilities (`mean="prob"`, the default and the usual ensemble): log p(w) = log (1/n) sum_i p_i(w);
- or their log-probabilities (`mean="logprob"`): (1/n) sum_i log p_i(w), renormalised over the words by
  decoding's log-softmax (a product of experts),

each model's <start> and <pad> masked before mixing (`word_log_probs`). The models must share the vocabulary
(`captioning.factory.load.load_ensemble` compares the word lists) and the input transform (they see one image
tensor), and may differ in encoder, attention and decoder. Each word's attention map is model `maps_from`'s (0: the
first). One model decodes exactly as it does alone: its logits go to decoding unmixed. Hard attention in
`test_mode=sample` takes part as it decodes alone: each such model draws its own regions from torch's generator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import reduce
from typing import Any, Literal

import torch
from torch import nn

from captioning.base.decoding import BEAM_SIZE, ENSEMBLE_MEAN, MAX_LEN, SUPPRESS_UNK
from captioning.models.attention import AttentionOutput
from captioning.models.captioner import Captioner
from captioning.models.decoded import Decoded
from captioning.models.decoding import StepDecoder, decode, special_ids, word_log_probs
from captioning.models.fused.dtypes import autocast_input
from captioning.models.region_encoder import RegionFeatures

EnsembleMean = Literal["prob", "logprob"]
MEANS: tuple[EnsembleMean, ...] = ("prob", "logprob")


def mix_log_probs(logits: Sequence[torch.Tensor], special: torch.Tensor, mean: EnsembleMean) -> torch.Tensor:
    """The ensemble's log word distribution (N, V) from each model's logits (N, V): the log of the mean of the
    models' probabilities ("prob") or the mean of their log-probabilities ("logprob", not renormalised here)."""
    dtype = reduce(torch.promote_types, (x.dtype for x in logits), torch.float32)
    logp = torch.stack([word_log_probs(x.to(dtype), special) for x in logits])  # (n, N, V)
    if mean == "prob":
        return torch.logsumexp(logp, dim=0) - math.log(len(logits))  # (N, V)
    return logp.mean(dim=0)  # (N, V)


class _EachModel:
    """What decoding calls `decoder.attention`: `prepare` gives every model's (a, keys), computed once per image."""

    def __init__(self, decoders: Sequence[StepDecoder], annotations: Sequence[torch.Tensor],
                 grids: Sequence[tuple[int, int]]):
        self.decoders, self.annotations, self.grids = decoders, annotations, grids

    def prepare(self, a: torch.Tensor, grid: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> tuple[tuple[torch.Tensor, Any], ...]:
        """Per model (a (B, L_i, D_i), keys); `a` is the annotations of the model whose maps decoding keeps."""
        return tuple((autocast_input(x), d.attention.prepare(x, g, None))  # as decoding casts its own a once
                     for d, x, g in zip(self.decoders, self.annotations, self.grids))


class EnsembleStep:
    """The `StepDecoder` of several models for one batch of images: the keys decoding carries hold each model's
    (a, keys) and the state each model's state, so that decoding's row selection and repetition reach them all;
    `step` mixes the models' word distributions (`mix_log_probs`) and returns model `maps_from`'s attention."""

    def __init__(self, decoders: Sequence[StepDecoder], annotations: Sequence[torch.Tensor],
                 grids: Sequence[tuple[int, int]], mean: EnsembleMean = ENSEMBLE_MEAN, maps_from: int = 0):
        self.decoders, self.annotations, self.mean, self.maps_from = list(decoders), list(annotations), mean, maps_from
        self.attention = _EachModel(self.decoders, self.annotations, grids)
        # a, keys and mask once per image only where every model's step reads k rows per image of them
        self.rows_share_images = all(getattr(d, "rows_share_images", False) for d in self.decoders)
        self.special = special_ids(self.annotations[0].device)

    def init_state(self, a: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[Any, ...]:
        """Each model's initial state, from its own annotations (decoding calls this once, on the whole batch)."""
        return tuple(d.init_state(x, None) for d, x in zip(self.decoders, self.annotations))

    def step(self, words: torch.Tensor, state: tuple[Any, ...], a: torch.Tensor, keys: tuple[tuple[Any, Any], ...],
             mask: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple[Any, ...], AttentionOutput]:
        """One step of every model from the same previous words (N,): the mixed log-probabilities (N, V) (one
        model: its logits as they are), every model's new state, and model `maps_from`'s attention."""
        outs = [d.step(words, s, x, k, None) for d, s, (x, k) in zip(self.decoders, state, keys)]
        logits = outs[0][0] if len(outs) == 1 else mix_log_probs([o[0] for o in outs], self.special, self.mean)
        return logits, tuple(o[1] for o in outs), outs[self.maps_from][2]


def input_transform(model: Captioner) -> str:
    """A model's preprocessing, written out (as the feature cache's fingerprint compares it), on one line."""
    return " ".join(repr(model.encoder.transform()).split())


def check_members(models: Sequence[Captioner], mean: str, maps_from: int) -> None:
    """Refuse, in one line each, what an ensemble cannot decode: no model, an unknown mean, `maps_from` not one of
    the models, a model without an image path (encoder=regions), or a model preprocessing images otherwise than
    model 0 (every model is given one image tensor)."""
    if not models:
        raise ValueError("an ensemble needs at least one model (checkpoint=[a.pt,b.pt])")
    if mean not in MEANS:
        raise ValueError(f"ensemble mean must be one of {', '.join(MEANS)} (of the word probabilities or of their "
                         f"logarithms), got {mean!r}")
    if not 0 <= maps_from < len(models):
        raise ValueError(f"maps_from={maps_from} names no model of this ensemble of {len(models)} (0 to "
                         f"{len(models) - 1}: the model whose attention maps are kept)")
    for i, model in enumerate(models):
        if isinstance(model.encoder, RegionFeatures):
            raise ValueError(f"model {i} of the ensemble has encoder=regions, which reads one data set's region "
                             "features and has no image path: an ensemble gives every model the images")
    first = input_transform(models[0])
    for i, model in enumerate(models[1:], 1):
        if (other := input_transform(model)) != first:
            raise ValueError(f"model {i} of the ensemble preprocesses images otherwise than model 0 ({other} vs "
                             f"{first}); every model is given the same image tensor: ensemble models with one input "
                             "transform (the same encoder image_size and normalisation)")


class Ensemble(Captioner):
    """Several captioners sharing a vocabulary, decoding as one (see the module): `generate` as a captioner's.

    `encoder` and `decoder` are model `maps_from`'s own modules (not copies): the maps decoding returns are its,
    so the image as its encoder sees it, its hard-attention marks and its attention map choice go with them.
    An ensemble only decodes images: no teacher forcing, no cached annotations (each model has its own encoder).
    """

    def __init__(self, models: Sequence[Captioner], mean: EnsembleMean = ENSEMBLE_MEAN, maps_from: int = 0):
        check_members(models, mean, maps_from)
        super().__init__(models[maps_from].encoder, models[maps_from].decoder)
        self.members = nn.ModuleList(models)
        self.mean, self.maps_from = mean, maps_from

    def encode(self, images: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple[int, int]]:
        raise TypeError("an ensemble has one encoding per model: encode with each of ensemble.members")

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("an ensemble only decodes (generate): train each of its models alone")

    @torch.no_grad()
    def generate(self, images: torch.Tensor, beam_size: int = BEAM_SIZE, max_len: int = MAX_LEN,
                 length_penalty: float = 0.0, n_best: int = 1, mask: torch.Tensor | None = None,
                 suppress_unk: bool = SUPPRESS_UNK) -> tuple[Decoded, tuple[int, int]]:
        """Caption a batch of images (B, 3, H, W) with the ensemble; returns the captions (maps of model
        `maps_from`) and that model's attention grid (h, w)."""
        if images.dim() != 4 or mask is not None:
            raise ValueError(f"an ensemble captions images (B, 3, H, W), each model through its own encoder, got "
                             f"{tuple(images.shape)}{' with a region mask' if mask is not None else ''}: cached "
                             "annotations hold one encoder's features; decode from the images (dataset.features=null)")
        members: list[Captioner] = list(self.members)  # type: ignore[arg-type]
        encoded = [m.encode(images) for m in members]  # each (B, L_i, D_i) and (h_i, w_i)
        step = EnsembleStep([m.decoder for m in members], [a for a, _ in encoded], [g for _, g in encoded],
                            self.mean, self.maps_from)
        a, grid = encoded[self.maps_from]
        return decode(step, a, beam_size, max_len, length_penalty, n_best, grid=grid, suppress_unk=suppress_unk), grid


def members_of(model: Captioner) -> list[Captioner]:
    """The captioners a model decodes with: an ensemble's members, or the model itself."""
    return list(model.members) if isinstance(model, Ensemble) else [model]  # type: ignore[arg-type]
