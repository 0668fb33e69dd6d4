"""scheduler=warmup: Vaswani's (NoamOpt's) rate, stepped after every optimizer step and checked like torch's."""

import pytest
import torch
from fixtures import compose_tiny_train

from captioning.config.schema import validate_train_config
from captioning.factory.run import build_trainer
from captioning.training.schedule import InverseSqrtWarmup, step_schedule
from captioning.training.tensorboard import NullWriter


def _noam(step: int, d_model: int = 512, warmup: int = 20000) -> float:
    """ruotianluo's NoamOpt (factor 1): d_model^-0.5 min(step^-0.5, step warmup^-1.5)."""
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def test_the_rate_is_noamopts_with_the_preset_learning_rate():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([p], lr=(512 * 20000) ** -0.5)
    sched = InverseSqrtWarmup(opt, 20000)
    rates = {}
    for step in range(1, 40001):
        rates[step] = opt.param_groups[0]["lr"]  # the rate of update `step`
        opt.step()
        sched.step()
    for step in (1, 2, 100, 19999, 20000, 20001, 40000):
        assert rates[step] == pytest.approx(_noam(step), rel=1e-12)
    assert max(rates.values()) == pytest.approx(3.125e-4)
    step_schedule(sched, 1.0)  # an epoch's end leaves a per-step schedule alone
    assert opt.param_groups[0]["lr"] == pytest.approx(_noam(40001), rel=1e-12)


def test_training_steps_the_warmup_after_every_optimizer_step(shapes_json, tmp_path):
    cfg = compose_tiny_train(shapes_json, "scheduler=warmup", "scheduler.warmup_steps=4", "optim.lr=0.01",
                             "trainer.max_epochs=1")
    validate_train_config(cfg)
    trainer = build_trainer(cfg, tmp_path)
    assert isinstance(trainer.scheduler, InverseSqrtWarmup)
    trainer.train_epoch(NullWriter(), None)
    steps = trainer.step
    assert steps >= 5
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * min((steps + 1) / 4, (4 / (steps + 1)) ** 0.5))


def test_a_warmup_of_zero_steps_is_refused(shapes_json):
    cfg = compose_tiny_train(shapes_json, "scheduler=warmup", "scheduler.warmup_steps=0")
    with pytest.raises(ValueError, match="warmup_steps"):
        validate_train_config(cfg)
