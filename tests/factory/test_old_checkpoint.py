"""A checkpoint written before components had names loads, and captions as the code that wrote it did.

tests/assets/checkpoint_before_names/ (see its README.md): a tiny model trained at commit 1b42c34, whose stored
config names components by import path, with four `shapes` test images and the captions, log-probabilities and
attention maps that commit gave them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import captioning
from captioning.checkpoint import read_checkpoint
from captioning.factory.load import load_model

ASSETS = Path(__file__).parents[1] / "assets" / "checkpoint_before_names"
EXPECTED = json.loads((ASSETS / "expected.json").read_text())


def test_the_fixture_names_components_by_import_path():
    stored = read_checkpoint(ASSETS / "checkpoint.pt")["config"]
    assert stored["model"]["decoder"]["_target_"] == "captioning.models.decoder.ShowAttendTellDecoder"
    assert stored["model"]["attention"]["_target_"] == "captioning.models.attention.SoftAttention"
    assert stored["dataset"]["generate"]["_target_"] == "captioning.data.shapes.build_shapes"


def test_it_loads_with_its_targets_renamed():
    model, vocab, ckpt = load_model(ASSETS / "checkpoint.pt")
    config = ckpt["config"]
    assert [config["model"][g]["_target_"] for g in ("encoder", "attention", "decoder")] == ["small_cnn", "soft", "sat"]
    assert config["dataset"]["generate"]["_target_"] == "shapes" and config["objective"]["_target_"] == "xe"
    assert type(model.decoder).__name__ == "ShowAttendTellDecoder" and len(vocab) == model.decoder.vocab_size


@pytest.mark.parametrize("beam", [1, 3])
def test_it_captions_as_the_code_that_wrote_it(beam):
    model = captioning.load(ASSETS / "checkpoint.pt")
    images = sorted(str(p) for p in ASSETS.glob("*.png"))
    results = model.caption(images, beam_size=beam, suppress_unk=False)  # that code let <unk> through
    want = EXPECTED[f"beam_{beam}"]
    assert [r.caption for r in model.caption(images, beam_size=beam)] == [w["caption"] for w in want]  # no <unk> here
    assert [Path(r.source).name for r in results] == [w["image"] for w in want]
    for r, w in zip(results, want):
        assert r.caption == w["caption"]
        assert r.log_prob == pytest.approx(w["log_prob"], abs=1e-4)
        assert float(r.attention.sum()) == pytest.approx(w["attention_sum"], abs=1e-3)
        first_cell = r.attention.reshape(len(r.words), -1)[:, 0]
        np.testing.assert_allclose(first_cell, w["attention_00"], atol=1e-5)
