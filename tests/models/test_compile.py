"""eval.compile: decoding through a compiled decoder step gives the plain step's captions, and a compiler that fails
leaves decoding to the plain step with one warning (the real inductor backend compiles for minutes on a CPU, so the
tests use dynamo with its eager backend, which traces the step the same way)."""

from __future__ import annotations

import logging

import torch
from fixtures import TINY_MODEL

from captioning.factory.models import build_captioner
from captioning.models.captioner import CompiledStep, compile_decoding


def _model():
    torch.manual_seed(0)
    return build_captioner(TINY_MODEL, vocab_size=12).eval()


def test_compiled_decoding_gives_the_plain_captions():
    model, images = _model(), torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    plain = [model.generate(images, beam_size=k, max_len=6)[0] for k in (1, 3)]
    torch._dynamo.reset()
    compile_decoding(model, True, backend="eager")
    assert isinstance(model.decoder.step, CompiledStep)
    for k, expected in zip((1, 3), plain):
        got = model.generate(images, beam_size=k, max_len=6)[0]
        assert got.tokens == expected.tokens
        torch.testing.assert_close(got.scores, expected.scores)
    assert not model.decoder.step.failed
    assert set(model.state_dict()) == set(_model().state_dict())  # checkpoints are unchanged


def test_a_failing_compiler_falls_back_to_the_plain_step_with_one_warning(caplog):
    def broken(graph, example_inputs):
        raise RuntimeError("no C++ compiler found")

    model, images = _model(), torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    expected = model.generate(images, beam_size=2, max_len=5)[0]
    torch._dynamo.reset()
    compile_decoding(model, True, backend=broken)
    with caplog.at_level(logging.WARNING):
        got = model.generate(images, beam_size=2, max_len=5)[0]
        again = model.generate(images, beam_size=2, max_len=5)[0]
    assert got.tokens == expected.tokens == again.tokens
    warnings = [r for r in caplog.records if "torch.compile of the decoding step failed" in r.getMessage()]
    assert len(warnings) == 1 and "no C++ compiler found" in warnings[0].getMessage()
    assert model.decoder.step.failed


def test_compile_off_leaves_the_model_alone():
    model = _model()
    compile_decoding(model, False)
    assert not isinstance(model.decoder.step, CompiledStep)
