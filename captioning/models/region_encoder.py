"""`encoder=regions`: bottom-up region features (Anderson et al. 2018) read from `dataset.features`, with no image path.

The features of each image (a set of L_i regions of `dim` values, e.g. 10-100 or 36 regions of 2048 values from the
Faster R-CNN of peteanderson80/bottom-up-attention) come precomputed from a region source
(captioning/features/regions.py); the captioner passes them through (`Captioner.encode` with a region mask). This
encoder only carries their width; giving it images is refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchvision import transforms as T

from captioning.base.constraints import Size, constrained
from captioning.models.encoder import Encoder

NO_IMAGES = ("encoder=regions reads region features from dataset.features (a region cache or a folder of npz "
             "files): it has no image path, so it cannot caption image files; to caption photos, train over an image "
             "encoder (e.g. encoder=mobilenet_v2, its features cached: README, \"Real photographs\")")


class RegionFeatures(Encoder):
    """Region features of width `dim`, precomputed: the annotations a_i are the regions' feature vectors."""

    @constrained
    def __init__(self, dim: Size = 2048):
        super().__init__()
        self.out_dim = dim

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        raise ValueError(NO_IMAGES)

    def transform(self) -> Callable:
        """Unused (the data set reads the regions, never the image), but a data set needs one."""
        return T.ToTensor()
