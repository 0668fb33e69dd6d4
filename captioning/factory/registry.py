"""The project's own components by name: the only classes a model config or a checkpoint can build.

A config names each component by its `_target_`: the stable name it is registered under here (`sat`, `soft`,
`small_cnn`, as timm registers its models by name), which a checkpoint stores. That string is only ever a key into
the dicts below, never imported, so a checkpoint cannot make the loader run code of its choosing; the other keys of
a spec must be arguments of the class's constructor, with values of the types and within the constraints its
signature declares (plain data: no nested `_target_`, no `${...}` interpolation; captioning/base/signature.py binds
them, the same check the config validator runs). Names, not import paths: a module can move without breaking a
checkpoint. Checkpoints written before the names stored import paths: `captioning.checkpoint.moved.NAMED` maps
each to its name, once, when a checkpoint's config is read.

To add a component: import its class here and add one line `"<name>": Class` to its group's dict; its conf/ YAML
file's `_target_` is that name (tests/models/test_model.py checks every YAML names a registered component).
Encoders are built with their config's arguments; attentions also get `annotation_dim` and `hidden_dim`, decoders
`vocab_size`, `annotation_dim` and `attention` (a factory taking those two) from the builder; data set readers get
`splits`.

To add a `_target_` group (as `objective` was, below): add its dict to GROUPS (and its config key to CONFIG_KEYS
when it is not the group's name, its builder's own arguments to BUILDER_ARGS). The config validator then checks
every config of the group against its target's signature, with no schema edit (captioning/config/targets.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn

from captioning.base.constraints import matches as _matches  # noqa: F401 (the type check, tests/models/test_model.py)
from captioning.base.signature import argument_problems, parameters
from captioning.data.readers.coco_captions import read_coco_captions
from captioning.data.readers.karpathy import read_karpathy_splits
from captioning.data.readers.table import read_table
from captioning.data.shapes.generate import build_shapes
from captioning.models.attention import HardAttention, SoftAttention
from captioning.models.attention_family import (
    ConcatAttention,
    DotAttention,
    GeneralAttention,
    MeanAttention,
    MultiHeadAttention,
)
from captioning.models.channel import ChannelAttention
from captioning.models.decoders.adaptive import AdaptiveDecoder
from captioning.models.decoders.aoa import AoADecoder
from captioning.models.decoders.att2in import Att2allDecoder, Att2inDecoder
from captioning.models.decoders.fc import ShowTellDecoder
from captioning.models.decoders.luong import LuongDecoder
from captioning.models.decoders.m2 import M2Decoder
from captioning.models.decoders.sat import ShowAttendTellDecoder
from captioning.models.decoders.transformer import TransformerDecoder
from captioning.models.decoders.updown import UpDownDecoder
from captioning.models.encoder import Encoder, ResNetEncoder, SmallCNN, TorchvisionEncoder, VGGEncoder
from captioning.models.grid_attention import LocalAttention, LocationAttention
from captioning.models.monotonic import MonotonicAttention
from captioning.models.multi_encoder import MultiEncoder, as_spec
from captioning.models.multilevel import MultiLevelAttention
from captioning.models.multirep import MultiRepAttention
from captioning.models.region_encoder import RegionFeatures
from captioning.training.objectives import CrossEntropy, SelfCritical


def multi_encoder(encoders: list[Any]) -> MultiEncoder:
    """`encoder=multi`: each entry of `encoders` is an encoder spec whose `encoder` key names the registered encoder
    (a nested value may not hold `_target_`) and whose other keys are its arguments, checked as any encoder's."""
    built = []
    for i, spec in enumerate(encoders):
        where = f"encoder.encoders[{i}]"
        if not isinstance(spec, Mapping) or "encoder" not in spec:
            raise ModelSpecError(f"{where} must be a mapping whose `encoder` key names one of this project's encoders "
                                 f"({', '.join(n for n in ENCODERS if n != 'multi')}), got {_short(spec)}")
        if spec["encoder"] == "multi":
            raise ModelSpecError(f"{where}.encoder: an encoder=multi cannot hold another multi (list its encoders)")
        built.append(build("encoder", as_spec(spec), where))
    return MultiEncoder(built)


ENCODERS: dict[str, Callable[..., Encoder]] = {
    "small_cnn": SmallCNN,
    "vgg": VGGEncoder,
    "resnet": ResNetEncoder,
    "torchvision": TorchvisionEncoder,
    "multi": multi_encoder,
    "regions": RegionFeatures,
}
ATTENTIONS: dict[str, type[nn.Module]] = {
    "soft": SoftAttention,
    "hard": HardAttention,
    "concat": ConcatAttention,
    "dot": DotAttention,
    "general": GeneralAttention,
    "local": LocalAttention,
    "location": LocationAttention,
    "multihead": MultiHeadAttention,
    "mean": MeanAttention,
    "monotonic": MonotonicAttention,
    "channel": ChannelAttention,
    "multilevel": MultiLevelAttention,
    "multirep": MultiRepAttention,
}
DECODERS: dict[str, type[nn.Module]] = {
    "sat": ShowAttendTellDecoder,
    "luong": LuongDecoder,
    "updown": UpDownDecoder,
    "transformer": TransformerDecoder,
    "fc": ShowTellDecoder,
    "att2in": Att2inDecoder,
    "att2all": Att2allDecoder,
    "adaptive": AdaptiveDecoder,
    "aoa": AoADecoder,
    "m2": M2Decoder,
}
# `dataset.generate` of a data set the project makes itself (a checkpoint's dataset section may name it).
DATASET_GENERATORS: dict[str, Callable[..., Any]] = {
    "shapes": build_shapes,
}
# `dataset.reader`: how a data set's files become image records (conf/dataset/reader/; a checkpoint stores it).
READERS: dict[str, Callable[..., Any]] = {
    "karpathy": read_karpathy_splits,
    "coco": read_coco_captions,
    "table": read_table,
}
# `objective`: what the training loss is (conf/objective/: xe, scst); the trainer builds it with its config's arguments.
OBJECTIVES: dict[str, Callable[..., Any]] = {
    "xe": CrossEntropy,
    "scst": SelfCritical,
}
GROUPS: dict[str, Mapping[str, Callable[..., Any]]] = {
    "encoder": ENCODERS, "attention": ATTENTIONS, "decoder": DECODERS, "generator": DATASET_GENERATORS,
    "reader": READERS, "objective": OBJECTIVES}
