"""Encoders: grid shapes and fine-tuning switches (weights that cannot be fetched: tests/models/test_backbones.py)."""


import pytest
import torch

from captioning.models.encoder import ResNetEncoder, SmallCNN, VGGEncoder


def test_small_cnn_grid_and_coord_channels():
    enc = SmallCNN(channels=(8, 16, 32), num_pools=3)
    fmap = enc(torch.randn(2, 3, 64, 48))
    assert fmap.shape == (2, 32, 8, 6) and enc.out_dim == 32  # (B, D, h, w)
    assert enc.features[0].in_channels == 5  # RGB + (x, y)
    assert SmallCNN(coord_channels=False).features[0].in_channels == 3


@pytest.mark.parametrize("arch", ["vgg16", "vgg19"])
def test_vgg_conv5_before_last_pool(arch):
    enc = VGGEncoder(arch, pretrained=False, fine_tune="top").eval()
    with torch.no_grad():
        fmap = enc(torch.randn(1, 3, 64, 64))
    assert fmap.shape == (1, 512, 4, 4)  # 224 px would give the paper's 14 x 14 x 512
    trainable = [n for n, p in enc.named_parameters() if p.requires_grad]
    convs = [m for m in enc.features if isinstance(m, torch.nn.Conv2d)]
    assert len(trainable) == 8 and all(p.requires_grad for m in convs[-4:] for p in m.parameters())


def test_resnet_grid_and_frozen_batchnorm():
    enc = ResNetEncoder("resnet50", pretrained=False, fine_tune="none", grid_size=7)
    assert not any(p.requires_grad for p in enc.parameters())
    enc.train()
    assert not enc.training  # a frozen backbone keeps BatchNorm in eval mode
    with torch.no_grad():
        assert enc(torch.randn(1, 3, 96, 96)).shape == (1, 2048, 7, 7)
    top = ResNetEncoder("resnet50", pretrained=False, fine_tune="top")
    assert {n.split(".")[1] for n, p in top.named_parameters() if p.requires_grad} == {"7"}  # layer4 only
    with pytest.raises(ValueError, match="fine_tune"):
        ResNetEncoder("resnet50", pretrained=False, fine_tune="some")


def test_transform_matches_encoder_input_size():
    from PIL import Image

    enc = VGGEncoder("vgg16", pretrained=False)
    x = enc.transform()(Image.new("RGB", (320, 240)))
    assert x.shape == (3, 224, 224)
