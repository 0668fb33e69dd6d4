"""GPU check (issue 48): every CUDA path of the toolkit run once, and the speed a GPU user gets, in one report.

    .venv/bin/python experiments/gpu_check.py --out gpu_report                       # one GPU, at most 8 minutes
    .venv/bin/python experiments/gpu_check.py --device cpu --tiny --out /tmp/dry     # the CPU dry run (the tests')

Writes `<out>/report.json` and `<out>/report.md`. Sections, each in what is left of `--budget` seconds (a section
that fails or runs out of time is reported as such and the next one runs):

- environment: torch, CUDA and the card; the card's dense peak TFLOP/s from NVIDIA's datasheets where the card is
  known (fp32, TF32, bf16, fp16; without sparsity) and the GEMM peak measured here for each precision;
- tests: the tests that need a GPU (tests/models/test_device_parity.py: every decoder and attention on the device
  against the CPU's plain kernels; the fp16 GradScaler tests of tests/training/), CAPTIONING_TEST_DEVICE=<device>;
- bench: `bench_decoder.py`'s training step at the paper's ResNet sizes (L = 196, D = 2048, E = H = A = 512,
  V = 10k) for B = 32 and 128 captions of real COCO-like lengths, in fp32 (TF32 off: PyTorch's default, so the
  toolkit's), TF32, bf16 and fp16 (autocast; fp16 with the GradScaler): ms, real tokens/s; beam 3 and 5 images/s;
  each as a share of the measured and the datasheet peak;
- shapes: the default `shapes` run with `device=<device>` (wall time, scores);
- torchrun: a one-process `torchrun` training run (NCCL for the gradients on a GPU, gloo on a CPU). SyncBatchNorm
  (`run.py` converts only with two ranks or more) needs two GPUs: not exercised by one;
- compile (last: inductor may compile for minutes): torch.compile of the training step (the decoder's forward and
  backward) and of the decoding step (`eval.compile`): compile seconds, speed-up, whether greedy and beam-3
  captions stay identical.

`--tiny` shrinks every size (a dry run on the CPU in about a minute, compiling with the `eager` backend: dynamo's
tracing without code generation) so that the script is run by the test suite and does not rot.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import bench_decoder as bd  # noqa: E402

from captioning.models.captioner import CompiledStep  # noqa: E402
from captioning.models.decoding import beam_search, greedy_decode  # noqa: E402

# Dense peak TFLOP/s (fp32, tf32, bf16, fp16) from NVIDIA's product datasheets (their tensor-core figures are given
# with sparsity: halved here). Matched against torch.cuda.get_device_name in this order.
DATASHEET = [("H200 NVL", (60.0, 417.5, 835.5, 835.5)), ("H200", (67.0, 494.7, 989.4, 989.4)),
             ("H100 NVL", (60.0, 417.5, 835.5, 835.5)), ("H100 PCIe", (51.0, 378.0, 756.0, 756.0)),
             ("H100", (67.0, 494.7, 989.4, 989.4)), ("A100", (19.5, 156.0, 312.0, 312.0))]
PRECISIONS = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TINY = {"V": 50, "L": 16, "M": 32, "STEPS": 6, "SIZES": {"resnet": 64}}


@contextlib.contextmanager
def tf32(on: bool) -> Iterator[None]:
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def datasheet(name: str) -> dict[str, float] | None:
    return next((dict(zip(PRECISIONS, peaks)) for key, peaks in DATASHEET if all(w in name for w in key.split())), None)


class Check:
    """The run's settings, its report, and the time left."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.device = args, torch.device(args.device)
        self.out = Path(args.out).resolve()
        self.deadline = time.monotonic() + args.budget
        self.report: dict[str, Any] = {"device": args.device, "tiny": args.tiny, "budget_s": args.budget}
        self.peaks: dict[str, float] = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def precisions(self) -> list[str]:
        if self.device.type == "cuda":
            return ["fp32", "tf32"] + (["bf16"] if torch.cuda.is_bf16_supported() else []) + ["fp16"]
        return ["fp32", "bf16"]  # a CPU: no TF32; fp16 autocast is the GPU's (trainer.precision=fp16 needs CUDA)

    def run(self, name: str, fn: Callable[[Check], dict[str, Any]]) -> None:
        start = time.monotonic()
        if self.left() <= 5:
            self.report[name] = {"status": "not run: the budget was spent"}
            return
        try:
            result = {"status": "ok", **fn(self)}
        except Exception as err:  # one section's failure is reported, the next section runs
            result = {"status": "failed", "error": f"{type(err).__name__}: {err}"[:2000],
                      "traceback": traceback.format_exc()[-3000:]}
        result["seconds"] = round(time.monotonic() - start, 1)
        self.report[name] = result
        print(f"{name}: {result['status']} in {result['seconds']} s", flush=True)

    def subprocess(self, cmd: list[str], cap: float, env: dict[str, str] | None = None) -> dict[str, Any]:
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                                  timeout=max(1.0, min(cap, self.left())))
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{' '.join(cmd[:6])} ... ran past {min(cap, self.left()):.0f} s") from None
        return {"returncode": proc.returncode, "wall_s": round(time.monotonic() - start, 1),
                "output_tail": (proc.stdout + proc.stderr)[-1500:]}

    def train_overrides(self, folder: str) -> list[str]:
        tiny = ["debug=tiny", f"dataset.root={self.out / 'data'}"] if self.args.tiny else []
        return [f"device={self.args.device}", "trainer.progress=false", f"hydra.run.dir={self.out / folder}", *tiny]


