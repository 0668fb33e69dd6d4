"""A training run assembled from its config: every part the Trainer receives (training/parts.py) is built
here, in the order that reports problems soonest (missing pretrained weights before any data is read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from captioning.evaluation.split import EvalSettings, load_instances
from captioning.factory import registry
from captioning.factory.datasets import all_records, build_datasets
from captioning.factory.models import build_captioner, build_encoder, model_config
from captioning.features.cache import open_features
from captioning.features.extract import extract_features
from captioning.models.captioner import compile_decoding, select_attention_map
from captioning.runtime import resolve_device
from captioning.training import distributed, precision
from captioning.training.objectives import CrossEntropy
from captioning.training.parts import LoaderSettings, RunParts
from captioning.training.trainer import Trainer


def attention_name(cfg: DictConfig) -> str:
    """The attention config group's choice (e.g. 'soft'), for metrics.json and sweep tables."""
    if HydraConfig.initialized():
        return HydraConfig.get().runtime.choices.get("attention", "")
    return str(cfg.attention._target_)  # its registered name


def build_objective(cfg: DictConfig) -> Any:
    """conf/objective/ through the registry (none: cross-entropy); a bad one fails at once."""
    spec = cfg.get("objective")
    return registry.build("objective", OmegaConf.to_container(spec, resolve=True)) if spec else CrossEntropy()


def stored_config(cfg: DictConfig, model: dict[str, Any] | None = None) -> dict[str, Any]:
    """The resolved config stored in every checkpoint, with the `model` section that rebuilds the network
    (`model`: that section, where the caller already has it)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    return {**resolved, "model": model_config(cfg) if model is None else model}


def build_run(cfg: DictConfig) -> RunParts:
    """Build the parts of a training run: device, data, model, objective, optimizer and schedule."""
    objective = build_objective(cfg)
    device = distributed.local_device(resolve_device(cfg.device))  # under torchrun: cuda:LOCAL_RANK
    ev = EvalSettings.of(cfg.eval)
    spec = model_config(cfg)  # the model section: built from here and stored in every checkpoint
    with distributed.main_process_first():  # rank 0 downloads weights / generates data; the others reuse them
        # first: missing pretrained weights are reported before data is read
        encoder = build_encoder(cfg.encoder)
        if cfg.dataset.get("extract") and cfg.dataset.get("features"):  # the cache made first, once
            extract_features(all_records(cfg.dataset), encoder, spec["encoder"], cfg.dataset.features,
                             num_workers=int(cfg.dataset.num_workers), progress=bool(cfg.trainer.progress))
        # With dataset.features the data sets yield cached annotation grids and the encoder is skipped.
        features = open_features(cfg.dataset.get("features"), encoder, spec["encoder"],
                                 cfg.dataset.get("boxes"))
        vocab, data = build_datasets(cfg.dataset, encoder.transform(), ["train", "val", ev.split],
                                     features=features)
    objective.prepare(data["train"])  # objective=scst: the reward's references, tokenized once
    model = build_captioner(spec, len(vocab), encoder).to(device)
    compile_decoding(model, ev.compile)  # validation and test decoding
    select_attention_map(model, ev.attention_layer, ev.attention_head)  # which map figures show (transformer)
    if distributed.world_size() > 1 and device.type == "cuda":  # BatchNorm statistics of the global batch
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    # eval.instances: read (and matched to the test split) before training, by rank 0, which scores the
    # test split
    instances = load_instances(ev.instances, data[ev.split]) if distributed.is_main() else None
    optimizer = instantiate(cfg.optim)([p for p in model.parameters() if p.requires_grad])
    sched = cfg.get("scheduler")
    scheduler = instantiate(sched)(optimizer) if sched and sched.get("_target_") else None
    return RunParts(model=model, vocab=vocab, data=data, objective=objective, optimizer=optimizer,
                    scheduler=scheduler, device=device,
                    amp_dtype=precision.autocast_dtype(cfg.trainer.get("precision", "fp32"), device),
                    trainer=cfg.trainer, eval=ev, loader=LoaderSettings.of(cfg.dataset), seed=int(cfg.seed),
                    config=stored_config(cfg, spec), instances=instances, uses_features=features is not None,
                    run_info={"attention": attention_name(cfg), "dataset": cfg.dataset.name},
                    upgrade_model=registry.with_added_defaults)


def build_trainer(cfg: DictConfig, out_dir: Path) -> Trainer:
    """A Trainer for this config, writing into out_dir."""
    return Trainer(build_run(cfg), out_dir)
