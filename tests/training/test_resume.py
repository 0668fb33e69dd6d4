"""Exact resume: a run stopped anywhere (an epoch's end, kill -9 mid-epoch, during validation, during a checkpoint
write, during the test) and continued with resume=auto ends bit-identical to the uninterrupted run: every tensor
of best.pt and last.pt (weights, optimizer, RNG states...), history.json, metrics.json and results.json; only
timing fields (train_seconds) and the config (resume, checkpoint_every) may differ.

Tiny runs: 24 training images in batches of 4 (6 steps per epoch), 4 validation and 4 test images, 4 epochs. To
keep them at seconds, scoring uses the pure-Python PTB tokenizer (Java off the PATH; the same tokens) and the
training-curve figure is not drawn (it is made from history.json, which is compared).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from fixtures import BIN, compose_config, tiny_overrides
from omegaconf import OmegaConf

from captioning.train import train

TIMING = {"train_seconds"}
EPOCHS, STEPS_PER_EPOCH = 4, 6
# A subprocess that trains and SIGKILLs itself at KILL_AT (kind:which:n), e.g. step::9 (before the 9th optimizer
# step), validate::2 (entering the 2nd validation), write:last.pt:3 (3rd last.pt written to its tmp file, not yet
# renamed), test::1 (entering the test); argv: run folder, overrides. Without KILL_AT it trains to the end.
KILLABLE = """
import os, signal, sys, types
from pathlib import Path
sys.path[:0] = [{tests!r}, str(Path({tests!r}).parent)]  # the tests' fixtures, and the package
import captioning.base.files as ck
import captioning.training.run_state as run_state
import captioning.training.trainer as tr
from captioning.train import train
from captioning.training.stop import TrainingInterrupted
from fixtures import compose_config
run_state.plot_history = lambda *a, **k: None
kind, which, n = (os.environ.get("KILL_AT") or "none::0").split(":")
count = [0]
def due(hit=True):
    count[0] += hit
    if hit and count[0] == int(n):
        os.kill(os.getpid(), signal.SIGKILL)
def wrap(name):
    real = getattr(tr.Trainer, name)
    def hooked(self, *args, **kwargs):
        due()
        return real(self, *args, **kwargs)
    setattr(tr.Trainer, name, hooked)
if kind == "step":
    wrap("optimizer_step")
elif kind in ("SIGINT", "SIGTERM"):  # the signal arrives during optimizer step n; the run stops cleanly after it
    real_step = tr.Trainer.optimizer_step
    def signalled(self, *args, **kwargs):
        count[0] += 1
        if count[0] == int(n):
            os.kill(os.getpid(), getattr(signal, kind))
        return real_step(self, *args, **kwargs)
    tr.Trainer.optimizer_step = signalled
elif kind in ("validate", "test"):
    wrap(kind)
elif kind == "write":
    def replace(src, dst):
        due(Path(dst).name == which)
        os.replace(src, dst)
    ck.os = types.SimpleNamespace(**{{**vars(os), "replace": replace}})
try:
    train(compose_config(*sys.argv[2:]), Path(sys.argv[1]))
except TrainingInterrupted as stop:
    print(stop, file=sys.stderr)
    sys.exit(130)
