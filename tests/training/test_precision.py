"""Mixed precision (trainer.precision): bf16 autocast runs on the CPU with a float32 loss, fp16 is refused off
CUDA, and the fp16 loss scaler's state goes through checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fixtures import compose_tiny_train

from captioning.data.dataset import collate
from captioning.factory.run import build_trainer
from captioning.train import train
from captioning.training.precision import autocast_dtype


def _cfg(shapes_json: Path, *overrides: str):
    return compose_tiny_train(shapes_json, "decoder.dropout=0.0", "trainer.max_epochs=1", "eval.num_figures=0",
                              "device=cpu", *overrides)


def _batch(trainer):
    ds = trainer.data["train"]
    return collate([ds[i] for i in range(8)])


def test_bf16_forward_on_cpu_with_a_float32_loss(shapes_json, tmp_path):
    torch.manual_seed(0)
    fp32 = build_trainer(_cfg(shapes_json), tmp_path / "fp32")
    torch.manual_seed(0)
    bf16 = build_trainer(_cfg(shapes_json, "trainer.precision=bf16"), tmp_path / "bf16")
    bf16.model.load_state_dict(fp32.model.state_dict())
    torch.manual_seed(1)
    batch = _batch(fp32)  # the same images and captions for both
    seen: list[torch.dtype] = []
    bf16.model.decoder.L_o.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    ref, low = fp32.loss(batch), bf16.loss(batch)
    assert seen == [torch.bfloat16]  # the output layer ran in bfloat16 under autocast...
    assert low.total.dtype == low.token_nll.dtype == torch.float32  # ...the loss in float32
    # bfloat16 keeps 8 bits of mantissa: a relative error of ~2^-8 per product, averaged over many.
    assert low.total.item() == pytest.approx(ref.total.item(), rel=2e-2)
    assert low.token_nll.item() == pytest.approx(ref.token_nll.item(), rel=2e-2)
    bf16.optimizer_step(low.total)  # gradients reach every trainable parameter, in float32
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()
               for p in bf16.model.parameters() if p.requires_grad)


def test_bf16_training_run_on_cpu(shapes_json, tmp_path):
    metrics = train(_cfg(shapes_json, "trainer.precision=bf16"), tmp_path)
    (epoch,) = json.loads((tmp_path / "history.json").read_text())
    assert 0 < epoch["loss"] < 100 and metrics["num_images"] == 12
    assert torch.load(tmp_path / "checkpoints/last.pt", weights_only=True)["scaler"] is None  # bf16: no scaling


def test_fp16_off_cuda_and_unknown_precision_are_refused(shapes_json, tmp_path):
    with pytest.raises(ValueError, match="trainer.precision=fp16 needs a CUDA device.*use trainer.precision=bf16"):
        train(_cfg(shapes_json, "trainer.precision=fp16"), tmp_path)
    with pytest.raises(ValueError, match="trainer.precision='fp8' is not known; choose one of fp32, bf16, fp16"):
        autocast_dtype("fp8", torch.device("cpu"))
    assert autocast_dtype("fp32", torch.device("cpu")) is None


def test_loss_scaler_state_round_trips_through_checkpoints(shapes_json, tmp_path):
    # fp16 needs CUDA, so the scaler plumbing is exercised with a CPU GradScaler put in place by hand.
    trainer = build_trainer(_cfg(shapes_json, "trainer.precision=bf16"), tmp_path)
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
    trainer.optimizer_step(trainer.loss(_batch(trainer)).total)  # finite gradients: the scale grows to 2^11
    trainer.save("last.pt", trainer.training_state())
    resumed = build_trainer(_cfg(shapes_json, "trainer.precision=bf16"), tmp_path)
    resumed.scaler = torch.amp.GradScaler("cpu")
    resumed.resume(tmp_path / "checkpoints/last.pt")
    assert resumed.scaler.get_scale() == trainer.scaler.get_scale() == 2.0**11
    assert resumed.scaler.state_dict() == trainer.scaler.state_dict()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 autocast needs CUDA")
def test_fp16_training_on_cuda_with_resume(shapes_json, tmp_path):
    cfg = _cfg(shapes_json, "trainer.precision=fp16", "device=cuda")
    train(cfg, tmp_path)
    scaler = torch.load(tmp_path / "checkpoints/last.pt", weights_only=True)["scaler"]
    assert scaler is not None and scaler["scale"] > 0
    train(_cfg(shapes_json, "trainer.precision=fp16", "device=cuda", "trainer.max_epochs=2", "resume=auto"), tmp_path)
    history = json.loads((tmp_path / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2] and all(0 < h["loss"] < 100 for h in history)
