"""Train a captioner: `captioning-train [overrides]` (Hydra). With no arguments: soft attention on `shapes`."""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from captioning import distributed, precision
from captioning.checkpoint import read_checkpoint, save_checkpoint
from captioning.data.build import build_vocab, load_records
from captioning.data.features import open_features
from captioning.data.karpathy import Batch, CaptionDataset, collate
from captioning.data.vocab import Vocabulary
from captioning.evaluate import (Prediction, decode_split, instance_correctness, load_instances, resolve_device,
                                 score_predictions, selects_regions, write_outputs)
from captioning.html_report import CURVES_NAME, plot_history
from captioning.losses import LossTerms, MovingAverageBaseline, hard_attention_loss
from captioning.models.captioner import Captioner, build_captioner, build_encoder
from captioning.schema import CONF_DIR as SCHEMA_CONF_DIR
from captioning.schema import MONITORS, validate_train_config

logger = logging.getLogger(__name__)
# The config groups live in the top-level conf/ folder of the source tree (installed with `pip install -e`).
CONF_DIR = str(SCHEMA_CONF_DIR)


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch so runs repeat."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def model_config(cfg: DictConfig) -> dict[str, Any]:
    """The part of the config that defines the network (what a checkpoint needs to rebuild it)."""
    return {k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("encoder", "attention", "decoder")}


def attention_name(cfg: DictConfig) -> str:
    """The attention config group's choice (e.g. 'soft'), for metrics.json and sweep tables."""
    if HydraConfig.initialized():
        return HydraConfig.get().runtime.choices.get("attention", "")
    return str(cfg.attention._target_).rsplit(".", 1)[-1]