"""


def tiny(root: Path, *extra: str) -> list[str]:
    """Overrides of a tiny 4-epoch run (debug=tiny: its model, whichever decoder) on a 24/4/4-image shapes set under
    `root`."""
    return tiny_overrides(root, "dataset.generate.num_train=24", "dataset.generate.num_val=4",
                          "dataset.generate.num_test=4", "dataset.batch_size=4", f"trainer.max_epochs={EPOCHS}",
                          "eval.beam_size=2", "eval.num_figures=0", "eval.report=false", "device=cpu", *extra)


pytestmark = pytest.mark.usefixtures("quick_scoring", "one_thread")  # tests/training/conftest.py


@pytest.fixture(scope="module")
def reference(data_root, tmp_path_factory):
    """The uninterrupted runs, one per attention, made on first use."""
    runs: dict[str, Path] = {}

    def get(attention: str) -> Path:
        if attention not in runs:
            out = tmp_path_factory.mktemp(f"reference_{attention}")
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("PATH", BIN)
                mp.setattr("captioning.training.run_state.plot_history", lambda *a, **k: None)
                train(compose_config(*tiny(data_root, *ATTENTION[attention])), out)
            runs[attention] = out
        return runs[attention]
    return get


# soft; hard with the expected-context coin tossed per batch (p = 0.5) and dropout on: every stream is used
ATTENTION = {"soft": ["attention=soft"],
             "hard": ["attention=hard", "attention.expected_context_prob=0.5", "decoder.dropout=0.3"],
             "soft_buckets": ["attention=soft", "dataset.length_buckets=2"],
             # the compared decoders, dropout on; the Transformer with its per-step warm-up schedule
             "updown": ["decoder=updown", "attention=soft", "decoder.dropout=0.3"],
             "transformer": ["decoder=transformer", "decoder.dropout=0.3", "decoder.encoder_layers=1",
                             "scheduler=warmup", "scheduler.warmup_steps=5"],
             # monotonic attention's training noise from its own seeded generator (its draw count is checkpointed)
             "monotonic": ["attention=monotonic", "attention.sigmoid_noise_seed=3", "decoder.dropout=0.3"],
             # the zoo's: Att2in's maxout cell, the sentinel, AoA's refiner (dropout too), M2's slots and mesh
             "att2in": ["decoder=att2in", "attention=soft", "decoder.dropout=0.3"],
             "adaptive": ["decoder=adaptive", "decoder.dropout=0.3"],
             "aoa": ["decoder=aoa", "decoder.dropout=0.3"],
             "m2": ["decoder=m2", "decoder.dropout=0.3", "decoder.encoder_layers=1", "scheduler=warmup",
                    "scheduler.warmup_steps=5"]}


def same(a: Any, b: Any, where: str = "") -> list[str]:
    """Where two checkpoint or JSON values differ (tensors compared with torch.equal: bit for bit; NaN = NaN)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        ok = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
        return [] if ok else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where} keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in same(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where} length"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in same(x, y, f"{where}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if type(a) is type(b) and a == b else [where]


def untimed(path: Path) -> Any:
    value = json.loads(path.read_text())
    strip = lambda d: {k: v for k, v in d.items() if k not in TIMING}  # noqa: E731
    return [strip(d) for d in value] if isinstance(value, list) else strip(value)


def last_checkpoint(run: Path) -> dict[str, Any]:
    """The run's last.pt as the trainer wrote it (its step, position and state)."""
    return torch.load(run / "checkpoints" / "last.pt", weights_only=True)


def assert_identical(run: Path, ref: Path) -> None:
    """Bit-identical runs: checkpoints apart from config and timing, and the JSON outputs apart from timing."""
    for name in ("best.pt", "last.pt"):
        a, b = (torch.load(r / "checkpoints" / name, weights_only=True) for r in (run, ref))
        for key in ("config", *TIMING):
            a.pop(key), b.pop(key)
        assert not same(a, b, name), same(a, b, name)
    for name in ("history.json", "metrics.json"):
        assert not same(untimed(run / name), untimed(ref / name), name), same(untimed(run / name), untimed(ref / name), name)
    assert (run / "results.json").read_text() == (ref / "results.json").read_text()
    assert not list((run / "checkpoints").glob("*.tmp"))


def killed_run(out: Path, overrides: list[str], kill_at: str | None = None, timeout: float = 300,
               kill_when: Any = None) -> subprocess.CompletedProcess | int:
    """Train in a subprocess that SIGKILLs itself at `kill_at`, or that this process kill -9s as soon as
    `kill_when(out)` holds; returns the completed process or the signal's negative return code."""
    env = {**os.environ, "PATH": BIN, "OMP_NUM_THREADS": "1", "KILL_AT": kill_at or ""}
    script = KILLABLE.format(tests=str(Path(__file__).parent))
    cmd = [sys.executable, "-c", script, str(out), *overrides]
    if kill_when is None:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not kill_when(out) and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    return proc.returncode


def resume_and_compare(out: Path, overrides: list[str], ref: Path) -> None:
    train(compose_config(*overrides, "resume=auto"), out)
    assert_identical(out, ref)


@pytest.mark.parametrize("attention", ["soft", "hard", "updown", "transformer", "monotonic", "att2in", "adaptive",
                                       "aoa", "m2"])
