"""A diverging run stops cleanly: a step whose loss or gradient norm is not finite is skipped (no optimizer, scaler
or schedule update), logged and counted (history.json `bad_steps`, TensorBoard train/bad_steps); after
trainer.max_bad_steps of them in a row the run stops with one error line, leaving checkpoints/last.pt at its last
finite state, and resume=auto continues from there; a NaN validation score is never an improvement, and no checkpoint
holds non-finite weights.

Tiny runs of tests/training/test_resume.py (6 steps per epoch, steps counted from 1 over the whole run); a NaN is
injected after the real forward pass, so every random stream advances as in the run without it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from fixtures import compose_config
from test_resume import BIN, assert_identical, last_checkpoint, tiny

from captioning.train import train
from captioning.training import precision
from captioning.training.stop import TrainingDiverged, TrainingInterrupted
from captioning.training.trainer import Trainer

NAN = float("nan")


pytestmark = pytest.mark.usefixtures("quick_scoring", "one_thread")  # tests/training/conftest.py


def inject(mp: pytest.MonkeyPatch, nan_at: Callable[[int], bool] = lambda k: False, skip_at: frozenset = frozenset(),
           inf_grad_at: frozenset = frozenset(), stop_at: int | None = None) -> None:
    """Step k (from 1): a NaN loss where nan_at(k) (the real loss times NaN); an infinite gradient of one decoder
    weight, with a finite loss, at inf_grad_at; at skip_at no optimizer step at all (the gradients dropped, nothing
    checked: the reference of a skipped step); at stop_at a SIGTERM-like stop request during the step."""
    real_loss, real_step = Trainer.loss, Trainer.optimizer_step
    hooks: list[Any] = []

    def loss(self: Trainer, batch: Any) -> Any:
        terms, k = real_loss(self, batch), self.step + 1
        while hooks:
            hooks.pop().remove()
        if k == stop_at:
            self.stop.requested = "SIGTERM"
        if k in inf_grad_at:
            weight = self.model.decoder.L_o.weight
            hooks.append(weight.register_hook(lambda g: torch.full_like(g, math.inf)))
        return dataclasses.replace(terms, total=terms.total * NAN) if nan_at(k) else terms

    def step(self: Trainer, loss: torch.Tensor) -> str | None:
        if self.step + 1 in skip_at:
            self.optimizer.zero_grad(set_to_none=True)
            return None
        return real_step(self, loss)

    mp.setattr(Trainer, "loss", loss)
    mp.setattr(Trainer, "optimizer_step", step)


def weights(run: Path, name: str = "last.pt") -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / name, weights_only=True)["model"]


def equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def history(run: Path) -> list[dict[str, Any]]:
    return json.loads((run / "history.json").read_text())


def scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of a TensorBoard scalar the run wrote."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (run / "tensorboard").iterdir()
    acc = EventAccumulator(str(events))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


EPOCHS2 = "trainer.max_epochs=2"


@pytest.fixture(scope="module")
def reference(data_root, tmp_path_factory):
    """Two-epoch runs made on first use: "plain", and "skip3" (the optimizer step of step 3 not taken)."""
    runs: dict[str, Path] = {}
    setups = {"plain": {}, "skip3": {"skip_at": frozenset({3})}}

    def get(name: str) -> Path:
        if name not in runs:
            out = tmp_path_factory.mktemp(name)
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("PATH", BIN)
                mp.setattr("captioning.training.run_state.plot_history", lambda *a, **k: None)
                inject(mp, **setups[name])
                train(compose_config(*tiny(data_root, EPOCHS2)), out)
            runs[name] = out
        return runs[name]
    return get


def test_a_nan_loss_skips_that_step_only(data_root, reference, tmp_path, monkeypatch, caplog):
    skipped, plain = reference("skip3"), reference("plain")  # made before the NaN is injected here
    inject(monkeypatch, nan_at=lambda k: k == 3)
    train(compose_config(*tiny(data_root, EPOCHS2)), tmp_path)
    assert [h["bad_steps"] for h in history(tmp_path)] == [1, 0]
    assert all(math.isfinite(h["loss"]) for h in history(tmp_path))  # the NaN step is not in the epoch's mean
    # the run is the run whose step 3 was simply not taken (Adam's moments and step count untouched), not the plain
    assert equal(weights(tmp_path), weights(skipped))
    assert not equal(weights(tmp_path), weights(plain))
    (line,) = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert line.startswith("epoch 1, batch 3 (step 3): non-finite loss; the optimizer step was skipped")
    assert scalars(tmp_path, "train/bad_steps") == [(3, 1.0)]
    assert scalars(tmp_path, "epoch/bad_steps") == [(1, 1.0), (2, 0.0)]


def test_a_non_finite_gradient_with_a_finite_loss_is_skipped_the_same_way(data_root, reference, tmp_path,
                                                                            monkeypatch, caplog):
    skipped = reference("skip3")
    inject(monkeypatch, inf_grad_at=frozenset({3}))
    train(compose_config(*tiny(data_root, EPOCHS2)), tmp_path)
    assert [h["bad_steps"] for h in history(tmp_path)] == [1, 0]
    assert equal(weights(tmp_path), weights(skipped))
    assert any("step 3): non-finite gradient norm" in r.getMessage() for r in caplog.records)


def test_nan_from_a_step_on_stops_the_run_and_resume_continues(data_root, tmp_path, monkeypatch):
    """NaN from step 9 (epoch 2) on: steps 9-12 skipped, epoch 2 ends (last.pt written: its weights are finite),
    step 13 is the 5th in a row: the run stops there, last.pt left as the end of epoch 2 wrote it."""
    overrides = tiny(data_root, "trainer.max_epochs=3")
    saved: list[tuple[str, int, dict[str, torch.Tensor]]] = []
    real_save = Trainer.save

    def save(self: Trainer, name: str, state: dict[str, Any]) -> Path:
        saved.append((name, self.step, copy.deepcopy(self.model.state_dict())))
        return real_save(self, name, state)

    with monkeypatch.context() as mp:
        inject(mp, nan_at=lambda k: k >= 9)
        mp.setattr(Trainer, "save", save)
        with pytest.raises(TrainingDiverged) as err:
            train(compose_config(*overrides), tmp_path)
    assert str(err.value) == (
        "training diverged: 5 steps in a row had a non-finite loss or gradient norm (epoch 3, step 13); "
        "checkpoints/last.pt holds the last finite state (the end of epoch 2); lower optim.lr=0.002 or "
        "trainer.grad_clip=5.0")
    last = last_checkpoint(tmp_path)
    assert (last["epoch"], last["step"], last["position"], last["bad_in_row"]) == (2, 12, None, 4)
    name, step, state = [s for s in saved if s[0] == "last.pt"][-1]
    assert step == 12 and equal(last["model"], state)  # nothing written over it when the run stopped
    assert precision.all_finite(last["model"].values())
    assert [h["bad_steps"] for h in history(tmp_path)] == [0, 4] and not (tmp_path / "metrics.json").exists()

    train(compose_config(*overrides, "resume=auto"), tmp_path)  # without the NaN: it continues and finishes
    assert [h["bad_steps"] for h in history(tmp_path)] == [0, 4, 0]
    assert json.loads((tmp_path / "metrics.json").read_text())["epochs"] == 3
    assert last_checkpoint(tmp_path)["bad_in_row"] == 0


def test_a_nan_validation_score_is_no_improvement(data_root, tmp_path, monkeypatch):
    real = Trainer.validate
    calls = [0]

    def validate(self: Trainer) -> dict[str, Any]:
        calls[0] += 1
        val = real(self)
        return {**val, "CIDEr": NAN} if calls[0] == 2 else val

    monkeypatch.setattr(Trainer, "validate", validate)
    train(compose_config(*tiny(data_root, EPOCHS2, "scheduler=plateau")), tmp_path)
    first, second = history(tmp_path)
    assert math.isnan(second["val_CIDEr"])
    assert torch.load(tmp_path / "checkpoints/best.pt", weights_only=True)["epoch"] == 1  # not overwritten
    last = last_checkpoint(tmp_path)
    assert last["best"] == first["val_CIDEr"] and last["bad_epochs"] == 1
    # the plateau schedule saw no improvement (its worst value), not a NaN
    assert last["scheduler"]["num_bad_epochs"] == 1 and last["scheduler"]["best"] == first["val_CIDEr"]


def test_no_finite_validation_score_at_all_is_one_error_not_a_missing_file(data_root, tmp_path, monkeypatch):
    monkeypatch.setattr(Trainer, "validate", lambda self: {"CIDEr": NAN, "Bleu_4": NAN})
    with pytest.raises(ValueError, match="^no epoch ended with finite weights and a finite CIDEr: no best.pt$"):
        train(compose_config(*tiny(data_root, EPOCHS2)), tmp_path)
    assert not (tmp_path / "checkpoints/best.pt").exists() and last_checkpoint(tmp_path)["epoch"] == 2


def test_non_finite_weights_are_never_checkpointed(data_root, tmp_path, monkeypatch, caplog):
    """A BatchNorm statistic turned NaN after epoch 2's validation: neither last.pt nor best.pt takes it."""
    real = Trainer.validate
    calls = [0]

    def validate(self: Trainer) -> dict[str, Any]:
        calls[0] += 1
        val = real(self)
        if calls[0] == 2:
            bn = next(m for m in self.model.modules() if isinstance(m, torch.nn.BatchNorm2d))
            bn.running_mean.fill_(NAN)
            val = {**val, "CIDEr": 1e9}  # would be the best ever
        return val

    monkeypatch.setattr(Trainer, "validate", validate)
    train(compose_config(*tiny(data_root, EPOCHS2)), tmp_path)
    assert last_checkpoint(tmp_path)["epoch"] == 1
    assert torch.load(tmp_path / "checkpoints/best.pt", weights_only=True)["epoch"] == 1
    assert any("the end of epoch 2: the model's weights are not all finite; checkpoints/last.pt keeps the end of "
               "epoch 1" in r.getMessage() for r in caplog.records)
    assert len(history(tmp_path)) == 2


