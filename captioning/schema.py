"""Typed schema of the configuration: every config group as a dataclass, checked before any work starts.

Hydra composes `conf/` as usual, so `conf/experiment/` presets still say only what differs; the merged
config is then checked against the dataclasses below (types, allowed values, ranges, paths that must exist,
unknown keys with a did-you-mean) by the engine in captioning/config_check.py. All problems are reported at
once, each naming its full key:

    ConfigError: invalid configuration (2 problems):
      optim.lr=-0.1: must be > 0
      attention: unknown type 'captioning.models.attention.Sofft'; choose one of SoftAttention, ...

Groups that pick a class by `_target_` (encoder, attention, decoder, optim, scheduler) have one dataclass
per class; a new class needs its dataclass here (tests check every file in conf/ is covered). Keys that the
shipped YAML files of dataset/, eval/ and train.yaml's trainer carry but no field here types yet are accepted
as they are; any other unknown key is an error.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import DictConfig

# ConfigError is what validate_*_config raise, importable from here next to them.
from captioning.config_check import ConfigError, Problem, checked, choose_one, validate  # noqa: F401
from captioning.metrics.coco import VALID_METRICS

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
# The metrics validation computes (what trainer.monitor may name; captioning.train uses this list too) and the
# metrics scoring knows.
MONITORS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr", "attention_correctness")
METRICS = tuple(VALID_METRICS)


# -- model groups ------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class Targeted:
    """A group whose `_target_` names the class or function Hydra instantiates."""

    _target_: str


@dataclass(kw_only=True)
class EncoderConfig(Targeted):
    """conf/encoder/: the CNN that turns an image into the L x D annotation grid."""


@dataclass(kw_only=True)
class SmallCNNConfig(EncoderConfig):
    _target_: str = "captioning.models.encoder.SmallCNN"
    channels: list[int] = checked([32, 64, 128, 128], ge=1)
    num_pools: int = checked(3, ge=0)
    coord_channels: bool = True


VGG_ARCHS = Literal["vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn"]
RESNET_ARCHS = Literal["resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d",
                       "resnext101_32x8d", "wide_resnet50_2", "wide_resnet101_2"]
FineTune = Literal["none", "top", "all"]


@dataclass(kw_only=True)
class VGGEncoderConfig(EncoderConfig):
    _target_: str = "captioning.models.encoder.VGGEncoder"
    arch: VGG_ARCHS = "vgg19"
    pretrained: bool = True
    fine_tune: FineTune = "none"
    image_size: int = checked(224, ge=32)


@dataclass(kw_only=True)
class ResNetEncoderConfig(VGGEncoderConfig):
    _target_: str = "captioning.models.encoder.ResNetEncoder"
    arch: RESNET_ARCHS = "resnet101"
    grid_size: int = checked(14, ge=1)


@dataclass(kw_only=True)
class AttentionConfig(Targeted):
    """conf/attention/: how the decoder weighs the L regions at each word."""


@dataclass(kw_only=True)
class SoftAttentionConfig(AttentionConfig):
    _target_: str = "captioning.models.attention.SoftAttention"
    attention_dim: int = checked(512, ge=1)


@dataclass(kw_only=True)
class HardAttentionConfig(SoftAttentionConfig):
    _target_: str = "captioning.models.attention.HardAttention"
    expected_context_prob: float = checked(0.5, ge=0, le=1)
    test_mode: Literal["expectation", "argmax", "sample"] = "expectation"


@dataclass(kw_only=True)
class ConcatAttentionConfig(SoftAttentionConfig):
    _target_: str = "captioning.models.attention_family.ConcatAttention"


@dataclass(kw_only=True)
class DotAttentionConfig(AttentionConfig):
    _target_: str = "captioning.models.attention_family.DotAttention"
    project: bool = True
    scale: bool = True


@dataclass(kw_only=True)
class GeneralAttentionConfig(AttentionConfig):
    _target_: str = "captioning.models.attention_family.GeneralAttention"
    region_bias: bool = True


@dataclass(kw_only=True)
class LocalAttentionConfig(AttentionConfig):
    _target_: str = "captioning.models.attention_family.LocalAttention"
    score: Literal["general", "dot"] = "general"
    predictor_dim: int = checked(512, ge=1)
    sigma: float | None = checked(None, gt=0)
    sigma_scale: float = checked(0.25, gt=0)


@dataclass(kw_only=True)
class LocationAttentionConfig(SoftAttentionConfig):
    _target_: str = "captioning.models.attention_family.LocationAttention"
    num_filters: int = checked(16, ge=1)
    kernel_size: int = checked(5, ge=1)


@dataclass(kw_only=True)
class MultiHeadAttentionConfig(AttentionConfig):
    _target_: str = "captioning.models.attention_family.MultiHeadAttention"
    num_heads: int = checked(8, ge=1)
    head_dim: int = checked(64, ge=1)


@dataclass(kw_only=True)
class DecoderConfig(Targeted):
    """conf/decoder/: the LSTM that writes the caption."""

    _target_: str = "captioning.models.decoder.ShowAttendTellDecoder"
    embed_dim: int = checked(512, ge=1)
    hidden_dim: int = checked(512, ge=1)
    init_layers: int = checked(1, ge=1)
    selector: bool = True
    dropout: float = checked(0.5, ge=0, lt=1)
    init_from_annotations: bool = True


# -- optimisation ------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class OptimConfig(Targeted):
    """conf/optim/: a torch optimizer, built later with the parameters (hence `_partial_: true`)."""

    _partial_: Literal[True] = True
    lr: float = checked(gt=0)
    weight_decay: float = checked(0.0, ge=0)


@dataclass(kw_only=True)
class AdamConfig(OptimConfig):
    _target_: str = "torch.optim.Adam"
    betas: list[float] = checked([0.9, 0.999], ge=0, lt=1)
    eps: float = checked(1e-8, gt=0)
    amsgrad: bool = False


@dataclass(kw_only=True)
class AdamWConfig(AdamConfig):
    _target_: str = "torch.optim.AdamW"


@dataclass(kw_only=True)
class RMSpropConfig(OptimConfig):
    _target_: str = "torch.optim.RMSprop"
    alpha: float = checked(0.99, ge=0, lt=1)
    eps: float = checked(1e-8, gt=0)
    momentum: float = checked(0.0, ge=0, lt=1)
    centered: bool = False


@dataclass(kw_only=True)
class SGDConfig(OptimConfig):
    _target_: str = "torch.optim.SGD"
    momentum: float = checked(0.0, ge=0, lt=1)
    dampening: float = checked(0.0, ge=0, le=1)
    nesterov: bool = False


@dataclass(kw_only=True)
class SchedulerConfig(Targeted):
    """conf/scheduler/: a learning-rate schedule (an empty group means a constant rate)."""

    _partial_: Literal[True] = True
    empty_is_none: typing.ClassVar[bool] = True  # `scheduler: {}` or null: no schedule


@dataclass(kw_only=True)
class PlateauConfig(SchedulerConfig):
    _target_: str = "torch.optim.lr_scheduler.ReduceLROnPlateau"
    # Every monitored metric is higher-is-better, so only `max` makes sense.
    mode: Literal["max"] = "max"
    factor: float = checked(0.1, gt=0, lt=1)
    patience: int = checked(10, ge=0)
    threshold: float = checked(1e-4, ge=0)
    threshold_mode: Literal["rel", "abs"] = "rel"
    cooldown: int = checked(0, ge=0)
    min_lr: float = checked(0.0, ge=0)


@dataclass(kw_only=True)
class StepLRConfig(SchedulerConfig):
    _target_: str = "torch.optim.lr_scheduler.StepLR"
    step_size: int = checked(ge=1)
    gamma: float = checked(0.1, gt=0, le=1)


@dataclass(kw_only=True)
class CosineConfig(SchedulerConfig):
    _target_: str = "torch.optim.lr_scheduler.CosineAnnealingLR"
    T_max: int = checked(ge=1)
    eta_min: float = checked(0.0, ge=0)


# -- data, training, evaluation ----------------------------------------------------------------------
class ShippedKeys:
    """Accepts, without a type, the keys of the shipped YAML files that `extra_keys_from` = (glob under conf/,
    section or None) names: a key another part of the code base adds to conf/ keeps validating before its schema
    field is written (the same key in a user's override is still a typo)."""

    extra_keys_from: typing.ClassVar[tuple[str, str | None]]

    @classmethod
    def extra_keys(cls) -> set[str]:
        """The keys of the YAML files matching CONF_DIR / pattern (under section), except `defaults`."""
        pattern, section = cls.extra_keys_from
        keys: set[str] = set()
        for file in sorted(CONF_DIR.glob(pattern)):
            data = yaml.safe_load(file.read_text()) or {}
            data = data.get(section) if section and isinstance(data, dict) else data
            keys |= {k for k in data if k != "defaults"} if isinstance(data, dict) else set()
        return keys


@dataclass(kw_only=True)
class ShapesConfig(Targeted):
    """dataset.generate for `shapes`: the arguments of captioning.data.shapes.build_shapes."""

    _target_: str = "captioning.data.shapes.build_shapes"
    root: str
    seed: int = checked(0, ge=0)
    num_train: int = checked(4000, ge=1)
    num_val: int = checked(250, ge=1)
    num_test: int = checked(250, ge=1)
    image_size: int = checked(96, ge=32)
    captions_per_image: int = checked(5, ge=1, le=20)
    object_scale: float = checked(1.0, ge=0.5, le=1.5)


@dataclass(kw_only=True)
class CocoCaptionsConfig:
    """dataset.coco: the raw COCO caption files, read when dataset.format=coco."""

    train_captions: str
    val_captions: str
    train_images: str = "train2014"
    val_images: str = "val2014"
    split_file: str | None = None
    num_val: int = checked(5000, ge=0)
    num_test: int = checked(5000, ge=0)


@dataclass(kw_only=True)
class DatasetConfig(ShippedKeys):
    """conf/dataset/: annotation file, images, vocabulary and batching. Keys that appear in any
    conf/dataset/*.yaml but not here (format-specific extras) are accepted as they are."""

    name: str
    annotations: str | None = None
    image_root: str | None = None
    root: str | None = None
    generate: ShapesConfig | None = None
    format: Literal["karpathy", "coco"] = "karpathy"
    coco: CocoCaptionsConfig | None = None
    features: str | None = None  # a feature cache folder (captioning.extract_features)
    min_word_freq: int = checked(ge=1)
    max_vocab: int | None = checked(None, ge=1)
    max_caption_len: int = checked(ge=1)
    batch_size: int = checked(ge=1)
    captions_per_image: int | None = checked(None, ge=1)
    num_workers: int = checked(0, ge=0)
    extra_keys_from: typing.ClassVar[tuple[str, str | None]] = ("dataset/*.yaml", None)

    @staticmethod
    def rules(v: Mapping[str, Any]) -> Iterator[Problem]:
        """Files a data set that is not generated needs must exist before training starts."""
        if v.get("generate") is not None:
            return
        files = {"annotations": v.get("annotations")}
        if v.get("format") == "coco":
            coco = v.get("coco") if isinstance(v.get("coco"), dict) else {}
            files = {f"coco.{k}": coco.get(k) for k in ("train_captions", "val_captions", "split_file")}
            files["coco.split_file"] = files["coco.split_file"] or ""  # optional
            if not coco:
                yield "coco", "must be set with format=coco (train_captions and val_captions files)"
        for key, path in files.items():
            if path is None and key == "annotations":
                yield key, f"must be set for dataset {v.get('name')!r} (a Karpathy split JSON file)"
            elif isinstance(path, str) and path and not Path(path).is_file():
                yield key, f"={path!r}: file not found; set dataset.{key}=PATH"
        folders = {"features": v.get("features")} if v.get("features") else {"image_root": v.get("image_root")}
        for key, path in folders.items():  # with cached features the images themselves are not read
            if isinstance(path, str) and not Path(path).is_dir():
                yield key, f"={path!r}: folder not found; set dataset.{key}=PATH"


@dataclass(kw_only=True)
class EvalConfig(ShippedKeys):
    """conf/eval/: test-time decoding and scoring."""

    split: Literal["train", "val", "test"] = "test"
    beam_size: int = checked(3, ge=1)
    max_len: int = checked(20, ge=1)
    length_penalty: float = checked(0.0, ge=0)
    batch_size: int = checked(50, ge=1)
    metrics: list[str] = checked(["bleu", "meteor", "rouge", "cider"], choices=METRICS)
    num_figures: int = checked(4, ge=0)
    report: bool = True  # write report.html and attention.npz
    instances: str | None = None  # COCO instances file for mask-based attention correctness
    extra_keys_from: typing.ClassVar[tuple[str, str | None]] = ("eval/*.yaml", None)

    @staticmethod
    def rules(v: Mapping[str, Any]) -> Iterator[Problem]:
        path = v.get("instances")
        if isinstance(path, str) and not Path(path).is_file():
            yield "instances", f"={path!r}: file not found; set eval.instances=PATH or null"


@dataclass(kw_only=True)
class ReinforceConfig:
    """trainer.reinforce: REINFORCE weights for attention that samples regions (attention=hard)."""

    reward_weight: float = checked(0.1, ge=0)
    entropy_weight: float = checked(0.002, ge=0)
    baseline_decay: float = checked(0.9, ge=0, lt=1)
    num_samples: int = checked(1, ge=1)


@dataclass(kw_only=True)
class TrainerConfig(ShippedKeys):
    """trainer: the training loop, early stopping and logging."""

    max_epochs: int = checked(ge=1)
    max_minutes: float | None = checked(None, gt=0)
    grad_clip: float | None = checked(None, ge=0)
    attention_weight: float = checked(0.0, ge=0)
    reinforce: ReinforceConfig = field(default_factory=ReinforceConfig)
    monitor: str = "CIDEr"
    patience: int = checked(ge=1)
    val_beam_size: int = checked(1, ge=1)
    log_every: int = checked(25, ge=1)
    progress: bool = True
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # autocast dtype of the training forward pass
    extra_keys_from: typing.ClassVar[tuple[str, str | None]] = ("train.yaml", "trainer")

    @staticmethod
    def rules(v: Mapping[str, Any]) -> Iterator[Problem]:
        monitor = v.get("monitor")
        if isinstance(monitor, str) and monitor not in MONITORS:
            yield "monitor", f"={monitor!r} is not computed during validation; {choose_one(monitor, MONITORS)}"


DEVICE = {"pattern": r"auto|cpu|mps|cuda(:\d+)?", "expect": "auto, cpu, mps, cuda or cuda:N"}


@dataclass(kw_only=True)
class TrainConfig:
    """conf/train.yaml after composition: what `captioning-train` runs."""

    seed: int = checked(ge=0)
    device: str = checked(**DEVICE)
    data_dir: str
    resume: str | None = None
    trainer: TrainerConfig
    dataset: DatasetConfig
    encoder: EncoderConfig
    attention: AttentionConfig
    decoder: DecoderConfig
    optim: OptimConfig
    scheduler: SchedulerConfig | None = None
    eval: EvalConfig

    @staticmethod
    def rules(v: Mapping[str, Any]) -> Iterator[Problem]:
        resume = v.get("resume")
        if isinstance(resume, str) and resume != "auto" and not Path(resume).is_file():
            yield "resume", f"={resume!r}: checkpoint not found; give a checkpoint file, auto or null"


@dataclass(kw_only=True)
class EvaluateConfig:
    """conf/evaluate.yaml after composition: what `captioning-evaluate` runs."""

    checkpoint: str
    device: str = checked(**DEVICE)
    data_dir: str
    eval: EvalConfig
    dataset: DatasetConfig | None = None

    @staticmethod
    def rules(v: Mapping[str, Any]) -> Iterator[Problem]:
        if isinstance(v.get("checkpoint"), str) and v["checkpoint"] != "???" and not Path(v["checkpoint"]).is_file():
            yield "checkpoint", f"={v['checkpoint']!r}: checkpoint not found; give checkpoint=PATH to a .pt file"


def validate_train_config(cfg: DictConfig | Mapping[str, Any]) -> None:
    """Check a composed `captioning-train` config; raises ConfigError naming every bad key."""
    validate(cfg, TrainConfig)


def validate_evaluate_config(cfg: DictConfig | Mapping[str, Any]) -> None:
    """Check a composed `captioning-evaluate` config; raises ConfigError naming every bad key."""
    validate(cfg, EvaluateConfig)
