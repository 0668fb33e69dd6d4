"""No test's captions rest on one machine's float rounding: the in-process tests that decode, sample or compare
captions pass again with every logit moved by 1e-6 of itself wherever two computations differ in any bit
(tests/rounding_noise.py), about 16 float32 ulps, more than any CPU's kernels were seen to differ by."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rounding_noise import noisy_word_log_probs, row_noise

from captioning.models.decoding import special_ids, word_log_probs

ROOT = Path(__file__).resolve().parents[1]
# Where captions are decoded, sampled or compared: the models, the split decoder, the Python API, the export's
# ONNX Runtime search against PyTorch's, SCST and the commands.
DECODING = ["tests/models", "tests/evaluation", "tests/inference", "tests/export", "tests/training", "tests/tools"]


def test_the_noise_follows_each_rows_bits():
    torch.manual_seed(0)
    x = torch.randn(3, 9)
    x[2] = x[0]
    x[1] = x[0]
    x[1, 4] = x[0, 4].nextafter(torch.tensor(10.0))  # one ulp apart
    noise = row_noise(x)
    assert torch.equal(noise[0], noise[2]) and not torch.isclose(noise[0], noise[1]).any()
    assert not torch.isclose(row_noise(x[:1])[0], noise[0]).any()  # the same row in a batch of another size
    assert torch.equal(row_noise(x.double()[:1]), row_noise(x.double()[:1])) and noise.std() > 0.5
    special = special_ids(x.device)
    got, plain = noisy_word_log_probs(x, special), word_log_probs(x, special)
    assert torch.equal(got[0], got[2]) and torch.equal(got.isinf(), plain.isinf()) and got.isinf().any()
    shift = (got - plain)[~plain.isinf()]
    assert 0 < shift.abs().max() < 1e-4 and torch.isfinite(got[~plain.isinf()]).all()


@pytest.mark.slow
@pytest.mark.integration
def test_the_decoding_tests_hold_with_rounding_noise():
    env = {**os.environ, "CAPTIONING_ROUNDING_NOISE": "1e-6", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "rounding_noise",
                           "-m", "not slow and not integration", "-rf", *DECODING],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout.splitlines()[-1]