def test_a_mid_epoch_stop_after_bad_steps_resumes_with_the_same_counters(data_root, tmp_path_factory, monkeypatch):
    """NaN at steps 3 and 4, a stop right after step 4: the position holds the epoch's 2 bad steps and the 2 in a
    row; resumed, the run ends bit-identical to the uninterrupted one; a 3rd bad step after the resume (with
    trainer.max_bad_steps=3) is the 3rd in a row."""
    overrides = tiny(data_root, EPOCHS2)
    nan = {"nan_at": lambda k: k in (3, 4)}
    ref, run = tmp_path_factory.mktemp("uninterrupted"), tmp_path_factory.mktemp("stopped")
    with monkeypatch.context() as mp:
        inject(mp, **nan)
        train(compose_config(*overrides), ref)
    with monkeypatch.context() as mp:
        inject(mp, **nan, stop_at=4)
        with pytest.raises(TrainingInterrupted):
            train(compose_config(*overrides), run)
    last = last_checkpoint(run)
    assert last["step"] == 4 and last["position"]["batch"] == 4
    assert (last["position"]["bad_steps"], last["bad_in_row"]) == (2, 2)
    again = tmp_path_factory.mktemp("again") / "run"
    shutil.copytree(run, again)

    with monkeypatch.context() as mp:
        inject(mp, **nan)
        train(compose_config(*overrides, "resume=auto"), run)
    assert_identical(run, ref)
    assert [h["bad_steps"] for h in history(ref)] == [2, 0]

    with monkeypatch.context() as mp:
        inject(mp, nan_at=lambda k: k in (3, 4, 5))
        with pytest.raises(TrainingDiverged, match=r"^training diverged: 3 steps in a row .* \(epoch 1, step 5\); "
                           r"checkpoints/last.pt holds the last finite state \(batch 4 of epoch 1\)"):
            train(compose_config(*overrides, "trainer.max_bad_steps=3", "resume=auto"), again)