def environment(c: Check) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                            "cuda": torch.version.cuda, "threads": torch.get_num_threads()}
    if c.device.type == "cuda":
        name = torch.cuda.get_device_name(c.device)
        info.update(card=name, capability=".".join(map(str, torch.cuda.get_device_capability(c.device))),
                    memory_gib=round(torch.cuda.get_device_properties(c.device).total_memory / 2**30, 1),
                    cudnn=torch.backends.cudnn.version(), datasheet_tflops=datasheet(name),
                    tf32_default={"matmul": torch.backends.cuda.matmul.allow_tf32,
                                  "cudnn": torch.backends.cudnn.allow_tf32})
    else:
        info.update(card=platform.processor() or platform.machine(), datasheet_tflops=None)
    n = 256 if c.args.tiny else 8192
    for p in c.precisions():
        with tf32(p == "tf32"):
            c.peaks[p] = bd.matmul_peak(c.device, PRECISIONS[p], 3, n)
    info["measured_gemm_tflops"] = {p: round(v / 1e3, 3) for p, v in c.peaks.items()}
    return info


def tests(c: Check) -> dict[str, Any]:
    xml = c.out / "tests.xml"
    files = ["tests/models/test_device_parity.py", "tests/training/test_precision.py",
             "tests/training/test_nonfinite.py"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *files,
           "-k", "device or fp16" if c.args.tiny else "device or fp16 or bf16"]
    result = c.subprocess(cmd, 240, {"CAPTIONING_TEST_DEVICE": c.args.device})
    cases = ET.parse(xml).getroot().iter("testcase") if xml.exists() else iter(())
    outcome: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
    for case in cases:
        kind = next((k for k in ("failure", "error", "skipped") if case.find(k) is not None), "passed")
        label = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        if kind == "skipped":
            label += f" ({case.find('skipped').get('message', '')})"  # type: ignore[union-attr]
        outcome["failed" if kind in ("failure", "error") else kind].append(label)
    if result["returncode"] != 0 or outcome["failed"] or not outcome["passed"]:
        raise RuntimeError(f"pytest ended with status {result['returncode']}, failed: {outcome['failed']}: "
                           f"{result['output_tail']}")
    return {**result, "counts": {k: len(v) for k, v in outcome.items()}, "skipped": outcome["skipped"]}


def bench(c: Check) -> dict[str, Any]:
    D, repeats = bd.SIZES["resnet"], 2 if c.args.tiny else 5
    sheet = c.report.get("environment", {}).get("datasheet_tflops") or {}
    rows = []
    for p in c.precisions():
        with tf32(p == "tf32"):
            dtype = PRECISIONS[p]
            parts = {f"train B={B}": bd.bench_training(D, c.device, dtype, repeats,
                                                       bd.target_lengths("coco", 0, 20, count=B))
                     for B in ((4, 8) if c.args.tiny else (32, 128))}
            parts.update(bd.bench_decoding(D, c.device, dtype, 8 if c.args.tiny else 50, repeats, (3, 5)))
        for part, r in parts.items():
            gflop = r.get("real_gflop_s", r["gflop_s"])
            rows.append({"precision": p, "part": part, "ms": round(r["ms"], 2), "per_s": round(r["per_s"], 1),
                         "real_tokens_s": round(r["tokens_s"]) if "tokens_s" in r else None,
                         "tflop_s": round(gflop / 1e3, 3),
                         "share_of_measured_peak": round(gflop / c.peaks[p], 4) if p in c.peaks else None,
                         "share_of_datasheet_peak": round(gflop / 1e3 / sheet[p], 4) if p in sheet else None})
    return {"sizes": {"L": bd.L, "D": D, "E=H=A": bd.M, "V": bd.V}, "rows": rows}


