"""What a composed config may contain, checked before any work starts: one copy of each fact, and no defaults.

Hydra composes conf/ as usual (conf/experiment/ presets still say only what differs); the merged config is then
checked by captioning/config/check.py. All problems are reported at once, each naming its full key:

    ConfigError: invalid configuration (2 problems):
      optim.lr=-0.1: must be > 0
      attention: unknown type 'captioning.models.attention.Sofft'; choose one of SoftAttention, ...

Where each fact lives:

* defaults: only in the YAML files of conf/ (a key the YAML ships is always present after composition, so the
  TypedDicts below hold none, and cannot: a TypedDict has no defaults);
* `_target_` groups (encoder, attention, decoder, optim, scheduler, dataset.generate, dataset.reader, and any added
  later): nothing here but `Target`. Their keys are checked against the signature of the class they name, with the
  constraints the class declares there (captioning/config/targets.py, captioning/base/constraints.py), so the
  constructor and the validator share one copy of each range;
* the groups without a target (dataset, trainer, eval and the top-level keys of train.yaml and evaluate.yaml): the
  small typed schema below, with their cross-key rules (files that must exist, the monitored metric).

Keys that the shipped YAML files of dataset/, eval/ and train.yaml's trainer carry but no field here types yet
are accepted as they are (another part of the code base may add one to conf/ first); in a user's override the
same key is still a typo.
"""

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired, TypedDict

import yaml
from omegaconf import DictConfig

from captioning.base.constraints import Count, OneOf, Pattern, Problem, Range, Size, choose_one
from captioning.base.signature import file_parameters

# ConfigError is what validate_*_config raise, importable from here next to them.
from captioning.config.check import ConfigError, Target, extra_keys_for, rules_for, validate  # noqa: F401
from captioning.data.tokenizers import DEFAULT_TOKENIZER, CaptionTokenizer
from captioning.metrics.names import VALID_METRICS
from captioning.runtime import CONF_DIR, device_problem

# The metrics validation computes (what trainer.monitor may name) and the metrics scoring knows.
MONITORS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr", "attention_correctness")
METRICS = tuple(VALID_METRICS)

Positive = Size  # the shared aliases of captioning/base/constraints.py
NonNegative = Annotated[float, Range(ge=0)]
DEVICES = r"auto|cpu|mps|cuda(:\d+)?"
Device = Annotated[str, Pattern(DEVICES, "auto, cpu, mps, cuda or cuda:N")]


class DatasetConfig(TypedDict):
    """conf/dataset/: where the data is, how it is read (dataset.reader, conf/dataset/reader/) and batched."""

    name: str
    root: NotRequired[str]  # a generated data set's folder
    annotations: str | None  # a Karpathy split file (what the karpathy reader reads, or what `generate` writes)
    image_root: str | None
    generate: Target | None  # a registered data set generator (e.g. build_shapes), run before reading
    reader: Target  # a registered reader, called with the splits to read
    tokenizer: NotRequired[CaptionTokenizer]  # how captions become words (data/tokenizers.py); readers take it
    features: str | list[str] | None  # a feature cache folder (captioning-extract-features); encoder=multi: one each
    extract: NotRequired[bool]  # a training run extracts a missing or unfinished cache at `features` first
    boxes: NotRequired[str | None]  # encoder=regions: the folder of the regions' boxes (<image id>.npy)
    prepared: NotRequired[str | None]  # where prepared captions are kept (data/prepared/store.py); null: none
    min_word_freq: Positive
    max_vocab: Annotated[int | None, Range(ge=1)]
    max_caption_len: Positive
    batch_size: Positive
    batch_unit: Literal["images", "captions"]  # what batch_size counts in training
    captions_per_image: Annotated[int | None, Range(ge=1)]
    length_buckets: NotRequired[Annotated[int | None, Range(ge=1)]]  # sort runs of N batches by caption length
    num_workers: Count
    cache_images: NotRequired[bool]  # keep each transformed image in memory after its first read


class EvalConfig(TypedDict):
    """conf/eval/: test-time decoding and scoring."""

    split: Literal["train", "val", "test"]
    beam_size: Positive
    max_len: Positive
    length_penalty: NonNegative
    batch_size: Positive
    metrics: list[Annotated[str, OneOf(*METRICS, ignore_case=True)]]
    num_figures: Count
    report: bool  # write report.html and attention.npz
    compile: NotRequired[bool]  # torch.compile the decoding step
    instances: str | None  # COCO instances file: mask-based attention correctness and CHAIR on COCO
    attention_layer: NotRequired[int | None]  # decoder=transformer: the cross-attention layer figures read
    attention_head: NotRequired[Annotated[int | None, Range(ge=0)]]  # ... and one head of it (null: their mean)
    collapse_share: NotRequired[Annotated[float, Range(ge=0, le=1)]]  # one caption for more of the images: said
    suppress_unk: NotRequired[bool]  # decoding never emits <unk>


