"""The training loop: `Trainer` advances a run's state (run_state.py: what a checkpoint holds, so a run
resumes exactly) one optimizer step at a time, validated by real decoding every epoch (validation.py) and
evaluated on the test split at the end."""

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

from captioning.checkpoint import read_checkpoint
from captioning.data.dataset import Batch, CaptionDataset, item_lengths, training_view
from captioning.evaluation.split import evaluate_split
from captioning.models.captioner import selects_regions
from captioning.reporting.items import Prediction
from captioning.training import distributed, precision, randomness, schedule, validation
from captioning.training.losses import GlobalMeanBaseline, LossTerms
from captioning.training.objectives import LossContext
from captioning.training.parts import RunParts
from captioning.training.run_state import RunState
from captioning.training.stop import StopRequest, TrainingInterrupted
from captioning.training.tensorboard import NullWriter

logger = logging.getLogger(__name__)


class Trainer(RunState):
    """Trains a run's model: epochs of optimizer steps, validation, checkpoints, early stopping, the test."""

    def __init__(self, parts: RunParts, out_dir: Path):
        super().__init__(parts, out_dir)
        self.stop = StopRequest()  # train() installs its signal handlers around fit(); inactive otherwise
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

    # -- loops --------------------------------------------------------------------------------
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

    def train_epoch(self, writer: SummaryWriter | NullWriter,
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
        out_of_time = False
        for batch in bar:
            done += 1
            skipped += batch.skipped
            # all ranks skip together, or DDP's gradient sync would hang
            if distributed.any_rank(not batch.indices):
                continue
            vals = self.train_step(batch, done, writer)
            if vals is not None:  # a finite step
                for k, v in vals.items():
                    sums[k] = sums.get(k, 0.0) + v
                n += 1
                bar.set_postfix(loss=f"{vals['loss']:.3f}", ppl=f"{math.exp(vals['token_nll']):.2f}")
                if self.step % self.tc.log_every == 0:  # the same steps on every rank
                    for k, v in distributed.pooled_means(vals, 1).items():
                        writer.add_scalar(f"train/{k}", v, self.step)
            self.stop_or_checkpoint(done, num_batches, sums, n, skipped)
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

    def train_step(self, batch: Batch, done: int,
                   writer: SummaryWriter | NullWriter) -> dict[str, float] | None:
        """One optimizer step on batch number `done` of the epoch: what it logs, or None for a step skipped as
        non-finite (BadSteps counts it, and stops the run at trainer.max_bad_steps in a row)."""
        baseline = self.baseline.state_dict()
        terms = self.loss(batch.to(self.device))
        bad = self.optimizer_step(terms.total)
        if isinstance(self.baseline, GlobalMeanBaseline) and selects_regions(self.model):
            # the same decision on every rank: the attention type, not this step's coin
            self.baseline.sync()
        self.step += 1
        if not math.isfinite(self.baseline.value or 0.0):  # a non-finite reward never enters the average
            self.baseline.load_state_dict(baseline)
        if self.bad.record(bad, self.epoch, done, self.step, writer):  # TrainingDiverged at the limit
            return None
        return self.step_values(terms)

    def stop_or_checkpoint(self, done: int, num_batches: int, sums: dict[str, float], n: int,
                           skipped: list[str]) -> None:
        """Mid-epoch, after batch `done`: last.pt with the epoch's position every trainer.checkpoint_every
        steps, and on a stop request (Ctrl-C, SIGTERM), then TrainingInterrupted."""
        every = self.tc.get("checkpoint_every")
        stop = distributed.any_rank(self.stop.requested is not None)  # every rank stops at the same step
        # done < num_batches: else the epoch's end writes it
        if stop or (every and self.step % every == 0 and done < num_batches):
            self.position = {"batch": done, "sums": dict(sums), "count": n, "skipped": list(skipped),
                             "bad_steps": self.bad.in_epoch}
            self.save_last(self.training_state(), f"batch {done} of epoch {self.epoch + 1}")
            if stop:
                raise TrainingInterrupted(self.stop.requested or "signal", self.epoch, self.step,
                                          self.ckpt_dir / "last.pt")

    def step_values(self, terms: LossTerms) -> dict[str, float]:
        """What a finite step logs: its loss terms, the REINFORCE baseline, the objective's statistics."""
        vals: dict[str, float] = {"loss": terms.total.item(), "nll": terms.nll.item()}
        vals.update(token_nll=terms.token_nll.item(), attention_reg=terms.attention_reg.item())
        if terms.policy is not None and terms.entropy is not None:
            vals.update(policy=terms.policy.item(), entropy=terms.entropy.item())
            if self.baseline.value is not None:  # set by the loss's first update
                vals["baseline"] = self.baseline.value
        # objective=scst: reward, its baseline, advantage, CIDEr-D, lengths; decoder=m2: the memory's share
        return vals | self.step_stats | self.model.decoder.stats()

    # -- validation and test ------------------------------------------------------------------
    def decode(self, dataset: CaptionDataset, beam_size: int, max_len: int, length_penalty: float,
               batch_size: int) -> list[Prediction] | None:
        """decode_split of a whole split, on every rank its shard under torchrun (rank 0 gets all predictions,
        the others None), without moving training's random streams (e.g. test_mode=sample)."""
        progress = self.tc.progress and self.is_main
        return validation.decode_with_forked_rng(self.model, dataset, beam_size, max_len, length_penalty,
                                                 batch_size, progress, self.device, self.ev.suppress_unk)

    def validate(self) -> dict[str, Any]:
        """Decode the validation split (real decoding) and score it; every rank gets rank 0's scores, so early
        stopping and the LR schedule take the same decisions everywhere."""
        preds = self.decode(self.data["val"], self.tc.val_beam_size, self.ev.max_len, 0.0, self.ev.batch_size)
        return validation.validation_scores(preds, self.data["val"], self.ev.collapse_share)

    def fit(self, writer: SummaryWriter | NullWriter) -> None:
        """Epochs with validation, LR schedule, best/last checkpoints and early stopping."""
        budget = self.tc.max_minutes
        deadline = time.monotonic() + budget * 60 - self.train_seconds if budget else None
        while self.epoch < self.tc.max_epochs and self.bad_epochs < self.tc.patience:
            self.epoch_started = time.monotonic()
            losses, out_of_time = self.train_epoch(writer, deadline)
            val = self.validate()
            self.epoch += 1
            self.train_seconds += time.monotonic() - self.epoch_started
            score, improved = self.end_epoch(losses, val, writer)
            correctness = val.get("attention_correctness")  # where the data set has object boxes
            logger.info("epoch %d: loss %.3f | val %s %.4f BLEU-4 %.4f%s%s", self.epoch, losses["loss"],
                        self.tc.monitor, score, val.get("Bleu_4", float("nan")),
                        "" if correctness is None else f" attention correctness {correctness:.3f}",
                        " (best)" if improved else "")
            if out_of_time:
                logger.info("time budget of %s minutes reached", budget)
                break
            # the epoch's last.pt is the place to stop
            if distributed.any_rank(self.stop.requested is not None):
                raise TrainingInterrupted(self.stop.requested or "signal", self.epoch, self.step,
                                          self.ckpt_dir / "last.pt")

    def end_epoch(self, losses: dict[str, float], val: dict[str, Any],
                  writer: SummaryWriter | NullWriter) -> tuple[float, bool]:
        """After an epoch and its validation: history, LR schedule, early stopping, best.pt and last.pt;
        returns the monitored score and whether it improved."""
        if self.tc.monitor not in val:
            dataset = self.parts.run_info["dataset"]
            raise ValueError(f"trainer.monitor={self.tc.monitor} is not available on {dataset} "
                             "(attention correctness needs object boxes); monitor CIDEr or BLEU "
                             "instead")
        score = float(val[self.tc.monitor])
        self.history.append({"epoch": self.epoch, "step": self.step, **losses,
                             **{f"val_{k}": v for k, v in val.items()
                                if isinstance(v, (int, float)) or k == "collapsed_caption"}})
        for k, v in self.history[-1].items():
            if not isinstance(v, str):  # the collapsed caption is text: in history.json only
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
        return score, improved

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