def compiled(c: Check) -> dict[str, Any]:
    D, images, steps = bd.SIZES["resnet"], 4 if c.args.tiny else 50, bd.STEPS
    backend = "eager" if c.args.tiny else "inductor"
    a = torch.randn(images, bd.L, D, generator=torch.Generator().manual_seed(2)).relu().to(c.device)
    dec = bd.build(D, c.device).eval()

    def decode() -> tuple[list[list[int]], list[list[int]]]:
        with torch.no_grad():
            return greedy_decode(dec, a, steps).tokens, beam_search(dec, a, 3, steps).tokens

    plain_captions, plain_s = decode(), bd.timed(decode, c.device, 3)[0]
    dec.step = CompiledStep(dec.step, backend)  # type: ignore[method-assign]
    start = time.perf_counter()
    compiled_captions = decode()
    bd.sync(c.device)
    decode_compile_s = time.perf_counter() - start
    compiled_s = bd.timed(decode, c.device, 3)[0]
    train = bd.build(D, c.device).train()
    feats, captions = bd.training_batch(D, c.device, bd.target_lengths("coco", 0, 20, count=8 if c.args.tiny else 32))

    def step(model: Callable[..., Any]) -> Callable[[], None]:
        return lambda: model(feats, captions).logits.float().sum().backward()

    plain_train = bd.timed(step(train), c.device, 3)[0]
    train_compiled = torch.compile(train, backend=backend)
    start = time.perf_counter()
    step(train_compiled)()
    bd.sync(c.device)
    train_compile_s = time.perf_counter() - start
    compiled_train = bd.timed(step(train_compiled), c.device, 3)[0]
    return {"backend": backend, "decode_failed_to_compile": dec.step.failed,
            "captions_identical": compiled_captions == plain_captions,
            "decode_compile_s": round(decode_compile_s, 1), "decode_speedup": round(plain_s / compiled_s, 3),
            "train_compile_s": round(train_compile_s, 1), "train_speedup": round(plain_train / compiled_train, 3)}


def shapes(c: Check) -> dict[str, Any]:
    result = c.subprocess([sys.executable, "-m", "captioning.train", *c.train_overrides("shapes_run")], 300)
    metrics_file = c.out / "shapes_run" / "metrics.json"
    if result["returncode"] != 0 or not metrics_file.exists():
        raise RuntimeError(f"captioning.train ended with status {result['returncode']}: {result['output_tail']}")
    m = json.loads(metrics_file.read_text())
    keep = ("Bleu_4", "METEOR", "CIDEr", "attention_correctness", "epochs", "best_epoch", "train_seconds")
    return {"wall_s": result["wall_s"], "metrics": {k: m.get(k) for k in keep}}


def torchrun(c: Check) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m",
           "captioning.train", *c.train_overrides("torchrun_run"), "trainer.max_epochs=1"]
    result = c.subprocess(cmd, 180)
    if result["returncode"] != 0:
        raise RuntimeError(f"torchrun ended with status {result['returncode']}: {result['output_tail']}")
    return {"wall_s": result["wall_s"], "backend": "cpu:gloo,cuda:nccl" if c.device.type == "cuda" else "gloo",
            "checkpoint": (c.out / "torchrun_run" / "checkpoints" / "last.pt").exists()}


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# GPU check: {report.get('environment', {}).get('card', report['device'])}", "",
             f"torch {torch.__version__}, CUDA {torch.version.cuda}, budget {report['budget_s']} s"
             + (" (tiny sizes: a dry run)" if report["tiny"] else ""), "", "| section | status | seconds |",
             "|---|---|---|"]
    lines += [f"| {k} | {v['status']} | {v.get('seconds', '')} |" for k, v in report.items() if isinstance(v, dict)
              and "status" in v]
    rows = report.get("bench", {}).get("rows", [])
    if rows:
        lines += ["", "| precision | part | ms | per s | real tokens / s | TFLOP/s | of measured peak | of datasheet |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['precision']} | {r['part']} | {r['ms']} | {r['per_s']} | {r['real_tokens_s'] or ''} | "
                  f"{r['tflop_s']} | {r['share_of_measured_peak']} | {r['share_of_datasheet_peak'] or ''} |"
                  for r in rows]
    for name in ("environment", "tests", "shapes", "torchrun", "compile"):
        part = {k: v for k, v in report.get(name, {}).items() if k not in ("traceback", "output_tail")}
        lines += ["", f"## {name}", "", "```json", json.dumps(part, indent=1)[:4000], "```"]
    return "\n".join(lines) + "\n"


# torch.compile last: inductor may compile for minutes, and the budget then cuts it, not the others.
SECTIONS: dict[str, Callable[[Check], dict[str, Any]]] = {
    "environment": environment, "tests": tests, "bench": bench, "shapes": shapes, "torchrun": torchrun,
    "compile": compiled}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default="gpu_report")
    p.add_argument("--budget", type=float, default=480.0, help="seconds for all sections together")
    p.add_argument("--tiny", action="store_true", help="tiny sizes (the CPU dry run)")
    p.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections to run")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu_check: --device {args.device}, but this PyTorch sees no CUDA device; the dry run is "
              "--device cpu --tiny", file=sys.stderr)
        return 2
    if args.tiny:
        for key, value in TINY.items():
            setattr(bd, key, value)
    check = Check(args)
    check.out.mkdir(parents=True, exist_ok=True)
    for name in args.only.split(","):
        if name not in SECTIONS:
            p.error(f"--only: unknown section {name!r}; choose from {', '.join(SECTIONS)}")
        check.run(name, SECTIONS[name])
    (check.out / "report.json").write_text(json.dumps(check.report, indent=1))
    (check.out / "report.md").write_text(markdown(check.report))
    print(f"wrote {check.out / 'report.md'} and report.json")
    return 1 if any(v.get("status") == "failed" for v in check.report.values() if isinstance(v, dict)) else 0


if __name__ == "__main__":
    sys.exit(main())