class TrainerConfig(TypedDict):
    """trainer: the training loop, early stopping and logging."""

    max_epochs: Positive
    max_minutes: Annotated[float | None, Range(gt=0)]
    grad_clip: Annotated[float | None, Range(ge=0)]
    max_bad_steps: Positive  # non-finite steps in a row (each skipped) before the run stops as diverged
    monitor: str  # one of MONITORS (the rule below says which are computed)
    patience: Positive
    val_beam_size: Positive
    log_every: Positive
    checkpoint_every: Annotated[int | None, Range(ge=1)]  # steps between mid-epoch last.pt writes
    progress: bool
    precision: Literal["fp32", "bf16", "fp16"]  # autocast dtype of the training forward pass


class TrainConfig(TypedDict):
    """conf/train.yaml after composition: what `captioning-train` runs."""

    seed: Count
    device: Device
    data_dir: str
    resume: str | None
    init_from: str | None  # a checkpoint whose weights a new run starts from (objective=scst after xe)
    overwrite: bool  # move a run folder's previous run aside and start anew
    trainer: TrainerConfig
    dataset: DatasetConfig
    encoder: Target
    attention: Target
    decoder: Target
    optim: Target
    scheduler: Target | None  # `scheduler=none`: a constant learning rate
    objective: Target  # conf/objective/: xe (cross-entropy) or scst (self-critical), with the loss terms' settings
    eval: EvalConfig


class EnsembleConfig(TypedDict):
    """ensemble: how the models of `checkpoint=[A,B,...]` decode together (captioning/models/ensemble.py)."""

    mean: Literal["prob", "logprob"]  # of the models' word probabilities, or of their log-probabilities
    maps_from: Annotated[int, Range(ge=0)]  # the model whose attention maps are kept (its place in the list)


class EvaluateConfig(TypedDict):
    """conf/evaluate.yaml after composition: what `captioning-evaluate` runs."""

    checkpoint: str | list[str]  # a list: a test-time ensemble
    device: Device
    data_dir: str
    ensemble: EnsembleConfig
    eval: EvalConfig
    dataset: NotRequired[DatasetConfig | None]  # another data set than the checkpoint's (dataset=NAME)


# -- cross-key rules ---------------------------------------------------------------------------------
@rules_for(DatasetConfig)
def _dataset_rules(v: Mapping[str, Any]) -> Iterator[Problem]:
    """The files a data set that is not generated reads, and its image (or feature) folder, must exist; its reader
    splits captions by dataset.tokenizer."""
    if v.get("batch_unit") == "captions" and v.get("captions_per_image") is not None:
        yield "captions_per_image", "must be null with batch_unit=captions (every caption is its own item)"
    split_by = v["reader"].get("tokenizer", DEFAULT_TOKENIZER) if isinstance(v.get("reader"), dict) else None
    chosen = v.get("tokenizer", DEFAULT_TOKENIZER)
    if split_by is not None and split_by != chosen:
        yield "reader.tokenizer", (f"={split_by!r} differs from dataset.tokenizer={chosen!r}: set dataset.tokenizer "
                                   "only (a reader's YAML takes it: tokenizer: ${..tokenizer})")
    if v.get("generate") is not None:  # its files are written by the generate step
        return
    from captioning.factory import registry  # the readers (and the models: torch), only for a data set's files

    reader: Mapping[str, Any] = v["reader"] if isinstance(v.get("reader"), dict) else {}
    fn = registry.READERS.get(str(reader.get("_target_")))  # an unknown reader is reported by the target check
    for name in file_parameters(fn) if fn else ():
        path = reader.get(name)
        # The reader's YAML takes a file from the dataset section (`${..annotations}`): name the key a user sets.
        key = name if name in v and v[name] == path else f"reader.{name}"
        if isinstance(path, str) and not Path(path).is_file():
            yield key, f"={path!r}: file not found; set dataset.{key}=PATH"
    features = v.get("features")
    if features and v.get("extract"):  # the images are read to make the cache; it need not exist yet
        if not isinstance(features, str):
            yield "extract", "=true takes one cache folder in dataset.features (extract encoder=multi's one by one)"
        features = None
    folders = {"image_root": v.get("image_root")} if not features else \
        {"features": features} if isinstance(features, str) else {f"features[{i}]": p for i, p in enumerate(features)}
    if isinstance(v.get("boxes"), str):
        folders["boxes"] = v["boxes"]
    for key, path in folders.items():  # with cached features the images themselves are not read
        if isinstance(path, str) and not Path(path).is_dir():
            yield key, f"={path!r}: folder not found; set dataset.{key}=PATH"


