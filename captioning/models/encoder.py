"""Image encoders: an image becomes an h x w grid of D-dimensional annotation vectors a_i."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Annotated, Literal, cast

import torch
from PIL import Image
from torch import nn
from torchvision import transforms as T

from captioning.base.constraints import MAX_IMAGE_SIDE, Count, ImageSide, Range, Size, constrained
from captioning.models.backbones import family_of, grid_width
from captioning.models.weights import describe, load_backbone

logger = logging.getLogger(__name__)

FineTune = Literal["none", "top", "all"]
VGGArch = Literal["vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn"]
ResNetArch = Literal["resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d",
                     "resnext101_32x8d", "wide_resnet50_2", "wide_resnet101_2"]
ImageSize = Annotated[int, Range(ge=32, le=MAX_IMAGE_SIDE)]  # 32: the smallest input the backbones take
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Encoder(nn.Module):
    """Base class: `forward` maps images (B, 3, H, W) to an annotation grid (B, D, h, w)."""

    out_dim: int

    def transform(self) -> Callable:
        """The preprocessing (PIL image -> normalised tensor) this encoder expects."""
        raise NotImplementedError

    def view(self, image: Image.Image) -> Image.Image:
        """The part of the image the encoder sees (after its resize/crop): what attention maps cover."""
        return image


class SmallCNN(Encoder):
    """A small from-scratch CNN for the synthetic `shapes` data set (trains on a CPU in minutes).

    With `coord_channels` the image gets two extra input channels holding each pixel's (x, y) in
    [-1, 1] (CoordConv), so annotation vectors know where they are, as padding effects teach a deep
    ImageNet CNN; a 4-layer CNN trained for minutes would not learn that on its own.
    With `image_size` every image is resized to that square first, so any input size (even 1 x 1) batches;
    without it images are used as they are and must all have the data set's size.
    """

    @constrained
    def __init__(self, channels: Annotated[tuple[int, ...], Range(ge=1)] = (32, 64, 128),
                 num_pools: Count = 3, coord_channels: bool = True,
                 image_size: ImageSide | None = None):
        super().__init__()
        self.coord_channels, self.image_size = coord_channels, image_size
        layers: list[nn.Module] = []
        in_ch = 5 if coord_channels else 3
        for i, ch in enumerate(channels):
            layers += [nn.Conv2d(in_ch, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch), nn.ReLU(inplace=True)]
            if i < num_pools:
                layers.append(nn.MaxPool2d(2))
            in_ch = ch
        self.features = nn.Sequential(*layers)
        self.out_dim = in_ch

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.coord_channels:
            B, _, H, W = images.shape
            ys = torch.linspace(-1, 1, H, device=images.device, dtype=images.dtype).view(1, 1, H, 1).expand(B, 1, H, W)
            xs = torch.linspace(-1, 1, W, device=images.device, dtype=images.dtype).view(1, 1, 1, W).expand(B, 1, H, W)
            images = torch.cat([images, xs, ys], dim=1)  # (B, 5, H, W)
        # Channels last: the convolutions, batch norms and pools of this CNN run 1.4-1.5x faster on a CPU so
        # (forward + backward, 32 images of 64 px, 2 threads; experiments/README.md, "Real caption lengths"), and
        # the (B, D, h, w) output flattens to a (B, L, D) grid without a copy.
        return self.features(images.contiguous(memory_format=torch.channels_last))  # (B, D, H/2^pools, W/2^pools)

    def transform(self) -> Callable:
        resize = [] if self.image_size is None else [T.Resize((self.image_size, self.image_size))]
        return T.Compose([*resize, T.ToTensor(), T.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))])

    def view(self, image: Image.Image) -> Image.Image:
        return image if self.image_size is None else T.Resize((self.image_size, self.image_size))(image)


class _TorchvisionEncoder(Encoder):
    """Shared weights, fine-tuning and preprocessing logic for ImageNet backbones: `pretrained` starts from ImageNet
    weights, `weights` says which (null: torchvision's DEFAULT; a weights name; a .pth file: models/weights.py)."""

    @constrained
    def __init__(self, arch: str, pretrained: bool, fine_tune: FineTune, image_size: ImageSize,
                 weights: str | None = None):
        super().__init__()
        self.arch, self.pretrained, self.fine_tune, self.image_size = arch, pretrained, fine_tune, image_size
        self.weights = weights

    def _backbone(self) -> nn.Module:
        return load_backbone(self.arch, self.pretrained, self.weights)

    def weights_origin(self) -> str:
        """Where the weights came from, in words (a feature cache's meta.json, model cards)."""
        return describe(self.arch, self.pretrained, self.weights)

    def _set_trainable(self, blocks: Sequence[nn.Module], top: Sequence[nn.Module]) -> None:
        trainable = {"none": [], "top": top, "all": blocks}[self.fine_tune]
        for p in self.parameters():
            p.requires_grad_(False)
        for m in trainable:
            for p in m.parameters():
                p.requires_grad_(True)

    def train(self, mode: bool = True) -> _TorchvisionEncoder:
        # A frozen backbone keeps its BatchNorm statistics fixed.
        return super().train(mode and self.fine_tune != "none")

    def _geometry(self) -> T.Compose:
        return T.Compose([T.Resize(int(round(self.image_size * 256 / 224))), T.CenterCrop(self.image_size)])

    def transform(self) -> Callable:
        return T.Compose([self._geometry(), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])

    def view(self, image: Image.Image) -> Image.Image:
        return self._geometry()(image)


class VGGEncoder(_TorchvisionEncoder):
    """VGG conv5 features before the last max-pool: 14 x 14 x 512 at 224 px (the paper's conv5_4 for VGG-19)."""

    @constrained
    def __init__(self, arch: VGGArch = "vgg19", pretrained: bool = True, fine_tune: FineTune = "none",
                 image_size: ImageSize = 224, weights: str | None = None):
        super().__init__(arch, pretrained, fine_tune, image_size, weights)
        vgg = self._backbone()
        self.features = nn.Sequential(*list(cast(nn.Module, vgg.features).children())[:-1])  # drop the last max-pool
        self.out_dim = 512
        convs = [m for m in self.features if isinstance(m, nn.Conv2d)]
        self._set_trainable(list(self.features), top=convs[-4:])  # conv5 block

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.features(images)  # (B, 512, H/16, W/16)


class ResNetEncoder(_TorchvisionEncoder):
    """ResNet last block, adaptive-pooled to a grid x grid map of 2048-d annotations."""

    @constrained
    def __init__(self, arch: ResNetArch = "resnet101", pretrained: bool = True, fine_tune: FineTune = "none",
                 grid_size: Size = 14, image_size: ImageSize = 224, weights: str | None = None):
        super().__init__(arch, pretrained, fine_tune, image_size, weights)
        net = self._backbone()
        self.body = nn.Sequential(*list(net.children())[:-2])  # drop avgpool and fc
        self.pool = nn.AdaptiveAvgPool2d(grid_size)
        self.out_dim = int(cast(nn.Linear, net.fc).in_features)
        self._set_trainable(list(self.body), top=[cast(nn.Module, net.layer4)])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.pool(self.body(images))  # (B, 2048, grid, grid)


class TorchvisionEncoder(_TorchvisionEncoder):
    """Any torchvision classification model of the families in models/backbones.py: its layers up to the last
    feature map give the grid (7 x 7 at 224 px; VGG 14 x 14), adaptive-pooled to grid_size x grid_size if set."""

    @constrained
    def __init__(self, arch: str = "mobilenet_v2", pretrained: bool = True, weights: str | None = None,
                 fine_tune: FineTune = "none", grid_size: Size | None = None, image_size: ImageSize = 224):
        super().__init__(arch, pretrained, fine_tune, image_size, weights)
        self.body = family_of(arch).body(self._backbone())
        self.pool = nn.AdaptiveAvgPool2d(grid_size) if grid_size is not None else nn.Identity()
        self.out_dim = grid_width(self.body)
        blocks = list(self.body.children())
        top = [b for b in blocks if any(True for _ in b.parameters())][-1:]  # the last block with weights
        self._set_trainable(blocks, top=top)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.pool(self.body(images))  # (B, D, H/32, W/32) (VGG: /16), or (B, D, grid, grid)
