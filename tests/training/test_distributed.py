"""Multi-process training: a 2-process torchrun launch (gloo, CPU) trains like one process with the same global
batch, gathers validation exactly, and only rank 0 writes files.

Tolerances. The 2-rank run and the 1-process reference see the same images per step (DistributedSampler order,
global batch 2 x 4 images, all 5 captions per image, dropout 0), so they differ only by
- float summation order (gradients averaged over ranks vs summed in one batch): loss within 1e-6;
- token_nll, logged per rank as a token mean and pooled as the mean of the two, against the token mean of the
  global batch (ranks hold different numbers of words): within 1e-3. The loss itself (sum over words, mean over
  captions) pools exactly, since both ranks hold 20 captions.
The test model has no BatchNorm (encoder.channels=[]: the decoder attends over pixels with their coordinates):
on the CPU each rank would normalise with the statistics of its own 4 images, the reference with all 8
(the trainer uses SyncBatchNorm on CUDA, which has no CPU kernel), a 1e-4 difference in the loss.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fixtures import compose_config, tiny_overrides

from captioning.evaluation.split import decode_split, score_predictions
from captioning.factory.datasets import build_datasets
from captioning.factory.load import load_model
from captioning.runtime import CONF_DIR
from captioning.train import train
from captioning.training import distributed

PER_RANK_BATCH = 4


def _overrides(shapes_json: Path, *extra: str) -> list[str]:
    return tiny_overrides(Path(shapes_json).parent, "dataset.captions_per_image=null", "encoder.channels=[]",
                          "encoder.num_pools=0", "decoder.dropout=0.0", "optim.lr=0.01", "trainer.max_epochs=1", *extra)


TRANSFORMER = ("decoder=transformer", "decoder.encoder_layers=1")


def _transformer(overrides: list[str]) -> list[str]:
    """The same run with decoder=transformer (debug=tiny's sizes of it, conf/debug/decoder/tiny_transformer.yaml)."""
    return [*overrides, *TRANSFORMER]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int, overrides: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node=N -m captioning.train ...` on the CPU (gloo), one thread per process."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "captioning.train", "device=cpu", *overrides]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _single_process_reference(shapes_json: Path, out_dir: Path, monkeypatch: pytest.MonkeyPatch,
                              model: tuple[str, ...] = ()) -> None:
    """The same training in this process as a world of one rank: the global batch in one process, with the
    DistributedSampler's image order (a plain run shuffles with the global RNG instead)."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(key, value)
    overrides = _overrides(shapes_json, "device=cpu", f"dataset.batch_size={2 * PER_RANK_BATCH}")
    cfg = compose_config(*(_transformer(overrides) if model else overrides))
    try:
        train(cfg, out_dir)
    finally:
        distributed.cleanup()


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


@pytest.fixture(scope="module")
def two_ranks(shapes_json: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-process run launched without hydra.run.dir from an empty folder; returns that folder."""
    cwd = tmp_path_factory.mktemp("torchrun")
    _torchrun(2, _overrides(shapes_json, f"dataset.batch_size={PER_RANK_BATCH}", "trainer.log_every=1"), cwd)
    return cwd


def _run_dir(cwd: Path) -> Path:
    runs = [p for p in (cwd / "outputs").glob("*/*") if p.is_dir()]
    assert len(runs) == 1, f"expected one run folder shared by both ranks, got {runs}"
    return runs[0]


@pytest.mark.integration
def test_two_ranks_train_like_one_process_with_the_global_batch(two_ranks, shapes_json, tmp_path, monkeypatch):
    run = _run_dir(two_ranks)
    _single_process_reference(shapes_json, tmp_path / "ref", monkeypatch)
    (ddp,), (ref,) = (json.loads((d / "history.json").read_text()) for d in (run, tmp_path / "ref"))
    assert ddp["step"] == ref["step"] == 48 // (2 * PER_RANK_BATCH)  # each rank took 1/2 of every global batch
    # Loss and NLL, means over the 6 steps at lr 0.01: only the float summation order differs (1e-8 measured).
    assert ddp["loss"] == pytest.approx(ref["loss"], rel=1e-6)
    assert ddp["nll"] == pytest.approx(ref["nll"], rel=1e-6)
    # token_nll pools the ranks' token means, not the global token mean: measured 2e-5 apart.
    assert ddp["token_nll"] == pytest.approx(ref["token_nll"], rel=1e-3)
    assert ddp["token_nll"] != ref["token_nll"]
    w_ddp, w_ref = _weights(run / "checkpoints/last.pt"), _weights(tmp_path / "ref/checkpoints/last.pt")
    assert w_ddp.keys() == w_ref.keys()  # the plain module's keys, no "module." prefix
    # The bias of the attention score w cancels in the softmax: its true gradient is 0, its float noise differs
    # between the runs, and Adam turns noise into steps of size lr. So do the state init's weights on the two
    # coordinate channels (the last two of a): their mean over an image's pixels is the same ~0 for every image
    # (2e-4..7e-4 apart measured, each batch's images ordered by caption length). Every other weight agrees to
    # 1e-5 (7e-7 measured).
    for k in w_ref.keys() - {"decoder.attention.w.bias"}:
        keep = (slice(None), slice(0, -2)) if k in {"decoder.init_h.0.weight", "decoder.init_c.0.weight"} else ...
        assert torch.allclose(w_ddp[k][keep], w_ref[k][keep], rtol=0, atol=1e-5), k


@pytest.mark.integration
def test_validation_is_gathered_to_exactly_a_single_process_decode(two_ranks, shapes_json):
    run = _run_dir(two_ranks)
    (ddp,) = json.loads((run / "history.json").read_text())
    model, vocab, _ = load_model(run / "checkpoints/last.pt")  # the weights validated after epoch 1
    cfg = compose_config(*_overrides(shapes_json))
    _, data = build_datasets(cfg.dataset, model.encoder.transform(), splits=["val"], vocab=vocab)
    preds = decode_split(model, data["val"], beam_size=1, max_len=cfg.eval.max_len, progress=False)
    val = score_predictions(preds, data["val"], ("bleu", "cider"))
    assert ddp["val_num_images"] == 12
    for key in ("Bleu_1", "Bleu_4", "CIDEr"):  # the same captions: the same scores
        assert ddp[f"val_{key}"] == pytest.approx(val[key], abs=1e-12), key
    # The maps come from batches of another size (a shard of 6 against 12 images), whose matrix products may sum in
    # another order: equal to float rounding.
    # (After one epoch of this tiny model no caption may name a shape yet: then both are NaN over 0 words.)
    assert ddp["val_attention_words"] == val["attention_words"]
    assert ddp["val_attention_correctness"] == pytest.approx(val["attention_correctness"], abs=1e-9, nan_ok=True)
    metrics = json.loads((run / "metrics.json").read_text())  # the test split, decoded in two shards
    results = json.loads((run / "results.json").read_text())
    assert metrics["num_images"] == 12 and len({r["image_id"] for r in results}) == 12


@pytest.mark.integration
def test_only_rank_zero_writes_files(two_ranks):
    run = _run_dir(two_ranks)
    assert sorted(p.name for p in two_ranks.iterdir()) == ["outputs"]  # nothing else in the launch folder
    assert len(list((run / "tensorboard").iterdir())) == 1  # one event file: rank 0's writer
    assert [p.name for p in run.glob("*.log")] == ["train.log"]
    assert sorted(p.name for p in (run / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.pt", "last.pt"]
    assert not list(run.rglob("*.tmp"))


@pytest.mark.integration
@pytest.mark.slow
def test_two_ranks_resume_and_hard_attention(two_ranks, shapes_json, tmp_path):
    run = _run_dir(two_ranks)
    _torchrun(2, _overrides(shapes_json, f"dataset.batch_size={PER_RANK_BATCH}", "trainer.max_epochs=2",
                            "resume=auto", f"hydra.run.dir={run}"), tmp_path / "resume")
    assert [h["epoch"] for h in json.loads((run / "history.json").read_text())] == [1, 2]
    # Hard attention: DDP over graphs that change per batch, and one REINFORCE baseline for the global batch.
    hard = tmp_path / "hard"
    _torchrun(2, _overrides(shapes_json, "attention=hard", "attention.attention_dim=16",
                            "attention.expected_context_prob=0.0", f"dataset.batch_size={PER_RANK_BATCH}",
                            f"hydra.run.dir={hard / 'run'}"), hard)
    (h,) = json.loads((hard / "run/history.json").read_text())
    assert h["baseline"] < 0 and "policy" in h


def test_global_mean_baseline_matches_the_plain_baseline_in_one_process():
    from captioning.training.losses import GlobalMeanBaseline, MovingAverageBaseline

    plain, synced = MovingAverageBaseline(0.9), GlobalMeanBaseline(0.9)
    for rewards in (torch.tensor([-3.0, -5.0]), torch.tensor([-1.0, -2.0, -6.0])):
        before = synced.value
        plain.update(rewards)
        synced.update(rewards)
        assert synced.value == before  # recorded only; folded at the step's sync
        synced.sync()
        assert synced.value == pytest.approx(plain.value, abs=1e-6)
    assert plain.value == pytest.approx(0.9 * -4.0 + 0.1 * -3.0)


def test_torchrun_environment_is_checked(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert distributed.env_from_os() is None and distributed.world_size() == 1 and distributed.is_main()
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="inconsistent torchrun environment: RANK=2, WORLD_SIZE=2"):
        distributed.env_from_os()


def test_torchrun_overrides_share_rank_zeros_run_folder_and_refuse_sweeps():
    train_yaml = CONF_DIR / "train.yaml"
    # rank 0 of a launch (here: the only process)
    (run_dir,) = distributed.torchrun_overrides(["trainer.max_epochs=1"], train_yaml)
    assert re.fullmatch(r"hydra\.run\.dir=outputs/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d", run_dir)
    assert distributed.torchrun_overrides(["hydra.run.dir=outputs/ddp"], train_yaml) == []  # a given folder is kept
    with pytest.raises(SystemExit, match="under torchrun the N processes train one run"):
        distributed.torchrun_overrides(["-m", "optim.lr=0.1,0.01"], train_yaml)


@pytest.mark.integration
def test_two_ranks_train_the_transformer_like_one_process(shapes_json, tmp_path, monkeypatch):
    """decoder=transformer under DDP: the same losses and weights as one process with the global batch (the
    self-attention's key biases excepted: q . b_k is the same for every key, so their true gradient is 0 and
    Adam turns the ranks' different float noise into steps)."""
    _torchrun(2, _transformer(_overrides(shapes_json, f"dataset.batch_size={PER_RANK_BATCH}")), tmp_path / "ddp")
    run = _run_dir(tmp_path / "ddp")
    _single_process_reference(shapes_json, tmp_path / "ref", monkeypatch, TRANSFORMER)
    (ddp,), (ref,) = (json.loads((d / "history.json").read_text()) for d in (run, tmp_path / "ref"))
    assert ddp["step"] == ref["step"] == 48 // (2 * PER_RANK_BATCH)
    assert ddp["loss"] == pytest.approx(ref["loss"], rel=1e-6) and ddp["nll"] == pytest.approx(ref["nll"], rel=1e-6)
    w_ddp, w_ref = _weights(run / "checkpoints/last.pt"), _weights(tmp_path / "ref/checkpoints/last.pt")
    assert w_ddp.keys() == w_ref.keys() and any(".layers.1." in k or ".layers.0." in k for k in w_ref)
    for k in w_ref:
        if k.endswith("qkv.bias"):
            d = w_ref[k].shape[0] // 3  # q, k, v: compare the query and value biases
            w_ddp[k], w_ref[k] = torch.cat([w_ddp[k][:d], w_ddp[k][2 * d:]]), torch.cat([w_ref[k][:d], w_ref[k][2 * d:]])
        assert torch.allclose(w_ddp[k], w_ref[k], rtol=0, atol=1e-5), k


EXIT_SCRIPT = """
import atexit, pathlib, sys
from captioning.cli import exit_status
from captioning.training import distributed
atexit.register(lambda: pathlib.Path(sys.argv[1]).write_text("atexit ran"))
print("unflushed", end="")
distributed.exit_process(exit_status(SystemExit(eval(sys.argv[2]))))
"""


@pytest.mark.integration
@pytest.mark.parametrize("code, status, stderr", [(None, 0, ""), (0, 0, ""), (130, 130, ""),
                                                  ("captioning-train: stopped", 1, "captioning-train: stopped\n")])
def test_a_worker_leaves_with_its_exit_status_after_pythons_exit_work(tmp_path, code, status, stderr):
    """A torchrun worker ends through distributed.exit_process (past torch's teardown at exit): SystemExit's code
    as the status (cli.exit_status), Python's exit handlers run and what was printed is flushed."""
    proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(tmp_path / "flag"), repr(code)],
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (status, "unflushed", stderr)
    assert (tmp_path / "flag").read_text() == "atexit ran"
