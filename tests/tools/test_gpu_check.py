"""experiments/gpu_check.py, the one script a lent GPU runs (issue 48), in its CPU dry run: every section runs at
tiny sizes and reports what it measured, so the script does not rot between GPU loans."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_the_gpu_check_dry_run_reports_every_section(tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, str(REPO / "experiments" / "gpu_check.py"), "--device", "cpu", "--tiny",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    sections = ("environment", "tests", "bench", "shapes", "torchrun", "compile")
    assert {name: report[name]["status"] for name in sections} == dict.fromkeys(sections, "ok")
    assert report["environment"]["measured_gemm_tflops"]["fp32"] > 0
    # the device parity tests ran (the CPU's fused kernels against the plain ones); the fp16 ones skip off CUDA
    assert report["tests"]["counts"]["passed"] >= 20 and report["tests"]["counts"]["failed"] == 0
    assert all("CUDA" in reason for reason in report["tests"]["skipped"])
    rows = {(r["precision"], r["part"]): r for r in report["bench"]["rows"]}
    assert {part for precision, part in rows if precision == "fp32"} == {"train B=4", "train B=8", "greedy",
                                                                          "beam 3", "beam 5"}
    assert all(r["ms"] > 0 and r["per_s"] > 0 for r in rows.values())
    assert rows[("fp32", "train B=8")]["real_tokens_s"] > 0
    assert report["compile"]["captions_identical"] is True and report["compile"]["backend"] == "eager"
    assert report["compile"]["decode_failed_to_compile"] is False
    metrics = report["shapes"]["metrics"]
    assert metrics["epochs"] >= 1 and 0 <= metrics["Bleu_4"] <= 1
    assert report["torchrun"]["checkpoint"] is True and report["torchrun"]["backend"] == "gloo"
    md = (out / "report.md").read_text()
    assert "| fp32 | train B=8 |" in md and "| compile | ok |" in md and "tiny sizes" in md


def test_the_gpu_check_refuses_cuda_without_a_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run([sys.executable, str(REPO / "experiments" / "gpu_check.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "sees no CUDA device; the dry run is --device cpu --tiny" in proc.stderr
