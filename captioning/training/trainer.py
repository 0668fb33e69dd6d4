"""The training loop: one `Trainer` holds everything a run's state is made of, so it is checkpointed and
resumed as one piece (exactly: see captioning/training/randomness.py), validated by real decoding every
epoch, and evaluated on the test split at the end."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from captioning.base.jsonio import write_json_atomic
from captioning.checkpoint import load_same_model, read_checkpoint, save_checkpoint
from captioning.data.dataset import Batch, CaptionDataset, item_lengths, training_view
from captioning.evaluation.split import evaluate_split, score_predictions
from captioning.models.captioner import Captioner, selects_regions
from captioning.reporting.curves import CURVES_NAME, plot_history
from captioning.reporting.items import Prediction
from captioning.training import distributed, precision, randomness, schedule
from captioning.training.losses import LossTerms, MovingAverageBaseline
from captioning.training.objectives import LossContext
from captioning.training.parts import RunParts
from captioning.training.stop import BadSteps, StopRequest, TrainingInterrupted

logger = logging.getLogger(__name__)
# what resume= and init_from= say of a checkpoint of another model: the action, what to do instead
SAME_MODEL = {"resume": ("resume from", "start a new run or use the same overrides"),
              "init_from": ("init_from", "give this run the checkpoint's encoder, attention, decoder and "
                            "dataset settings")}


class Trainer:
    """Holds the training state so that it can be checkpointed and resumed as one piece."""

    def __init__(self, parts: RunParts, out_dir: Path):
        self.parts, self.out_dir, self.tc, self.ev = parts, out_dir, parts.trainer, parts.eval
        self.model: Captioner = parts.model
        self.vocab, self.data, self.objective = parts.vocab, parts.data, parts.objective
        self.optimizer, self.scheduler, self.instances = parts.optimizer, parts.scheduler, parts.instances
        self.device, self.amp_dtype = parts.device, parts.amp_dtype
        self.is_main = distributed.is_main()  # rank 0 (or the only process) writes every file
        self.epoch, self.step, self.best, self.bad_epochs = 0, 0, float("-inf"), 0
        self.history: list[dict[str, Any]] = []
        self.train_seconds, self.epoch_started = 0.0, time.monotonic()
        # Mid-epoch: where the epoch in progress stands (batches done, running sums), so a checkpoint taken
        # there resumes at the next batch; None between epochs.
        self.position: dict[str, Any] | None = None
        self.bad = BadSteps(self.tc.max_bad_steps, parts.config["optim"].get("lr"), self.tc.grad_clip)
        self.stop = StopRequest()  # train() installs its signal handlers around fit(); inactive otherwise
        # under torchrun: one baseline of the global batch on every rank
        decay = self.objective.baseline_decay
        synced = distributed.initialized()
        self.baseline = distributed.GlobalMeanBaseline(decay) if synced else MovingAverageBaseline(decay)
        self.ckpt_dir = out_dir / "checkpoints"
        # fp16 only; bf16 needs no loss scaling
        self.scaler = precision.grad_scaler(self.amp_dtype, self.device)
        # what the objective logs besides the loss terms, for the last step
        self.step_stats: dict[str, float] = {}
        self.forward_model = self.wrap_forward()
        params = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        logger.info("model: %.2fM trainable parameters on %s", params / 1e6, self.device)

    def wrap_forward(self) -> torch.nn.Module:
        """The module the loss runs through: the objective's view of the model (the captioner itself, or for
        objective=scst a module whose forward samples captions), under torchrun wrapped in DDP, which averages
        gradients over the ranks during backward. Decoding and checkpoints use `self.model`, the plain
        captioner."""
        # hard attention switches graphs per batch; a feature cache leaves the encoder out of the forward
        return distributed.wrap(self.objective.wrap(self.model), self.device,
                                selects_regions(self.model) or self.parts.uses_features)

    # -- checkpoints -------------------------------------------------------------------------
    def config_dict(self) -> dict[str, Any]:
        """Resolved config stored in every checkpoint."""
        return self.parts.config

    def training_state(self) -> dict[str, Any]:
        """Everything but the weights that decides the rest of the run: optimizer, schedule, counters, early
        stopping, the epoch's position and every rank's RNG states (a collective: every rank calls it)."""
        seconds = self.train_seconds + (time.monotonic() - self.epoch_started if self.position else 0.0)
        return dict(optimizer=self.optimizer.state_dict(),
                    scheduler=self.scheduler.state_dict() if self.scheduler else None,
                    epoch=self.epoch, step=self.step, best=self.best, bad_epochs=self.bad_epochs,
                    history=self.history, train_seconds=seconds, baseline=self.baseline.state_dict(),
                    objective=self.objective.state_dict(), bad_in_row=self.bad.in_row,
                    scaler=self.scaler.state_dict() if self.scaler else None, position=self.position,
                    rng=distributed.all_gather_objects(randomness.rng_state(self.device)))

    def save(self, name: str, state: dict[str, Any]) -> Path:
        """Write a checkpoint: the weights and `state` (from training_state), everything needed to resume."""
        return save_checkpoint(self.ckpt_dir / name, self.model, self.vocab, self.config_dict(), **state)

    def write_history(self) -> None:
        """history.json: one entry per finished epoch (rank 0)."""
        if self.is_main:
            write_json_atomic(self.out_dir / "history.json", self.history, indent=1)

    def write_curves(self) -> None:
        """curves.png from history.json (rank 0; nothing before the first epoch has ended)."""
        if self.is_main and self.history:
            plot_history(self.out_dir / "history.json", self.out_dir / CURVES_NAME)

    def read_same_model(self, path: Path, key: str) -> dict[str, Any]:
        """Load the weights of a checkpoint of this run's model config and vocabulary (SAME_MODEL[key] says
        what to do instead); refuse any other."""
        return load_same_model(path, self.model, self.vocab, self.parts.config["model"], self.device,
                               *SAME_MODEL[key])

    def resume(self, path: Path) -> None:
        """Restore model, optimizer, scheduler, counters, the epoch's position and the RNG states from a
        checkpoint of the same model, so that the run goes on exactly as if it had never stopped."""
        ckpt = self.read_same_model(path, "resume")
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if self.scheduler and ckpt.get("scheduler"):
            self.scheduler.load_state_dict(ckpt["scheduler"])
        self.epoch, self.step, self.best = ckpt["epoch"], ckpt["step"], ckpt["best"]
        self.bad_epochs, self.history = ckpt["bad_epochs"], ckpt["history"]
        self.train_seconds = ckpt.get("train_seconds", 0.0)
        self.baseline.load_state_dict(ckpt["baseline"])
        self.objective.load_state_dict(ckpt.get("objective") or {})
        if self.scaler is not None and ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        self.position, self.bad.in_row = ckpt.get("position"), ckpt.get("bad_in_row", 0)
        schedule.follow_lr(self.optimizer, self.scheduler, ckpt["config"], self.parts.config)
        rng = ckpt.get("rng") or []
        # no set_seed after this: the run's streams go on where they were
        if len(rng) == distributed.world_size():
            randomness.set_rng_state(rng[distributed.rank()], self.device)
        else:
            logger.warning("%s holds the random state of %d process(es), this launch has %d: the resumed run "
                           "goes on from here but will not repeat an uninterrupted one exactly", path,
                           len(rng), distributed.world_size())
        self.write_history()  # the finished epochs, whatever an interrupted run left in history.json
        self.bad.saved = (f"batch {self.position['batch']} of epoch {self.epoch + 1}" if self.position
                          else f"the end of epoch {self.epoch}")
        best = f"best {self.tc.monitor} {self.best:.4f}" if math.isfinite(self.best) else "no epoch scored"
        logger.info("resumed from %s at %s (%s)", path, self.bad.saved, best)

    def init_weights(self, path: Path) -> None:
        """init_from=PATH: start from a checkpoint's weights only (same model config and vocabulary), with
        this run's fresh optimizer, schedule and counters (e.g. self-critical training after
        cross-entropy)."""
        ckpt = self.read_same_model(path, "init_from")
        logger.info("initialised the weights from %s (epoch %s of its run)", path, ckpt.get("epoch"))

    # -- loops -------------------------------------------------------------------------------
    def loss(self, batch: Batch) -> LossTerms:
        """Forward one minibatch and compute the objective's loss (objective=xe: teacher forcing, with
        REINFORCE terms when attention samples regions); what the objective logs besides goes to
        `step_stats`."""
        self.model.decoder.attention.begin_batch()
        ctx = LossContext(self.forward_model, self.model, self.device, self.amp_dtype, self.baseline,
                          selects_regions(self.model))
        terms, self.step_stats = self.objective.loss(ctx, batch)
        return terms

    def optimizer_step(self, loss: torch.Tensor) -> str | None:
        """Backward (DDP averages gradients over the ranks here), clipping and one step; fp16 scales the
        loss. A non-finite loss (on any rank) or gradient norm skips the step: returns which, else None."""
        bad_loss = distributed.any_rank(not torch.isfinite(loss.detach()).item())
        return precision.optimizer_step(loss, self.optimizer, self.scaler, self.model.parameters(),
                                        self.tc.grad_clip, loss_finite=not bad_loss, scheduler=self.scheduler)

    def train_loader(self, start: int = 0) -> tuple[DataLoader, int]:
        """This epoch's shuffled training batches from batch `start` on, and the epoch's number of batches.

        The order is a pure function of (seed, epoch) (randomness.epoch_batches), so a resumed run reads the
        same batches. Under torchrun each rank reads its own 1/N of the epoch (DistributedSampler, set_epoch),
        so the global batch is N x dataset.batch_size images (dataset.batch_unit=captions: captions, each
        distinct image of a batch encoded once). dataset.length_buckets: batches of similar caption
        lengths."""
        dc, seed = self.parts.loader, self.parts.seed
        ds, collate = training_view(self.data["train"], dc.batch_unit)
        sampler: DistributedSampler | None = None
        if distributed.initialized():
            sampler = DistributedSampler(ds, shuffle=True, seed=seed, drop_last=False)
            sampler.set_epoch(self.epoch)
        buckets = dc.length_buckets
        lengths = item_lengths(ds) if buckets else None
        batches = randomness.epoch_batches(len(ds), dc.batch_size, seed, self.epoch, distributed.rank(),
                                           sampler, lengths, buckets)
        worker_seed = randomness.derive_seed(seed, self.epoch, distributed.rank(), start)
        workers = torch.Generator().manual_seed(worker_seed)
        return DataLoader(randomness.SeededItems(ds), batch_sampler=batches[start:], collate_fn=collate,
                          num_workers=dc.num_workers, generator=workers), len(batches)

    def train_epoch(self, writer: SummaryWriter | distributed.NullWriter,
                    deadline: float | None) -> tuple[dict[str, float], bool]:
        """One pass over the training split (the rest of it after a mid-epoch resume); returns mean losses
        and whether the time budget ran out. trainer.checkpoint_every: last.pt every N steps, with the
        position."""
        self.model.train()
        pos = self.position or {"batch": 0, "count": 0, "skipped": [], "bad_steps": 0,
                                "sums": {"loss": 0.0, "nll": 0.0, "token_nll": 0.0, "attention_reg": 0.0}}
        done, sums, n, skipped = pos["batch"], dict(pos["sums"]), pos["count"], list(pos["skipped"])
        self.bad.in_epoch = pos.get("bad_steps", 0)  # 0 in a checkpoint older than the count
        loader, num_batches = self.train_loader(done)
        bar = tqdm(loader, desc=f"epoch {self.epoch + 1}/{self.tc.max_epochs}", initial=done,
                   total=num_batches, disable=not (self.tc.progress and self.is_main))
        every, out_of_time = self.tc.get("checkpoint_every"), False
        for batch in bar:
            done += 1
            skipped += batch.skipped
            # all ranks skip together, or DDP's gradient sync would hang
            if distributed.any_rank(not batch.indices):
                continue
            baseline = self.baseline.state_dict()
            terms = self.loss(batch.to(self.device))
            bad = self.optimizer_step(terms.total)
            if isinstance(self.baseline, distributed.GlobalMeanBaseline) and selects_regions(self.model):
                # the same decision on every rank: the attention type, not this step's coin
                self.baseline.sync()
            self.step += 1
            if not math.isfinite(self.baseline.value or 0.0):  # a non-finite reward never enters the average
                self.baseline.load_state_dict(baseline)
            if not self.bad.record(bad, self.epoch, done, self.step, writer):  # TrainingDiverged at the limit
                vals = self.step_values(terms)
                for k, v in vals.items():
                    sums[k] = sums.get(k, 0.0) + v
                n += 1
                bar.set_postfix(loss=f"{vals['loss']:.3f}", ppl=f"{math.exp(vals['token_nll']):.2f}")
                if self.step % self.tc.log_every == 0:  # the same steps on every rank
                    for k, v in distributed.pooled_means(vals, 1).items():
                        writer.add_scalar(f"train/{k}", v, self.step)
            stop = distributed.any_rank(self.stop.requested is not None)  # every rank stops at the same step
            # done < num_batches: else the epoch's end writes it
            if stop or (every and self.step % every == 0 and done < num_batches):
                self.position = {"batch": done, "sums": dict(sums), "count": n, "skipped": list(skipped),
                                 "bad_steps": self.bad.in_epoch}
                self.save_last(self.training_state(), f"batch {done} of epoch {self.epoch + 1}")
                if stop:
                    raise TrainingInterrupted(self.stop.requested or "signal", self.epoch, self.step,
                                              self.ckpt_dir / "last.pt")
            if deadline is not None and distributed.any_rank(time.monotonic() > deadline):
                out_of_time = True
                break
        if skipped:
            logger.warning("epoch %d: skipped %d unreadable training images: %s", self.epoch + 1,
                           len(skipped), "; ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else ""))
        num_skipped = sum(distributed.all_gather_objects(len(skipped)))
        self.position = None
        counts = {"skipped_images": num_skipped, "bad_steps": self.bad.end_epoch(self.epoch)}
        return distributed.pooled_means(sums, n) | counts, out_of_time

    def step_values(self, terms: LossTerms) -> dict[str, float]:
        """What a finite step logs: its loss terms, the REINFORCE baseline, the objective's statistics."""
        vals: dict[str, float] = {"loss": terms.total.item(), "nll": terms.nll.item()}
        vals.update(token_nll=terms.token_nll.item(), attention_reg=terms.attention_reg.item())
        if terms.policy is not None and terms.entropy is not None:
            vals.update(policy=terms.policy.item(), entropy=terms.entropy.item())
            if self.baseline.value is not None:  # set by the loss's first update
                vals["baseline"] = self.baseline.value
        return vals | self.step_stats  # objective=scst: reward, its baseline, advantage, CIDEr-D, lengths

    def weights_finite(self) -> bool:
        """Whether every weight and buffer of the model is finite, on every rank (a collective)."""
        return not distributed.any_rank(not precision.all_finite(self.model.state_dict().values()))

    def save_last(self, state: dict[str, Any], where: str, finite: bool | None = None) -> None:
        """last.pt from `state` (rank 0) if the weights are `finite` (None: check them), else a warning."""
        if self.weights_finite() if finite is None else finite:
            self.bad.saved = where
            if self.is_main:
                self.save("last.pt", state)
        elif self.is_main:
            logger.warning("%s: the model's weights are not all finite; checkpoints/last.pt keeps %s", where,
                           self.bad.saved or "nothing (none was written)")

    def decode(self, dataset: CaptionDataset, beam_size: int, max_len: int, length_penalty: float,
               batch_size: int) -> list[Prediction] | None:
        """decode_split of a whole split, on every rank its shard under torchrun (rank 0 gets all predictions,
        the others None), without moving training's random streams (e.g. test_mode=sample)."""
        progress = self.tc.progress and self.is_main
        with randomness.forked(self.device):
            return distributed.decode_split(self.model, dataset, beam_size, max_len, length_penalty,
                                            batch_size, progress)

    def validate(self) -> dict[str, Any]:
        """Decode the validation split (real decoding) and score it; every rank gets rank 0's scores, so early
        stopping and the LR schedule take the same decisions everywhere."""
        preds = self.decode(self.data["val"], self.tc.val_beam_size, self.ev.max_len, 0.0, self.ev.batch_size)
        val = score_predictions(preds, self.data["val"], ("bleu", "cider")) if preds is not None else None
        return distributed.broadcast_object(val)  # type: ignore[arg-type]  # rank 0's scores on every rank

    def fit(self, writer: SummaryWriter | distributed.NullWriter) -> None:
        """Epochs with validation, LR schedule, best/last checkpoints and early stopping."""
        budget = self.tc.max_minutes
        deadline = time.monotonic() + budget * 60 - self.train_seconds if budget else None
        while self.epoch < self.tc.max_epochs and self.bad_epochs < self.tc.patience:
            self.epoch_started = time.monotonic()
            losses, out_of_time = self.train_epoch(writer, deadline)
            val = self.validate()
            self.epoch += 1
            self.train_seconds += time.monotonic() - self.epoch_started
            if self.tc.monitor not in val:
                dataset = self.parts.run_info["dataset"]
                raise ValueError(f"trainer.monitor={self.tc.monitor} is not available on {dataset} "
                                 "(attention correctness needs object boxes); monitor CIDEr or BLEU "
                                 "instead")
            score = float(val[self.tc.monitor])
            self.history.append({"epoch": self.epoch, "step": self.step, **losses,
                                 **{f"val_{k}": v for k, v in val.items() if isinstance(v, (int, float))}})
            for k, v in self.history[-1].items():
                writer.add_scalar(f"epoch/{k}", v, self.epoch)
            if self.scheduler is not None:
                schedule.step_schedule(self.scheduler, score)  # a NaN score: no improvement
            finite = self.weights_finite()  # a checkpoint never holds non-finite weights
            improved = finite and math.isfinite(score) and score > self.best
            self.best, self.bad_epochs = (score, 0) if improved else (self.best, self.bad_epochs + 1)
            state = self.training_state()
            # one copy of every file: rank 0's; last.pt last, so a run stopped before it repeats all
            if self.is_main:
                if improved:
                    self.save("best.pt", state)
                self.write_history()
            self.save_last(state, f"the end of epoch {self.epoch}", finite)
            logger.info("epoch %d: loss %.3f | val %s %.4f BLEU-4 %.4f attention correctness %.3f%s",
                        self.epoch, losses["loss"], self.tc.monitor, score, val.get("Bleu_4", float("nan")),
                        val.get("attention_correctness", float("nan")), " (best)" if improved else "")
            if out_of_time:
                logger.info("time budget of %s minutes reached", budget)
                break
            # the epoch's last.pt is the place to stop
            if distributed.any_rank(self.stop.requested is not None):
                raise TrainingInterrupted(self.stop.requested or "signal", self.epoch, self.step,
                                          self.ckpt_dir / "last.pt")

    def test(self) -> dict[str, Any]:
        """Evaluate the best checkpoint on the test split with the eval settings (evaluate_split); rank 0
        writes metrics.json and the figures; every rank returns the metrics."""
        distributed.barrier()  # rank 0 has written best.pt
        if not (self.ckpt_dir / "best.pt").is_file():  # no epoch was scorable with finite weights
            raise ValueError(f"no epoch ended with finite weights and a finite {self.tc.monitor}: no best.pt")
        best = read_checkpoint(self.ckpt_dir / "best.pt", map_location=self.device)
        self.model.load_state_dict(best["model"])
        self.write_curves()  # embedded in report.html
        after = {"best_epoch": best["epoch"], f"val_{self.tc.monitor}": self.best, "epochs": self.epoch,
                 "train_seconds": round(self.train_seconds, 1)}
        metrics = evaluate_split(self.model, self.data[self.ev.split], self.ev, self.out_dir, self.instances,
                                 before=self.parts.run_info, after=after,
                                 decode=lambda model, ds, ev: self.decode(ds, ev.beam_size, ev.max_len,
                                                                          ev.length_penalty, ev.batch_size))
        # rank 0's metrics on every rank
        return distributed.broadcast_object(metrics)  # type: ignore[arg-type]