def test_stop_at_an_epoch_end_then_resume_is_bit_identical(data_root, reference, tmp_path, attention):
    ref = reference(attention)
    overrides = tiny(data_root, *ATTENTION[attention])
    train(compose_config(*overrides, "trainer.max_epochs=2"), tmp_path)
    assert [h["epoch"] for h in json.loads((tmp_path / "history.json").read_text())] == [1, 2]
    resume_and_compare(tmp_path, overrides, ref)
    # the uninterrupted run did learn, and its history names the 4 epochs: the comparison is not vacuous
    history = json.loads((ref / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3, 4] and history[-1]["nll"] < history[0]["nll"]
    if attention == "hard":  # sampled minibatches ran: REINFORCE terms and a baseline were logged
        assert all("baseline" in h for h in history)


@pytest.mark.integration
def test_kill_9_mid_epoch_then_resume_is_bit_identical(data_root, reference, tmp_path):
    """kill -9 from outside at a random moment after the first mid-epoch checkpoint (step 2 of 24). The tiny run
    lasts about a second after that; a kill that came too late (after the last step: the final test decode or the
    finished run) is tried again, sooner."""
    ref = reference("hard")
    overrides = tiny(data_root, *ATTENTION["hard"], "trainer.checkpoint_every=2")
    rng, longest = random.Random(), 1.0
    for _ in range(6):
        out = tmp_path / f"run_{longest:g}"
        delay, first = rng.uniform(0.0, longest), {}

        def checkpointed(out: Path, first: dict = first, delay: float = delay) -> bool:  # this try's values
            if "at" not in first and (out / "checkpoints" / "last.pt").is_file():
                first["at"] = time.monotonic()
            return "at" in first and time.monotonic() - first["at"] >= delay

        status = killed_run(out, overrides, kill_when=checkpointed)
        assert status in (-signal.SIGKILL, 0)  # 0: the run had ended before the kill came
        if status == -signal.SIGKILL and last_checkpoint(out)["step"] < EPOCHS * STEPS_PER_EPOCH:
            break  # killed during training (not in the final test decode)
        longest /= 2
    else:
        pytest.fail("every kill came after the last training step")
    assert not (out / "metrics.json").exists()
    resume_and_compare(out, overrides, ref)


@pytest.mark.integration
def test_kill_during_a_checkpoint_write_then_resume_is_bit_identical(data_root, reference, tmp_path):
    """SIGKILL once the 3rd last.pt (epoch 1's end, after steps 2 and 4) is in its tmp file, before the rename:
    the tmp file stays behind; the next run removes it and resumes from step 4's last.pt."""
    ref = reference("hard")
    overrides = tiny(data_root, *ATTENTION["hard"], "trainer.checkpoint_every=2")
    proc = killed_run(tmp_path, overrides, "write:last.pt:3")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert list((tmp_path / "checkpoints").glob(".last.pt.*.tmp"))
    assert last_checkpoint(tmp_path)["step"] == 4
    resume_and_compare(tmp_path, overrides, ref)


@pytest.mark.integration
def test_length_buckets_killed_mid_epoch_then_resumed_is_bit_identical(data_root, reference, tmp_path):
    ref = reference("soft_buckets")
    overrides = tiny(data_root, *ATTENTION["soft_buckets"], "trainer.checkpoint_every=4")
    proc = killed_run(tmp_path, overrides, "step::9")  # in epoch 2, after its first checkpoint
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    resume_and_compare(tmp_path, overrides, ref)
    assert OmegaConf.load(ref / "config.yaml").dataset.length_buckets == 2  # the run did bucket


# Every kind of stop; the steps count from 1 over the whole run (6 per epoch), checkpoints every 4 steps; a
# best.pt write: the first (the tiny soft run may improve only once).
KILL_POINTS = ["step::2", "step::5", "step::7", "step::12", "step::13", "step::17", "step::24", "validate::1",
               "validate::3", "write:last.pt:1", "write:last.pt:4", "write:best.pt:1", "test::1"]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("attention", ["soft", "hard"])
@pytest.mark.parametrize("kill_at", KILL_POINTS)
def test_every_kill_point_resumes_bit_identical(data_root, reference, tmp_path, attention, kill_at):
    ref = reference(attention)
    overrides = tiny(data_root, *ATTENTION[attention], "trainer.checkpoint_every=4")
    proc = killed_run(tmp_path, overrides, kill_at)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    resume_and_compare(tmp_path, overrides, ref)


@pytest.mark.integration
@pytest.mark.parametrize("decoder", ["updown", "transformer"])
def test_the_compared_decoders_killed_mid_epoch_resume_bit_identical(data_root, reference, tmp_path, decoder):
    """kill -9 before step 11: the run goes on from step 8's checkpoint, mid-epoch (the Transformer's warm-up
    schedule, stepped per optimizer step, included)."""
    ref = reference(decoder)
    overrides = tiny(data_root, *ATTENTION[decoder], "trainer.checkpoint_every=4")
    proc = killed_run(tmp_path, overrides, "step::11")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert last_checkpoint(tmp_path)["step"] == 8
    resume_and_compare(tmp_path, overrides, ref)


@pytest.mark.integration
@pytest.mark.parametrize("signame, at", [("SIGINT", 3), ("SIGTERM", 6), ("SIGINT", 14)])
def test_a_signal_saves_the_run_and_resume_is_bit_identical(data_root, reference, tmp_path, signame, at, caplog):
    """Ctrl-C / SIGTERM during optimizer step `at` (mid-epoch, an epoch's last step, a later epoch): the run writes a
    resumable last.pt right after that step and exits 130; resume=auto then ends bit-identical."""
    ref = reference("hard")
    overrides = tiny(data_root, *ATTENTION["hard"])  # no checkpoint_every: the stop itself writes last.pt
    proc = killed_run(tmp_path, overrides, f"{signame}::{at}")
    assert proc.returncode == 130, proc.stderr[-2000:]
    how = "Ctrl-C (SIGINT)" if signame == "SIGINT" else signame
    assert f"stopped by {how} in epoch {(at - 1) // STEPS_PER_EPOCH + 1} after step {at}" in proc.stderr
    last = last_checkpoint(tmp_path)
    assert last["step"] == at and not (tmp_path / "metrics.json").exists()
    assert last["position"]["batch"] == (at - 1) % STEPS_PER_EPOCH + 1  # the batches of its epoch done so far
    with caplog.at_level(logging.INFO, logger="captioning.training.run_state"):
        resume_and_compare(tmp_path, overrides, ref)
    (resumed,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resumed from")]
    # before any validation there is no best score to report (it said "best CIDEr -inf")
    assert resumed.endswith("(no epoch scored)" if at <= STEPS_PER_EPOCH else f"(best CIDEr {last['best']:.4f})")


# -- self-critical training (objective=scst) ---------------------------------------------------------------------
def scst(data_root: Path, xe_run: Path, *extra: str) -> list[str]:
    """A tiny SCST run from a cross-entropy run's best.pt, with hard attention: its sampled captions, regions,
    coin and dropout all draw from the checkpointed streams, and the regions' moving-average baseline is saved."""
    return tiny(data_root, *ATTENTION["hard"], "objective=scst", f"init_from={xe_run / 'checkpoints' / 'best.pt'}",
                "objective.max_len=8", "objective.samples_per_image=3", f"trainer.max_epochs={EPOCHS}",
                f"trainer.patience={EPOCHS}", *extra)


@pytest.fixture(scope="module")
def scst_reference(data_root, reference, tmp_path_factory):
    """The uninterrupted SCST run from the hard-attention reference run's best.pt."""
    out = tmp_path_factory.mktemp("reference_scst")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", BIN)
        mp.setattr("captioning.training.run_state.plot_history", lambda *a, **k: None)
        train(compose_config(*scst(data_root, reference("hard"))), out)
    return out


@pytest.mark.integration
def test_scst_killed_mid_epoch_then_resumed_is_bit_identical(data_root, reference, scst_reference, tmp_path):
    overrides = scst(data_root, reference("hard"), "trainer.checkpoint_every=4")
    proc = killed_run(tmp_path, overrides, "step::11")  # last.pt of step 8, then 2 more steps lost
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert last_checkpoint(tmp_path)["step"] == 8
    resume_and_compare(tmp_path, overrides, scst_reference)
    history = json.loads((scst_reference / "history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]  # the comparison covers every epoch of a learning run
    assert all({"reward", "greedy_CIDEr", "policy", "baseline"} <= h.keys() for h in history)


def test_scst_stopped_at_an_epoch_end_then_resumed_is_bit_identical(data_root, reference, scst_reference, tmp_path):
    overrides = scst(data_root, reference("hard"))
    train(compose_config(*overrides, "trainer.max_epochs=2"), tmp_path)
    resume_and_compare(tmp_path, overrides, scst_reference)