@rules_for(EvalConfig)
def _eval_rules(v: Mapping[str, Any]) -> Iterator[Problem]:
    path = v.get("instances")
    if isinstance(path, str) and not Path(path).is_file():
        yield "instances", f"={path!r}: file not found; set eval.instances=PATH or null"


@rules_for(TrainerConfig)
def _trainer_rules(v: Mapping[str, Any]) -> Iterator[Problem]:
    monitor = v.get("monitor")
    if isinstance(monitor, str) and monitor not in MONITORS:
        yield "monitor", f"={monitor!r} is not computed during validation; {choose_one(monitor, MONITORS)}"


def _device_rules(v: Mapping[str, Any]) -> Iterator[Problem]:
    """A device this machine does not have fails with the config, before a run folder is made (device=cuda
    copied from a GPU machine's command line onto a laptop)."""
    device = v.get("device")
    if isinstance(device, str) and re.fullmatch(DEVICES, device) and (problem := device_problem(device)):
        yield "device", f"={device}: {problem}"


@rules_for(TrainConfig)
def _train_rules(v: Mapping[str, Any]) -> Iterator[Problem]:
    yield from _device_rules(v)
    resume = v.get("resume")
    if isinstance(resume, str) and resume != "auto" and not Path(resume).is_file():
        yield "resume", f"={resume!r}: checkpoint not found; give a checkpoint file, auto or null"
    init_from = v.get("init_from")
    if isinstance(init_from, str) and not Path(init_from).is_file():
        yield "init_from", f"={init_from!r}: checkpoint not found; give the best.pt of a finished run, or null"


@rules_for(EvaluateConfig)
def _evaluate_rules(v: Mapping[str, Any]) -> Iterator[Problem]:
    yield from _device_rules(v)
    checkpoint = v.get("checkpoint")
    if isinstance(checkpoint, str) and checkpoint != "???" and not Path(checkpoint).is_file():
        yield "checkpoint", f"={checkpoint!r}: checkpoint not found; give checkpoint=PATH to a .pt file"
    if not isinstance(checkpoint, list):
        return
    if not checkpoint:
        yield "checkpoint", "=[]: an ensemble needs at least one checkpoint; give checkpoint=[A,B] or checkpoint=PATH"
    for i, path in enumerate(checkpoint):
        if isinstance(path, str) and not Path(path).is_file():
            yield f"checkpoint[{i}]", f"={path!r}: checkpoint not found; give each checkpoint's .pt file"
    maps_from = (v.get("ensemble") or {}).get("maps_from")
    if checkpoint and isinstance(maps_from, int) and maps_from >= len(checkpoint):
        yield "ensemble.maps_from", (f"={maps_from}: names no model of the {len(checkpoint)} checkpoints; give 0 to "
                                     f"{len(checkpoint) - 1}, the model whose attention maps are kept")


# -- keys of the shipped YAML files ----------------------------------------------------------------------
def shipped_keys(pattern: str, section: str | None = None) -> set[str]:
    """The keys of the YAML files matching CONF_DIR / pattern (under `section`), except `defaults`."""
    keys: set[str] = set()
    for file in sorted(CONF_DIR.glob(pattern)):
        data = yaml.safe_load(file.read_text()) or {}
        data = data.get(section) if section and isinstance(data, dict) else data
        keys |= {k for k in data if k != "defaults"} if isinstance(data, dict) else set()
    return keys


extra_keys_for(DatasetConfig)(lambda: shipped_keys("dataset/*.yaml"))
extra_keys_for(EvalConfig)(lambda: shipped_keys("eval/*.yaml"))
extra_keys_for(TrainerConfig)(lambda: shipped_keys("train.yaml", "trainer"))


def validate_train_config(cfg: DictConfig | Mapping[str, Any]) -> None:
    """Check a composed `captioning-train` config; raises ConfigError naming every bad key."""
    validate(cfg, TrainConfig)


def validate_evaluate_config(cfg: DictConfig | Mapping[str, Any]) -> None:
    """Check a composed `captioning-evaluate` config; raises ConfigError naming every bad key."""
    validate(cfg, EvaluateConfig)