# The config key of a group that does not sit at its own name.
CONFIG_KEYS = {"generator": "dataset.generate", "reader": "dataset.reader"}
# Constructor arguments the builder passes itself; a config may not set them.
BUILDER_ARGS: dict[str, tuple[str, ...]] = {
    "encoder": (), "attention": ("annotation_dim", "hidden_dim"),
    "decoder": ("vocab_size", "annotation_dim", "attention"), "generator": ("writable",), "reader": ("splits",),
    "objective": ()}
PLURAL = {"encoder": "encoders", "attention": "attentions", "decoder": "decoders", "generator": "data set generators",
          "reader": "data set readers", "objective": "training objectives"}
HYDRA_KEYS = ("_target_", "_partial_", "_args_", "_recursive_", "_convert_")


def group_at(key: str) -> str | None:
    """The registry group a config key holds ('dataset.reader' -> 'reader', 'encoder' -> 'encoder'), or None."""
    return next((g for g in GROUPS if CONFIG_KEYS.get(g, g) == key), None)


class ModelSpecError(ValueError):
    """A component spec that names a class outside the registry, or arguments its constructor does not take."""


def resolve(group: str, spec: Any, where: str) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The registered class of `spec["_target_"]` and its checked keyword arguments; `where` prefixes key names."""
    table = GROUPS[group]
    if not isinstance(spec, Mapping):
        raise ModelSpecError(f"{where} must be a mapping with a _target_, got {_short(spec)}")
    target = spec.get("_target_")
    if not isinstance(target, str) or target not in table:
        names = ", ".join(table)
        raise ModelSpecError(f"{where}._target_ {_short(target)} is not one of this project's "
                             f"{PLURAL.get(group, group)} ({names})")
    kwargs = {k: v for k, v in spec.items() if k != "_target_"}
    check_arguments(table[target], kwargs, where, BUILDER_ARGS.get(group, ()))
    return table[target], kwargs


def with_added_defaults(stored: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's model config `stored` with the arguments its components gained since it was written: a key of
    the run's group (same `_target_`) that the stored group lacks gets its constructor's default, which is what
    loading the checkpoint builds (a decoder=adaptive run from before `sentinel` resumes as the sentinel model).
    resume and init_from compare the run's model config with this."""
    out = dict(stored)
    for group, spec in run.items():
        old = stored.get(group)
        if not (isinstance(spec, Mapping) and isinstance(old, Mapping) and old.get("_target_") == spec.get("_target_")
                and old.get("_target_") in GROUPS.get(group, {})):
            continue
        params = parameters(GROUPS[group][old["_target_"]])
        added = {k: params[k].default for k in spec if k not in old and k in params
                 and params[k].default is not inspect.Parameter.empty}
        out[group] = {**old, **added}
    return out


def build(group: str, spec: Any, where: str | None = None) -> Any:
    """The registered component `spec` names, built with its checked arguments (`where` defaults to the group)."""
    cls, kwargs = resolve(group, spec, where or group)
    return cls(**kwargs)


def check_arguments(fn: Callable[..., Any], kwargs: Mapping[str, Any], where: str,
                    reserved: Sequence[str] = ()) -> None:
    """Refuse anything but plain data, keys that are not named parameters of `fn`, values not of their declared type
    or outside their declared constraints, and missing arguments (the first problem, as a ModelSpecError)."""
    for key, value in kwargs.items():
        if isinstance(key, str) and not key.startswith("_"):
            check_data(value, f"{where}.{key}")
    name = getattr(fn, "__name__", str(fn))
    for p in argument_problems(fn, kwargs, reserved):
        if p.kind == "hydra":
            raise ModelSpecError(f"{where}.{p.key} is a Hydra instantiation key, not an argument of {name}")
        if p.kind == "reserved":
            raise ModelSpecError(f"{where}.{p.key} is set by the builder, not by a config")
        if p.kind == "unknown":
            known = ", ".join(n for n in parameters(fn) if n not in reserved)
            raise ModelSpecError(f"{where}.{p.key} is not an argument of {name} (it takes {known})")
        if p.kind == "missing":
            raise ModelSpecError(f"{where} lacks {p.key}, required by {name}")
        separator = "" if p.message.startswith("=") else ": "
        raise ModelSpecError(f"{where}.{p.key}{separator}{p.message}")


def check_data(value: Any, where: str) -> None:
    """Refuse anything but plain data: Hydra keys in nested mappings, `${...}` interpolations, other objects."""
    if isinstance(value, str):
        if "${" in value:
            raise ModelSpecError(f"{where} = {_short(value)} is a config interpolation, not a plain value")
    elif isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str) or k in HYDRA_KEYS or k.startswith("_"):
                raise ModelSpecError(f"{where}.{k} is a Hydra instantiation key inside a value")
            check_data(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_data(v, f"{where}[{i}]")
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise ModelSpecError(f"{where} holds a {type(value).__name__}, not plain data")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