def test_an_old_checkpoint_without_the_counters_resumes(data_root, tmp_path, monkeypatch):
    """Checkpoints written before the counts existed: none in a row, none in the epoch."""
    overrides = tiny(data_root, EPOCHS2, "trainer.checkpoint_every=4")
    with monkeypatch.context() as mp:
        inject(mp, stop_at=4)
        with pytest.raises(TrainingInterrupted):
            train(compose_config(*overrides), tmp_path)
    path = tmp_path / "checkpoints" / "last.pt"
    old = torch.load(path, weights_only=True)
    del old["bad_in_row"], old["position"]["bad_steps"]
    torch.save(old, path)
    train(compose_config(*overrides, "resume=auto"), tmp_path)
    assert [h["bad_steps"] for h in history(tmp_path)] == [0, 0]


def test_a_lowered_learning_rate_takes_effect_on_resume(data_root, tmp_path):
    overrides = tiny(data_root, "trainer.max_epochs=1")
    train(compose_config(*overrides), tmp_path)
    before = last_checkpoint(tmp_path)["optimizer"]["param_groups"][0]["lr"]
    train(compose_config(*tiny(data_root, "trainer.max_epochs=2", "optim.lr=0.001", "resume=auto")), tmp_path)
    after = last_checkpoint(tmp_path)["optimizer"]["param_groups"][0]["lr"]
    assert after == pytest.approx(before / 2 * 0.9)  # halved, then the exponential schedule's step (gamma 0.9)


