"""The three graphs a captioner is exported as, and what makes the model's own code traceable.

    encoder  images (B, 3, H, W) -> a (B, L, D)                 Captioner.encode
    init     a (B, L, D) -> keys, state_0 .. state_{n-1}        decoder.attention.prepare(a, grid), decoder.init_state
    step     words (N,), a (N, L, D), keys (N, ...), state_in_* -> logits (N, V), alpha (N, L), state_out_*
                                                                decoder.step, one row of a and keys per state row

The decoder state (a tuple, possibly nested, of tensors with the row first) is flattened depth first; `tree` records
its structure as nested lists of leaf positions. Every graph runs the model's own modules in eval mode (dropout off,
hard attention in its test mode), so an exported caption is the model's caption.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torchvision import transforms as T

from captioning.base.transforms import flat_steps
from captioning.models.attention import HardAttention, core_of
from captioning.models.captioner import Captioner
from captioning.models.fused import plain_kernels
from captioning.models.region_encoder import RegionFeatures

Tree = int | list["Tree"]


@contextmanager
def traceable(model: nn.Module) -> Iterator[None]:
    """Trace the model's code as it runs on a GPU: its plain kernels (no cache-sized chunks, so no Python loop over
    the batch, which tracing would fix to the example's batch size; torch's tanh); without autograd."""
    with plain_kernels(model), torch.no_grad():
        yield


def flatten_state(state: Any) -> tuple[list[torch.Tensor], Tree]:
    """The tensors of a decoder state depth first, and its structure (nested lists of leaf positions)."""
    leaves: list[torch.Tensor] = []

    def walk(node: Any) -> Tree:
        if isinstance(node, torch.Tensor):
            leaves.append(node)
            return len(leaves) - 1
        if isinstance(node, tuple | list):
            return [walk(x) for x in node]
        raise ValueError(f"the decoder state holds a {type(node).__name__}; only tensors in tuples can be exported")

    return leaves, walk(state)


def unflatten_state(template: Any, leaves: Sequence[torch.Tensor]) -> Any:
    """A state shaped like `template` (the decoder's own tuples, named or not) holding `leaves` in order."""
    it = iter(leaves)

    def build(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            return next(it)
        items = [build(x) for x in node]
        return type(node)(*items) if hasattr(node, "_fields") else type(node)(items)

    return build(template)


def distinct(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """A graph's outputs, each a tensor of its own: one that is also an input (a state entry a step passes through
    unchanged, as Luong's h~ without input feeding) or an earlier output is copied. An exported graph names each value
    once: an output that is an input renames that input to the output's name (`state_out_2`), and the runner, which
    feeds `state_in_*`, fails on the missing input."""
    seen = {id(t) for t in inputs}
    out = []
    for t in outputs:
        out.append(t.clone() if id(t) in seen else t)
        seen.add(id(t))
    return tuple(out)


class EncoderGraph(nn.Module):
    """images (B, 3, H, W) -> a (B, L, D)."""

    def __init__(self, model: Captioner):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.encode(images)[0]  # (B, L, D)


class InitGraph(nn.Module):
    """a (B, L, D) -> keys, flattened initial state."""

    def __init__(self, model: Captioner, grid: tuple[int, int]):
        super().__init__()
        self.decoder, self.grid = model.decoder, grid

    def forward(self, a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        keys = self.decoder.attention.prepare(a, self.grid)  # (B, L, A) or (B, h, w, A)
        return distinct((keys, *flatten_state(self.decoder.init_state(a, None))[0]), (a,))


class StepGraph(nn.Module):
    """words (N,), a (N, L, D), keys (N, ...), state -> logits (N, V), alpha (N, L), new state (one row per image);
    with channel-wise attention `alpha` is (N, L + C): the map, then the channel weights (`AttentionOutput.maps`)."""

    def __init__(self, model: Captioner, template: Any):
        super().__init__()
        self.decoder, self.template = model.decoder, template

    def forward(self, words: torch.Tensor, a: torch.Tensor, keys: torch.Tensor,
                *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logits, new, att = self.decoder.step(words, unflatten_state(self.template, state), a, keys, None)
        return distinct((logits, att.maps, *flatten_state(new)[0]), (words, a, keys, *state))


def refusal(model: Captioner) -> str | None:
    """Why this model cannot be exported (one line), or None."""
    if isinstance(model.encoder, RegionFeatures):
        return ("a model on region features (encoder=regions) has no image path, and an exported model starts from "
                "the image: caption with the checkpoint on the regions (captioning-evaluate) instead")
    decoder = model.decoder
    for name in ("init_state", "step"):
        if not callable(getattr(decoder, name, None)):
            return f"the decoder {type(decoder).__name__} has no {name}(): only step decoders can be exported"
    attention = getattr(decoder, "attention", None)
    if not callable(getattr(attention, "prepare", None)):
        return f"the decoder {type(decoder).__name__} has no attention with prepare(): it cannot be exported"
    hard = core_of(attention)
    if isinstance(hard, HardAttention) and hard.test_mode == "sample":
        return ("hard attention with test_mode=sample draws a region at random at every step, which an exported "
                "graph cannot reproduce; export it with test_mode=expectation or argmax (--hard-test-mode)")
    return None


_STEPS: dict[type, Callable[[Any], dict[str, Any]]] = {
    T.Resize: lambda t: {"op": "resize", "size": t.size if isinstance(t.size, int) else list(t.size),
                         "interpolation": t.interpolation.value, "max_size": t.max_size},
    T.CenterCrop: lambda t: {"op": "center_crop", "size": list(t.size)},
    T.ToTensor: lambda t: {"op": "to_tensor"},
    T.Normalize: lambda t: {"op": "normalize", "mean": [float(x) for x in t.mean], "std": [float(x) for x in t.std]},
}


def preprocess_steps(transform: Callable) -> list[dict[str, Any]]:
    """An encoder's transform() (a torchvision Compose, nested or not) as steps of captioning.export.preprocess."""
    steps = flat_steps(transform)
    unknown = next((s for s in steps if type(s) not in _STEPS), None)
    if unknown is not None:
        raise ValueError(f"the encoder's transform() uses {type(unknown).__name__}, which the export cannot "
                         f"describe (it knows {', '.join(t.__name__ for t in _STEPS)})")
    return [_STEPS[type(s)](s) for s in steps]


def fixed_size(steps: Sequence[dict[str, Any]]) -> tuple[int, int] | None:
    """The (H, W) every image has after these steps, or None when it depends on the image's own size."""
    size = None
    for step in steps:
        if step["op"] == "center_crop" or (step["op"] == "resize" and not isinstance(step["size"], int)):
            h, *rest = step["size"]
            size = (h, rest[0] if rest else h)
        elif step["op"] == "resize":
            size = None  # by the smaller edge: the other one follows the image's aspect ratio
    return size
