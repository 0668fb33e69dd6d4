"""Several encoders on one image (`encoder=multi`): the representations of multi-representational attention.

Each encoder sees the same pixels (the same resize and crop) and makes its own grid of the same (h, w); the grids
lie side by side, (B, D_1 + ... + D_K, h, w), and `widths` says where each representation's channels are
(`attention=multirep` attends over each separately; any other attention reads the concatenated channels as one
representation). The encoders' preprocessing differs in its normalisation only (ImageNet's mean and std for the
torchvision backbones, shapes' own for small_cnn), so the transform stops at ToTensor and each encoder's Normalize
runs inside `forward`, computing what it computes (tensor - mean) / std: every encoder gets exactly the input it gets
alone, and one transform (and one exported preprocessing) serves them all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
from PIL import Image
from torch import nn
from torchvision import transforms as T

from captioning.base.transforms import flat_steps
from captioning.models.encoder import Encoder

_GEOMETRIC = (T.Resize, T.CenterCrop)


def split_transform(transform: Callable, where: str) -> tuple[list[Any], T.Normalize]:
    """An encoder's transform() as its geometric steps (Resize, CenterCrop) and its final Normalize, which must
    follow ToTensor; a ValueError naming `where` for any other transform."""
    steps = flat_steps(transform)
    names = " -> ".join(type(s).__name__ for s in steps)
    if (len(steps) < 2 or not isinstance(steps[-2], T.ToTensor) or not isinstance(steps[-1], T.Normalize)
            or not all(isinstance(s, _GEOMETRIC) for s in steps[:-2])):
        raise ValueError(f"encoder=multi: {where}'s transform() is {names}; its encoders need resize/crop steps, "
                         f"then ToTensor, then Normalize (the normalisation moves into the encoder)")
    return steps[:-2], steps[-1]


def as_spec(entry: Any) -> Any:
    """An entry of encoder=multi's `encoders` ({encoder: NAME, ...arguments}) as the spec of that encoder alone
    ({_target_: NAME, ...}); anything else as it is (the builder reports it)."""
    if not isinstance(entry, Mapping) or "encoder" not in entry:
        return entry
    return {"_target_": entry["encoder"], **{k: v for k, v in entry.items() if k != "encoder"}}


class MultiEncoder(Encoder):
    """`encoders` on one image, their (h, w) grids concatenated along the channels (see the module)."""

    def __init__(self, encoders: Sequence[Encoder]):
        super().__init__()
        if not encoders:
            raise ValueError("encoder=multi needs at least one encoder in encoder.encoders")
        parts = [split_transform(e.transform(), f"encoder.encoders[{i}]") for i, e in enumerate(encoders)]
        geometry = parts[0][0]
        for i, (steps, _) in enumerate(parts[1:], 1):
            if repr(steps) != repr(geometry):
                raise ValueError(f"encoder=multi: encoder.encoders[{i}] resizes and crops the image as {steps}, "
                                 f"encoder.encoders[0] as {geometry}; the representations must cover the same "
                                 f"pixels (give them the same image_size)")
        self.encoders = nn.ModuleList(encoders)
        self.geometry = geometry
        self.widths: tuple[int, ...] = tuple(int(e.out_dim) for e in encoders)
        self.out_dim = sum(self.widths)
        for i, (_, norm) in enumerate(parts):  # each encoder's Normalize, moved here (not stored: it is config)
            self.register_buffer(f"mean{i}", torch.tensor(norm.mean, dtype=torch.float32).view(-1, 1, 1),
                                 persistent=False)
            self.register_buffer(f"std{i}", torch.tensor(norm.std, dtype=torch.float32).view(-1, 1, 1),
                                 persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) after ToTensor (not normalised) -> (B, D_1 + ... + D_K, h, w)."""
        grids = []
        for i, encoder in enumerate(self.encoders):
            x = (images - getattr(self, f"mean{i}")) / getattr(self, f"std{i}")  # torchvision Normalize's arithmetic
            grids.append(encoder(x))
        sizes = [tuple(g.shape[-2:]) for g in grids]
        if len(set(sizes)) > 1:
            raise ValueError(f"encoder=multi: the encoders' grids differ ({', '.join(map(str, sizes))}); give them "
                             f"the same grid (grid_size, num_pools or image_size) so that their cells are the same "
                             f"regions")
        return torch.cat(grids, dim=1)

    def transform(self) -> Callable:
        return T.Compose([*self.geometry, T.ToTensor()])

    def view(self, image: Image.Image) -> Image.Image:
        return cast(Encoder, self.encoders[0]).view(image)