class Trainer:
    """Holds the training state so that it can be checkpointed and resumed as one piece."""

    def __init__(self, cfg: DictConfig, out_dir: Path):
        self.cfg, self.out_dir, self.tc = cfg, out_dir, cfg.trainer
        if self.tc.monitor not in MONITORS:
            raise ValueError(f"trainer.monitor={self.tc.monitor!r} is not computed during validation; "
                             f"choose one of {', '.join(MONITORS)}")
        self.device = distributed.local_device(resolve_device(cfg.device))  # under torchrun: cuda:LOCAL_RANK
        self.is_main = distributed.is_main()  # rank 0 (or the only process) writes every file
        self.amp_dtype = precision.autocast_dtype(self.tc.get("precision", "fp32"), self.device)
        with distributed.main_process_first():  # rank 0 downloads weights / generates data; the others reuse them
            encoder = build_encoder(cfg.encoder)  # first: missing pretrained weights are reported before data is read
            records = load_records(cfg.dataset, ["train", "val", cfg.eval.split])
        self.vocab = build_vocab(records["train"], cfg.dataset.min_word_freq, cfg.dataset.get("max_vocab"))
        self.model: Captioner = build_captioner(model_config(cfg), len(self.vocab), encoder).to(self.device)
        if distributed.world_size() > 1 and self.device.type == "cuda":  # BatchNorm statistics of the global batch
            self.model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
        transform, max_len = self.model.encoder.transform(), int(cfg.dataset.max_caption_len)
        per_image = {"train": cfg.dataset.get("captions_per_image")}  # evaluation splits need no captions drawn
        # With dataset.features the data sets yield cached annotation grids and the encoder is skipped.
        features = open_features(cfg.dataset.get("features"), self.model.encoder, model_config(cfg)["encoder"])
        self.data = {s: CaptionDataset(r, self.vocab, transform, max_len, per_image.get(s), features)
                     for s, r in records.items()}
        # eval.instances: read (and matched to the test split) before training, by rank 0, which scores the test split
        self.instances = load_instances(cfg.eval.get("instances"), self.data[cfg.eval.split]) if self.is_main else None
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = instantiate(cfg.optim)(params)
        sched = cfg.get("scheduler")
        self.scheduler = instantiate(sched)(self.optimizer) if sched and sched.get("_target_") else None
        self.epoch, self.step, self.best, self.bad_epochs, self.history = 0, 0, float("-inf"), 0, []
        self.train_seconds = 0.0
        decay = self.tc.reinforce.baseline_decay  # under torchrun: one baseline of the global batch on every rank
        synced = distributed.initialized()
        self.baseline = distributed.GlobalMeanBaseline(decay) if synced else MovingAverageBaseline(decay)
        self.ckpt_dir = out_dir / "checkpoints"
        self.scaler = precision.grad_scaler(self.amp_dtype, self.device)  # fp16 only; bf16 needs no loss scaling
        # The loss runs through `forward_model`: under torchrun the DDP wrapper, which averages gradients over the
        # ranks during backward. Decoding and checkpoints use `self.model`, the plain module it wraps.
        self.forward_model: torch.nn.Module = self.model
        if distributed.initialized():
            self.forward_model = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                # hard attention switches graphs per batch; a feature cache leaves the encoder out of the forward
                find_unused_parameters=selects_regions(self.model) or features is not None)
        logger.info("model: %.2fM trainable parameters on %s", sum(p.numel() for p in params) / 1e6, self.device)

    # -- checkpoints -------------------------------------------------------------------------
    def config_dict(self) -> dict[str, Any]:
        """Resolved config stored in every checkpoint."""
        return {**OmegaConf.to_container(self.cfg, resolve=True), "model": model_config(self.cfg)}

    def save(self, name: str) -> Path:
        """Write a checkpoint with everything needed to resume."""
        return save_checkpoint(
            self.ckpt_dir / name, self.model, self.vocab, self.config_dict(),
            optimizer=self.optimizer.state_dict(),
            scheduler=self.scheduler.state_dict() if self.scheduler else None,
            epoch=self.epoch, step=self.step, best=self.best, bad_epochs=self.bad_epochs,
            history=self.history, train_seconds=self.train_seconds, baseline=self.baseline.state_dict(),
            scaler=self.scaler.state_dict() if self.scaler else None,
        )

    def resume(self, path: Path) -> None:
        """Restore model, optimizer, scheduler and counters from a checkpoint of the same model."""
        ckpt = read_checkpoint(path, map_location=self.device)
        if ckpt["config"]["model"] != model_config(self.cfg) or Vocabulary(ckpt["vocab"]) != self.vocab:
            raise ValueError(f"cannot resume from {path}: it was trained with a different model config or "
                             "vocabulary; start a new run or use the same overrides")
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if self.scheduler and ckpt.get("scheduler"):
            self.scheduler.load_state_dict(ckpt["scheduler"])
        self.epoch, self.step, self.best = ckpt["epoch"], ckpt["step"], ckpt["best"]
        self.bad_epochs, self.history = ckpt["bad_epochs"], ckpt["history"]
        self.train_seconds = ckpt.get("train_seconds", 0.0)
        self.baseline.load_state_dict(ckpt["baseline"])
        if self.scaler is not None and ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        logger.info("resumed from %s at epoch %d (best %s %.4f)", path, self.epoch, self.tc.monitor, self.best)

    # -- loops -------------------------------------------------------------------------------
    def loss(self, batch: Batch) -> LossTerms:
        """Forward one minibatch and compute the loss (with REINFORCE terms when attention samples regions)."""
        rc = self.tc.reinforce
        self.model.decoder.attention.begin_batch()
        captions, image_index = batch.captions, batch.image_index
        if rc.num_samples > 1:  # N sampled attention paths per caption
            captions, image_index = captions.repeat(rc.num_samples, 1), image_index.repeat(rc.num_samples)
        with precision.autocast(self.device, self.amp_dtype):
            out = self.forward_model(batch.images, captions, image_index)
        f32 = precision.to_float32  # the loss runs in float32 whatever dtype the forward pass ran in
        return hard_attention_loss(f32(out.logits), captions[:, 1:], f32(out.alphas), f32(out.log_probs),
                                   f32(out.entropies), Vocabulary.pad_id, self.baseline, self.tc.attention_weight,
                                   rc.reward_weight, rc.entropy_weight)

    def optimizer_step(self, loss: torch.Tensor) -> None:
        """Backward (DDP averages gradients over the ranks here), clipping and one step; fp16 scales the loss."""
        precision.optimizer_step(loss, self.optimizer, self.scaler, self.model.parameters(), self.tc.grad_clip)

    def train_loader(self) -> DataLoader:
        """This epoch's shuffled training batches; under torchrun each rank reads its own 1/N of the epoch
        (DistributedSampler, reshuffled per epoch), so the global batch is N x dataset.batch_size images."""
        ds, dc = self.data["train"], self.cfg.dataset
        if not distributed.initialized():
            return DataLoader(ds, batch_size=dc.batch_size, shuffle=True, collate_fn=collate,
                              num_workers=dc.num_workers, drop_last=False)
        sampler = DistributedSampler(ds, shuffle=True, seed=self.cfg.seed, drop_last=False)
        sampler.set_epoch(self.epoch)
        return DataLoader(ds, batch_size=dc.batch_size, sampler=sampler, collate_fn=collate,
                          num_workers=dc.num_workers, drop_last=False)

    def train_epoch(self, writer: SummaryWriter, deadline: float | None) -> tuple[dict[str, float], bool]:
        """One pass over the training split; returns mean losses and whether the time budget ran out."""
        self.model.train()
        loader = self.train_loader()
        sums, n, out_of_time = {"loss": 0.0, "nll": 0.0, "token_nll": 0.0, "attention_reg": 0.0}, 0, False
        bar = tqdm(loader, desc=f"epoch {self.epoch + 1}/{self.tc.max_epochs}",
                   disable=not (self.tc.progress and self.is_main))
        skipped: list[str] = []
        for batch in bar:
            skipped += batch.skipped
            if distributed.any_rank(not batch.indices):  # all ranks skip together, or DDP's gradient sync would hang
                continue
            terms = self.loss(batch.to(self.device))
            self.optimizer_step(terms.total)
            if isinstance(self.baseline, distributed.GlobalMeanBaseline) and selects_regions(self.model):
                self.baseline.sync()  # the same decision on every rank: the attention type, not this step's coin
            self.step += 1
            vals = {"loss": terms.total.item(), "nll": terms.nll.item(), "token_nll": terms.token_nll.item(),
                    "attention_reg": terms.attention_reg.item()}
            if terms.policy is not None:
                vals.update(policy=terms.policy.item(), entropy=terms.entropy.item(), baseline=self.baseline.value)
            for k, v in vals.items():
                sums[k] = sums.get(k, 0.0) + v
            n += 1
            bar.set_postfix(loss=f"{vals['loss']:.3f}", ppl=f"{np.exp(vals['token_nll']):.2f}")
            if self.step % self.tc.log_every == 0:  # the same steps on every rank
                for k, v in distributed.pooled_means(vals, 1).items():
                    writer.add_scalar(f"train/{k}", v, self.step)
            if deadline is not None and distributed.any_rank(time.monotonic() > deadline):
                out_of_time = True
                break
        if skipped:
            logger.warning("epoch %d: skipped %d unreadable training images: %s", self.epoch + 1, len(skipped),
                           "; ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else ""))
        num_skipped = sum(distributed.all_gather_objects(len(skipped)))
        return distributed.pooled_means(sums, n) | {"skipped_images": num_skipped}, out_of_time

    def decode(self, dataset: CaptionDataset, beam_size: int, max_len: int, length_penalty: float,
               batch_size: int) -> list[Prediction]:
        """decode_split of a whole split. Under torchrun each rank decodes its 1/N shard and rank 0 receives all
        predictions in data set order, exactly those of a single-process decode; the other ranks get []."""
        progress = self.tc.progress and self.is_main
        if not distributed.initialized():
            return decode_split(self.model, dataset, beam_size, max_len, length_penalty, batch_size, progress)
        preds = decode_split(self.model, distributed.shard(dataset), beam_size, max_len, length_penalty, batch_size,
                             progress)
        rank, world = distributed.rank(), distributed.world_size()
        for p in preds:  # image j of the shard is image rank + N j of the split; maps travel on the CPU
            p.index, p.alphas = rank + world * p.index, p.alphas.cpu()
        parts = distributed.gather_objects(preds)
        return sorted((p for part in parts for p in part), key=lambda p: p.index) if parts is not None else []

    def validate(self) -> dict[str, Any]:
        """Decode the validation split (real decoding) and score it; every rank gets rank 0's scores, so early
        stopping and the LR schedule take the same decisions everywhere."""
        preds = self.decode(self.data["val"], self.tc.val_beam_size, self.cfg.eval.max_len, 0.0,
                            self.cfg.eval.batch_size)
        val = score_predictions(preds, self.data["val"], ("bleu", "cider")) if self.is_main else None
        return distributed.broadcast_object(val)

    def fit(self, writer: SummaryWriter) -> None:
        """Epochs with validation, LR schedule, best/last checkpoints and early stopping."""
        budget = self.tc.max_minutes
        deadline = time.monotonic() + budget * 60 - self.train_seconds if budget else None
        while self.epoch < self.tc.max_epochs and self.bad_epochs < self.tc.patience:
            start = time.monotonic()
            losses, out_of_time = self.train_epoch(writer, deadline)
            val = self.validate()
            self.epoch += 1
            self.train_seconds += time.monotonic() - start
            if self.tc.monitor not in val:
                raise ValueError(f"trainer.monitor={self.tc.monitor} is not available on {self.cfg.dataset.name} "
                                 "(attention correctness needs object boxes); monitor CIDEr or BLEU instead")
            score = float(val[self.tc.monitor])
            self.history.append({"epoch": self.epoch, "step": self.step, **losses,
                                 **{f"val_{k}": v for k, v in val.items() if isinstance(v, (int, float))}})
            for k, v in self.history[-1].items():
                writer.add_scalar(f"epoch/{k}", v, self.epoch)
            if self.scheduler is not None:
                is_plateau = isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
                self.scheduler.step(score) if is_plateau else self.scheduler.step()
            improved = score > self.best
            self.best, self.bad_epochs = (score, 0) if improved else (self.best, self.bad_epochs + 1)
            if self.is_main:  # one copy of every file: rank 0's
                if improved:
                    self.save("best.pt")
                self.save("last.pt")
                (self.out_dir / "history.json").write_text(json.dumps(self.history, indent=1) + "\n")
            logger.info("epoch %d: loss %.3f | val %s %.4f BLEU-4 %.4f attention correctness %.3f%s", self.epoch,
                        losses["loss"], self.tc.monitor, score, val.get("Bleu_4", float("nan")),
                        val.get("attention_correctness", float("nan")), " (best)" if improved else "")
            if out_of_time:
                logger.info("time budget of %s minutes reached", budget)
                break

    def test(self) -> dict[str, Any]:
        """Evaluate the best checkpoint on the test split with the eval settings; rank 0 writes metrics.json and
        the figures; every rank returns the metrics."""
        distributed.barrier()  # rank 0 has written best.pt
        best = read_checkpoint(self.ckpt_dir / "best.pt", map_location=self.device)
        self.model.load_state_dict(best["model"])
        ev, ds = self.cfg.eval, self.data[self.cfg.eval.split]
        preds = self.decode(ds, ev.beam_size, ev.max_len, ev.length_penalty, ev.batch_size)
        if not self.is_main:
            return distributed.broadcast_object(None)
        metrics = {"attention": attention_name(self.cfg), "dataset": self.cfg.dataset.name, "split": ev.split,
                   "beam_size": ev.beam_size, **score_predictions(preds, ds, tuple(ev.metrics)),
                   "best_epoch": best["epoch"], f"val_{self.tc.monitor}": self.best, "epochs": self.epoch,
                   "train_seconds": round(self.train_seconds, 1)}
        if self.instances is not None:  # eval.instances: attention correctness on COCO instance masks
            metrics.update(instance_correctness(preds, self.instances, self.model))
        plot_history(self.out_dir / "history.json", self.out_dir / CURVES_NAME)  # embedded in report.html
        write_outputs(self.out_dir, preds, ds, metrics, ev.num_figures, selects_regions(self.model),
                      self.model.encoder.view, report=ev.get("report", True))
        return distributed.broadcast_object(metrics)


def train(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """Train, then evaluate the best checkpoint on the test split; returns the test metrics."""
    validate_train_config(cfg)  # a typo or bad value fails here, naming the key, before any work
    distributed.init_from_env()  # under torchrun: join the process group (a no-op in a plain process)
    set_seed(cfg.seed)  # the same initial weights on every rank (a random encoder then matches its feature cache)
    if distributed.is_main():  # only rank 0 creates files
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))  # what this run used, resolved
    else:
        logging.getLogger().setLevel(logging.WARNING)  # rank 0 reports progress, the others only warnings
    trainer = Trainer(cfg, out_dir)
    if distributed.rank() > 0:  # ranks draw their own dropout masks and samples (rank 0 keeps the plain run's stream)
        set_seed(cfg.seed + distributed.rank())
    if cfg.resume:
        path = trainer.ckpt_dir / "last.pt" if cfg.resume == "auto" else Path(cfg.resume)
        if distributed.broadcast_object(path.is_file()):  # rank 0 decides: all ranks resume from the file, or none
            trainer.resume(path)
        elif cfg.resume != "auto":
            raise FileNotFoundError(f"resume checkpoint not found: {path}")
    with SummaryWriter(str(out_dir / "tensorboard")) if distributed.is_main() else distributed.NullWriter() as writer:
        trainer.fit(writer)
    metrics = trainer.test()
    logger.info("test metrics: %s", json.dumps(metrics))
    return metrics


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def hydra_main(cfg: DictConfig) -> float:
    """The Hydra app; returns the best validation score so Hydra sweepers (Optuna) can optimise it."""
    metrics = train(cfg, Path(HydraConfig.get().runtime.output_dir))
    return float(metrics[f"val_{cfg.trainer.monitor}"])


def main() -> None:
    """Console entry point `captioning-train [overrides]`, also under `torchrun --nproc_per_node=N -m
    captioning.train [overrides]` (one process per GPU; global batch = N x dataset.batch_size)."""
    if distributed.init_from_env() is not None:
        sys.argv += distributed.torchrun_overrides(sys.argv[1:], Path(CONF_DIR) / "train.yaml")
    try:
        hydra_main()
    finally:
        distributed.cleanup()


if __name__ == "__main__":
    main()
