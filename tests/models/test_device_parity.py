"""Every decoder with every attention it takes computes on the GPU what the CPU computes: the logits, the maps,
every parameter's gradient, and the greedy and beam-3 captions (float64, so that the comparison is of the code
paths, not of rounding). The reference is the CPU with `plain_kernels` (the formulas a GPU runs), the device run
uses whatever the device runs.

The device is CAPTIONING_TEST_DEVICE, else CUDA where there is one; without either the module is skipped (CI has no
GPU). `experiments/gpu_check.py` runs it on the lent GPU, and its CPU dry run with CAPTIONING_TEST_DEVICE=cpu (the
fused CPU kernels against the plain ones), so the test runs in the suite too."""

from __future__ import annotations

import os

import pytest
import torch
from family import GRID, INDEXES, PAIRS, build, data, run

from captioning.models.decoding import beam_search, greedy_decode
from captioning.models.fused import plain_kernels

DEVICE = os.environ.get("CAPTIONING_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else None)
pytestmark = pytest.mark.skipif(DEVICE is None, reason="needs a GPU (or CAPTIONING_TEST_DEVICE=cpu: the dry run)")


def _on(device: str, kind: str, attention: str):
    """The seeded model in float64 on `device`, in eval mode (hard attention's expectation, no sampling noise:
    the devices' random streams differ)."""
    return build(kind, attention).double().to(device).eval()


@pytest.mark.parametrize("kind,attention", PAIRS)
def test_the_device_computes_what_the_cpu_computes(kind, attention):
    a, mask, captions = data()
    index = INDEXES["k=2"]
    cpu = _on("cpu", kind, attention)
    with plain_kernels(cpu):
        ref, ref_grads = run(cpu, cpu.forward, a, captions, index, mask)
    dev = _on(DEVICE, kind, attention)
    out, grads = run(dev, dev.forward, a.to(DEVICE), captions.to(DEVICE), index.to(DEVICE), mask.to(DEVICE))
    torch.testing.assert_close(out.logits.cpu(), ref.logits, atol=1e-9, rtol=1e-7)
    torch.testing.assert_close(out.alphas.cpu(), ref.alphas, atol=1e-9, rtol=1e-7)
    assert grads.keys() == ref_grads.keys()
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name].cpu(), grad, atol=1e-9, rtol=1e-7, msg=name)
    with torch.no_grad(), plain_kernels(cpu):
        for decode in (lambda m, x, k: greedy_decode(m, x, 8, mask=k, grid=GRID),
                       lambda m, x, k: beam_search(m, x, 3, 8, mask=k, grid=GRID)):
            want = decode(cpu, a, mask)
            got = decode(dev, a.to(DEVICE), mask.to(DEVICE))
            assert got.tokens == want.tokens
            for m_got, m_want in zip(got.alphas, want.alphas):
                torch.testing.assert_close(m_got.cpu(), m_want, atol=1e-9, rtol=1e-7)
