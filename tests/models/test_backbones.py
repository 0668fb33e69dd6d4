"""torchvision backbones as grid encoders: each family's grid, weights from a name or a checked file, one-line refusals,
and the real ImageNet weights on real photographs."""

from __future__ import annotations

import csv
import re
import shutil
import urllib.error

import pytest
import torch
import torchvision
from fixtures import FLICKR8K_1K, MOBILENET_V2_FILE, needs_flickr8k_1k, needs_offline_weights
from PIL import Image

from captioning.data.images import load_image
from captioning.models import weights as weights_module
from captioning.models.backbones import FAMILIES, family_of
from captioning.models.encoder import TorchvisionEncoder
from captioning.models.weights import WeightsUnavailable, load_backbone

ONE_PER_FAMILY = {"mobilenet": "mobilenet_v3_small", "efficientnet": "efficientnet_b0", "convnext": "convnext_tiny",
                  "resnet": "resnet18", "regnet": "regnet_y_400mf", "densenet": "densenet121", "vgg": "vgg11"}


def test_every_family_is_exercised():
    assert set(ONE_PER_FAMILY) == {f.name for f in FAMILIES}


@pytest.mark.parametrize("family, arch", ONE_PER_FAMILY.items())
def test_each_family_gives_its_stated_grid_and_width(family, arch):
    enc = TorchvisionEncoder(arch, pretrained=False).eval()
    assert family_of(arch).name == family
    stride = family_of(arch).stride
    with torch.no_grad():
        fmap = enc(torch.randn(2, 3, 96, 64))  # (B, D, h, w)
    assert fmap.shape == (2, enc.out_dim, 96 // stride, 64 // stride)  # D found without a forward pass
    assert not any(p.requires_grad for p in enc.parameters()) and not enc.train().training  # frozen: eval BN
    top = TorchvisionEncoder(arch, pretrained=False, fine_tune="top")
    trainable = {n for n, p in top.named_parameters() if p.requires_grad}
    assert trainable and {n.split(".")[1] for n in trainable} == {str(len(list(top.body.children())) - 1 - next(
        i for i, b in enumerate(reversed(list(top.body.children()))) if any(True for _ in b.parameters())))}


def test_the_grid_can_be_pooled_to_a_size():
    enc = TorchvisionEncoder("mobilenet_v3_small", pretrained=False, grid_size=3).eval()
    with torch.no_grad():
        assert enc(torch.randn(1, 3, 224, 224)).shape == (1, 576, 3, 3)


def test_an_unknown_architecture_or_weights_name_is_one_line():
    with pytest.raises(ValueError, match=r"encoder.arch='mobilenet_v9' is not a torchvision classification model .*"
                                         r"did you mean 'mobilenet_v2'.*families: mobilenet, efficientnet"):
        TorchvisionEncoder("mobilenet_v9")
    with pytest.raises(ValueError, match=r"encoder.weights='IMAGENET1K_V3' is neither a file nor a weights name of "
                                         r"mobilenet_v2: choose one of IMAGENET1K_V1, IMAGENET1K_V2"):
        TorchvisionEncoder("mobilenet_v2", weights="IMAGENET1K_V3")
    with pytest.raises(ValueError, match=r"encoder.weights=x.pth is set but encoder.pretrained=false"):
        TorchvisionEncoder("mobilenet_v2", pretrained=False, weights="x.pth")


def _offline(monkeypatch, tmp_path):
    """No network: torchvision's download fails; nothing in the hub cache, no offline package, no weights folder."""
    get_model = torchvision.models.get_model

    def offline(name, weights=None, **kwargs):
        if weights is not None:
            raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
        return get_model(name, weights=None, **kwargs)

    monkeypatch.setattr(torchvision.models, "get_model", offline)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.delenv(weights_module.WEIGHTS_DIR_ENV, raising=False)
    monkeypatch.setattr(weights_module, "OFFLINE_PACKAGE", "no_such_package_here")


def test_offline_without_the_file_is_one_oserror_line_saying_where_to_put_it(monkeypatch, tmp_path):
    _offline(monkeypatch, tmp_path)
    with pytest.raises(WeightsUnavailable, match=r"cannot download the resnet18 weights ResNet18_Weights.IMAGENET1K_V1 "
                                                 r".*encoder.weights=/path/to/resnet18-f37072fd.pth.*"
                                                 r"encoder.pretrained=false") as err:
        TorchvisionEncoder("resnet18")
    assert "\n" not in str(err.value) and isinstance(err.value, OSError)


@needs_offline_weights
def test_a_weights_name_is_found_on_this_machine_before_any_download(monkeypatch, tmp_path):
    _offline(monkeypatch, tmp_path)
    folder = tmp_path / "weights"
    folder.mkdir()
    shutil.copy(MOBILENET_V2_FILE, folder / MOBILENET_V2_FILE.name)  # torchvision's own file name
    monkeypatch.setenv(weights_module.WEIGHTS_DIR_ENV, str(folder))
    by_name = TorchvisionEncoder("mobilenet_v2", weights="IMAGENET1K_V1")
    by_file = TorchvisionEncoder("mobilenet_v2", weights=str(MOBILENET_V2_FILE))
    assert all(torch.equal(a, b) for a, b in zip(by_name.state_dict().values(), by_file.state_dict().values()))
    assert by_file.weights_origin() == "mobilenet_v2 from the file mobilenet_v2-b0353104.pth"


@needs_offline_weights
def test_weights_from_the_file_are_torchvisions_model():
    enc = TorchvisionEncoder("mobilenet_v2", weights=str(MOBILENET_V2_FILE)).eval()
    reference = torchvision.models.mobilenet_v2()
    reference.load_state_dict(torch.load(MOBILENET_V2_FILE, weights_only=True))
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert torch.equal(enc(x), reference.eval().features(x))  # (B, 1280, 7, 7)


@needs_offline_weights
@pytest.mark.parametrize("damage, says", [
    ("truncated", r"its SHA-256 begins [0-9a-f]{8}, but its name says b0353104: the file is damaged \(truncated\?\)"),
    ("another arch", r"does not hold torchvision mobilenet_v2's weights: .*tensors missing \(e.g. features.0.0.weight\)"
                     r"; .*give the file of encoder.arch=mobilenet_v2"),
    ("other shapes", r"does not hold torchvision mobilenet_v2's weights: 1 tensors of another shape \(e.g. "
                     r"classifier.1.weight: 10 x 1280 in the file, 1000 x 1280 in mobilenet_v2\)"),
    ("code", r"holds more than tensors \(pickled objects, e.g. a whole model\), so it is not read"),
    ("a model", r"holds more than tensors \(pickled objects, e.g. a whole model\), so it is not read"),
    ("not torch", r"is not a PyTorch weights file"),
    ("missing", r"encoder.weights: .*nothing.pth: no such file"),
])
def test_a_wrong_weights_file_is_refused_in_one_line_before_use(tmp_path, damage, says):
    path = tmp_path / "mobilenet_v2.pth"
    if damage == "truncated":
        path = tmp_path / MOBILENET_V2_FILE.name
        path.write_bytes(MOBILENET_V2_FILE.read_bytes()[:1_000_000])
    elif damage == "another arch":
        torch.save(torchvision.models.resnet18().state_dict(), path)
    elif damage == "other shapes":
        state = torch.load(MOBILENET_V2_FILE, weights_only=True)
        state["classifier.1.weight"] = state["classifier.1.weight"][:10]
        torch.save(state, path)
    elif damage == "code":
        ran = tmp_path / "ran"
        torch.save(_Runs(str(ran)), path)  # unpickling would run code
    elif damage == "a model":
        torch.save(torchvision.models.mobilenet_v2(), path)  # a whole pickled module, not its state dict
    elif damage == "not torch":
        path.write_text("not weights")
    else:
        path = tmp_path / "nothing.pth"
    with pytest.raises((ValueError, OSError), match=says) as err:
        load_backbone("mobilenet_v2", True, str(path))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "ran").exists()


