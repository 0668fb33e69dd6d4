"""The hand-fused CPU training kernels, kept out of the model files so that those read like the paper.

The model files write the paper's equations in plain PyTorch and call here where it applies, with one line saying
why; tests/models/test_decoders.py checks both give the same logits, losses and gradients.

- `unrolled.py`: recurrences unrolled over the teacher-forced steps (`UnrolledLSTM`, `UnrolledLinear`), run by the
  decoders' packed teacher forcing on every device;
- `additive.py`: the additive attention score on a CPU, chosen per model: `plain_kernels(model)` makes that model
  run its plain formula (what a GPU runs) on a CPU too, for the tests and for tracing an export;
- `dtypes.py`: the dtype the kernels compute in under autocast.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def plain_kernels(model: nn.Module) -> Iterator[None]:
    """Within the block, every module of `model` that can use a fused CPU kernel runs its plain formula instead (one
    chunk for the additive score, torch's tanh): what a GPU runs, on any device. Other models are untouched."""
    switched = [m for m in model.modules() if hasattr(m, "plain_kernels")]
    before = [m.plain_kernels for m in switched]
    for m in switched:
        setattr(m, "plain_kernels", True)  # noqa: B010 (a plain attribute, not a submodule)
    try:
        yield
    finally:
        for m, b in zip(switched, before):
            setattr(m, "plain_kernels", b)  # noqa: B010
