"""What a training run is made of, built once from the config (captioning/factory/run.py) and handed to the
Trainer: the Trainer never reads a config or builds a component itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from captioning.checkpoint.file import Upgrade
from captioning.data.dataset import CaptionDataset
from captioning.data.vocab import Vocabulary
from captioning.evaluation.split import EvalSettings
from captioning.metrics.coco_attention import CocoInstances
from captioning.models.captioner import Captioner


@dataclass(frozen=True)
class LoaderSettings:
    """How the training split is read: `dataset.batch_size`, `batch_unit`, `length_buckets`, `num_workers`
    (their defaults: conf/dataset/_base.yaml's)."""

    batch_size: int
    batch_unit: str  # images | captions
    length_buckets: int | None
    num_workers: int

    @classmethod
    def of(cls, dataset: Any) -> LoaderSettings:
        """From a `dataset` config section (length_buckets, which a data set file may leave out: none)."""
        return cls(int(dataset.batch_size), str(dataset.batch_unit), dataset.get("length_buckets"),
                   int(dataset.num_workers))


@dataclass
class RunParts:
    """The built parts of one training run."""

    model: Captioner  # on its device
    vocab: Vocabulary
    data: dict[str, CaptionDataset]  # train, val and the eval split
    objective: Any  # training/objectives.py: CrossEntropy or SelfCritical (prepared on the training split)
    optimizer: torch.optim.Optimizer
    scheduler: Any  # a torch LR scheduler, or None
    device: torch.device
    amp_dtype: torch.dtype | None  # autocast dtype (None: float32)
    trainer: Any  # the `trainer` settings (max_epochs, patience, monitor, grad_clip, ...)
    eval: EvalSettings  # validation's max_len and batch size, the test split's decoding and outputs
    loader: LoaderSettings
    seed: int
    config: dict[str, Any]  # the resolved config (with `model`) stored in every checkpoint
    run_info: dict[str, Any]  # what metrics.json says about the run (attention, dataset)
    instances: CocoInstances | None = None  # eval.instances on rank 0 (attention correctness on COCO masks)
    uses_features: bool = False  # a feature cache: the encoder is not in the forward pass
    # a checkpoint's stored model config as this code reads it, for resume and init_from (factory/registry.py)
    upgrade_model: Upgrade | None = None
