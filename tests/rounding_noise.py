"""A pytest plugin that asks whether a test's decoding rests on one machine's float rounding.

    CAPTIONING_ROUNDING_NOISE=1e-6 pytest -p rounding_noise tests/models/test_decoding.py

Another CPU (other vector kernels, another summation order) computes logits that differ from these in their last
bits, and a caption compared across two computations (a batch against one image alone, the fused CPU kernels against
plain PyTorch, ONNX Runtime against PyTorch) is the same on every machine only if no decision along the way (argmax,
beam ranking, a sampled word) rests on a near-tie. With this plugin, greedy decoding, beam search and SCST sampling
see every logit moved by a relative amount of about CAPTIONING_ROUNDING_NOISE (1e-6 if unset; float32 rounding is
6e-8), drawn from the bits of the logit's row and the size of its batch. Bit-identical rows in batches of one size
(the same arithmetic) get the same noise, so exact comparisons of one computation still hold; rows that differ in
any bit, or come from batches of another size (whose matrix products another CPU may sum in another order, even
where this one does not), get independent noise, as if that rounding difference had been that large. A test that
passes with it compares decisions whose margins are far above any machine's rounding. tests/test_rounding.py runs
the decoding tests with it (slow tier).
"""

from __future__ import annotations

import os

import torch

import captioning.models.decoding as decoding
import captioning.training.scst.sampling as sampling

NOISE = float(os.environ.get("CAPTIONING_ROUNDING_NOISE", "1e-6"))
_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
_word_log_probs = decoding.word_log_probs


def row_noise(logits: torch.Tensor) -> torch.Tensor:
    """Standard normal noise (..., V), each row's drawn from a hash of that row's bits and of the number of rows."""
    x = logits.detach().to("cpu").contiguous()
    V = x.shape[-1]
    bits = x.view(_BITS[x.dtype]).to(torch.int64).view(-1, V)
    weights = torch.arange(1, V + 1, dtype=torch.int64) * 2654435761 % 4294967291
    seeds = ((bits * weights).sum(1) * (bits.shape[0] + 1) % 2147483647).tolist()  # the batch's size too
    rows = [torch.randn(V, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in seeds]
    return torch.stack(rows).view(x.shape) if rows else torch.zeros(x.shape, dtype=torch.float64)


def noisy_word_log_probs(logits: torch.Tensor, special: torch.Tensor) -> torch.Tensor:
    scale = logits.detach().abs().clamp_min(1.0)
    shift = (NOISE * scale * row_noise(logits).to(logits.device, logits.dtype)).nan_to_num(0.0, 0.0, 0.0)  # -inf: 0
    return _word_log_probs(logits + shift, special)


def across_computations(atol: float) -> float:
    """The tolerance for the scores of two computations whose logits may differ in their last bits (beams on shared
    rows against copied rows): `atol` itself, or, where this plugin is loaded and gives each of them its own noise of
    about NOISE per logit, 100 NOISE (a caption's score sums a few words' shifts; 3.4e-6 was the most seen at 1e-6).
    Their words are compared exactly either way."""
    return atol if decoding.word_log_probs is _word_log_probs else max(atol, 100 * NOISE)


def pytest_configure(config) -> None:
    """Loaded with `-p rounding_noise`: greedy_decode, beam_search and SCST's sampling look the function up at every
    step. (Importing this module changes nothing.)"""
    decoding.word_log_probs = sampling.word_log_probs = noisy_word_log_probs