# -- the step itself (captioning/training/precision.py) ------------------------------------------------------------
def _sqrt_problem() -> tuple[torch.nn.Parameter, torch.optim.Optimizer]:
    p = torch.nn.Parameter(torch.tensor([0.0, 1.0]))  # d sqrt(p)/dp at 0 is inf: a finite loss, an inf gradient
    return p, torch.optim.Adam([p], lr=0.1)


@pytest.mark.parametrize("grad_clip", [None, 5.0])
def test_optimizer_step_skips_a_non_finite_gradient_norm(grad_clip):
    p, opt = _sqrt_problem()
    assert precision.optimizer_step(p.sqrt().sum(), opt, None, [p], grad_clip) == "gradient norm"
    assert p.grad is None and not opt.state and torch.equal(p.detach(), torch.tensor([0.0, 1.0]))
    assert precision.optimizer_step((p - 2).square().sum(), opt, None, [p], grad_clip) is None  # a finite step
    assert opt.state[p]["step"] == 1 and not torch.equal(p.detach(), torch.tensor([0.0, 1.0]))
    assert precision.optimizer_step(p.sum(), opt, None, [p], grad_clip, loss_finite=False) == "loss"
    assert p.grad is None and opt.state[p]["step"] == 1


def test_with_a_loss_scaler_only_the_loss_is_checked():
    """fp16 (a CPU GradScaler here, as fp16 itself needs CUDA): an overflowing gradient is the scaler's to handle
    (its step skipped, its scale lowered), not a skipped step; a non-finite loss is, and leaves the scaler alone."""
    p, opt = _sqrt_problem()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    assert precision.optimizer_step(p.sqrt().sum(), opt, scaler, [p], None) is None
    assert not opt.state and scaler.get_scale() == 2.0**9  # the scaler skipped it and backed off
    assert precision.optimizer_step(p.sum() * NAN, opt, scaler, [p], 5.0, loss_finite=False) == "loss"
    assert p.grad is None and not opt.state and scaler.get_scale() == 2.0**9
    assert precision.optimizer_step((p - 2).square().sum(), opt, scaler, [p], 5.0) is None  # the scaler still steps
    assert opt.state[p]["step"] == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 autocast needs CUDA")
def test_fp16_a_nan_loss_is_a_skipped_step(data_root, tmp_path, monkeypatch):
    inject(monkeypatch, nan_at=lambda k: k == 3)
    train(compose_config(*tiny(data_root, EPOCHS2, "trainer.precision=fp16", "device=cuda")), tmp_path)
    assert [h["bad_steps"] for h in history(tmp_path)] == [1, 0]  # the scaler's own overflow skips are not counted
    last = last_checkpoint(tmp_path)
    assert last["scaler"]["scale"] > 0 and precision.all_finite(last["model"].values())


# -- the command line ------------------------------------------------------------------------------------------------
INJECTED = """
import dataclasses, sys
import captioning.training.run_state as run_state
import captioning.training.trainer as tr
from captioning.train import main
real = tr.Trainer.loss
def loss(self, batch):  # NaN from step 7 (epoch 2) on
    terms = real(self, batch)
    return dataclasses.replace(terms, total=terms.total * float("nan")) if self.step >= 6 else terms
tr.Trainer.loss = loss
run_state.plot_history = lambda *a, **k: None
sys.argv[0] = "captioning-train"
main()
"""


@pytest.mark.integration
def test_the_command_line_says_it_diverged_in_one_line_and_how_to_continue(data_root, tmp_path):
    run = tmp_path / "run"
    overrides = [*tiny(data_root, EPOCHS2, "trainer.max_bad_steps=2"), f"hydra.run.dir={run}"]
    env = {"PATH": f"{BIN}", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", INJECTED, *overrides], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    head, _, command = line.partition(", then continue with: ")
    assert head == ("captioning-train: error: training diverged: 2 steps in a row had a non-finite loss or gradient "
                    "norm (epoch 2, step 8); checkpoints/last.pt holds the last finite state (the end of epoch 1); "
                    "lower optim.lr=0.002 or trainer.grad_clip=5.0")
    assert command.startswith("captioning-train ") and command.endswith(f"hydra.run.dir={run} resume=auto")
    assert [h["bad_steps"] for h in history(run)] == [0]
    done = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [h["bad_steps"] for h in history(run)] == [0, 0]
    assert (run / "metrics.json").is_file()


def test_the_config_check_knows_max_bad_steps(data_root):
    from captioning.config.schema import ConfigError, validate_train_config

    validate_train_config(compose_config(*tiny(data_root)))
    for bad in ("0", "2.5"):
        with pytest.raises(ConfigError, match=rf"trainer.max_bad_steps={bad}"):
            validate_train_config(compose_config(*tiny(data_root, f"trainer.max_bad_steps={bad}")))