class _Runs:
    """Unpickled, it would create a file: the weights reader must never run it."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _photos_all_captions_mention(word: str, n: int) -> list[str]:
    captions: dict[str, list[str]] = {}
    with open(FLICKR8K_1K / "captions.csv", newline="") as f:
        for row in csv.DictReader(f):
            captions.setdefault(row["image"], []).append(f" {row['caption'].lower()} ")
    return [image for image, texts in captions.items() if all(f" {word} " in t for t in texts)][:n]


@needs_flickr8k_1k
@needs_offline_weights
def test_the_real_weights_and_preprocessing_see_the_dogs_in_real_photos():
    """The encoder's preprocessing with the real ImageNet weights: each of five photos that all five people
    described as showing a dog has a dog breed (ImageNet classes 151-268) among the classifier's top five."""
    enc = TorchvisionEncoder("mobilenet_v2", weights=str(MOBILENET_V2_FILE)).eval()
    classifier = torchvision.models.mobilenet_v2()
    classifier.load_state_dict(torch.load(MOBILENET_V2_FILE, weights_only=True))
    photos = _photos_all_captions_mention("dog", 5)
    x = torch.stack([enc.transform()(load_image(FLICKR8K_1K / "images" / p)) for p in photos])  # (5, 3, 224, 224)
    with torch.no_grad():
        logits = classifier.eval().classifier(torch.flatten(enc(x).mean((2, 3)), 1))  # the grid -> its classes
    top5 = logits.topk(5).indices
    assert len(photos) == 5 and all(((151 <= t) & (t <= 268)).any() for t in top5), top5


def test_the_families_are_stated_where_a_user_reads_them():
    yaml_text = (weights_module.Path(__file__).resolve().parents[2] / "conf" / "encoder" / "torchvision.yaml").read_text()
    assert all(re.search(rf"\b{f.name}\b", yaml_text) for f in FAMILIES), "conf/encoder/torchvision.yaml names them"
    assert Image  # PIL imported for load_image's images
