"""torchvision classification models as grid encoders: which layer of each family gives the grid.

`FAMILIES` states, per family of torchvision's classification models, the layers kept (everything up to the last
feature map, before the pooling and the classifier) and so the grid the encoder gives: a 224 px image becomes a
7 x 7 grid (stride 32) of D values in every family but VGG, whose conv5 before the last max-pool is 14 x 14 x 512
(stride 16), the paper's grid. `weights.load_backbone` builds one with its weights (weights.py says where
they come from: a torchvision weights name or a local file, checked before use). The body's children are the
family's blocks (stages or layers); `encoder.fine_tune=top` trains the last of them that has weights.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from torch import nn

from captioning.base.constraints import choose_one


@dataclass(frozen=True)
class Family:
    """A family of torchvision models: the architectures it names, the layers that give the grid, what they are."""

    name: str
    archs: str  # a regular expression over torchvision's model names
    body: Callable[[nn.Module], nn.Module]  # the classification model -> its layers up to the grid
    grid: str  # the grid layer and its size at 224 px, stated for the README and the errors
    stride: int = 32


def _children(model: nn.Module, drop: int) -> nn.Module:
    return nn.Sequential(*list(model.children())[:-drop])


FAMILIES: tuple[Family, ...] = (
    Family("mobilenet", r"mobilenet_v[23].*", lambda m: cast(nn.Module, m.features),
           "`features`, up to the last 1 x 1 conv: 7 x 7 x 1280 (v2), x 576 / x 960 (v3 small / large)"),
    Family("efficientnet", r"efficientnet_.*", lambda m: cast(nn.Module, m.features),
           "`features`, up to the last 1 x 1 conv: 7 x 7 x 1280 (b0, v2_s), wider for larger models"),
    Family("convnext", r"convnext_.*", lambda m: cast(nn.Module, m.features),
           "`features`, the last stage: 7 x 7 x 768 (tiny, small), x 1024 (base), x 1536 (large)"),
    Family("resnet", r"resnet\d+|resnext.*|wide_resnet.*", lambda m: _children(m, 2),
           "`layer4`, before avgpool and fc: 7 x 7 x 2048 (x 512 for resnet18/34)"),
    Family("regnet", r"regnet_.*", lambda m: nn.Sequential(cast(nn.Module, m.stem),
                                                           *cast(nn.Module, m.trunk_output).children()),
           "`trunk_output`, before avgpool and fc: 7 x 7 x the last stage's width"),
    Family("densenet", r"densenet\d+", lambda m: nn.Sequential(*cast(nn.Module, m.features).children(), nn.ReLU()),
           "`features` and its ReLU: 7 x 7 x 1024 (densenet121)"),
    Family("vgg", r"vgg\d+(_bn)?", lambda m: nn.Sequential(*list(cast(nn.Module, m.features).children())[:-1]),
           "`features` without the last max-pool (conv5): 14 x 14 x 512, the paper's grid", stride=16),
)


def family_of(arch: str) -> Family:
    """The family of a torchvision model name; one ValueError line naming the families otherwise."""
    import torchvision

    for family in FAMILIES:
        if re.fullmatch(family.archs, arch):
            if arch not in torchvision.models.list_models(module=torchvision.models):
                break
            return family
    known = [a for a in torchvision.models.list_models(module=torchvision.models)
             if any(re.fullmatch(f.archs, a) for f in FAMILIES)]
    raise ValueError(f"encoder.arch={arch!r} is not a torchvision classification model this encoder takes: "
                     f"{choose_one(arch, known)}; families: {', '.join(f.name for f in FAMILIES)}")


def grid_width(body: nn.Module) -> int:
    """D, the channels of the grid `body` gives: those of its last convolution or batch norm, in module order
    (every family's last such layer sets the output's width; tests/models/test_backbones.py checks it by a forward
    pass for each family)."""
    width = None
    for m in body.modules():
        if isinstance(m, nn.Conv2d):
            width = m.out_channels
        elif isinstance(m, nn.BatchNorm2d):
            width = m.num_features
    if width is None:
        raise ValueError(f"{type(body).__name__} has no convolution: not an image backbone")
    return int(width)
