"""The export runner needs no torch: in a fresh interpreter where importing torch fails, it captions shapes images
(library call and `captioning-run-export`, captioning/tools/run_export.py) with the PyTorch model's captions.

The test process itself has torch loaded (conftest), so each check starts a new interpreter whose first act is to
put a finder on sys.meta_path that refuses torch and torchvision, then reports which heavy packages got imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import TINY_MODEL

from captioning.data.images import load_image
from captioning.data.readers.karpathy import read_karpathy_splits
from captioning.data.vocab import Vocabulary
from captioning.export.exporter import export_model
from captioning.factory.models import build_captioner

pytestmark = pytest.mark.integration  # every test here starts a subprocess

BLOCK = """
import json, sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchvision"):
            raise ImportError(f"torch is blocked in this test: import {name}")
        return None
sys.meta_path.insert(0, NoTorch())
HEAVY = ("torch", "torchvision", "hydra", "omegaconf", "matplotlib", "nltk")
def heavy():
    return sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in HEAVY})
"""

CAPTION = BLOCK + """
from captioning.export.runner import Runner
folder, beam, *paths = sys.argv[1:]
captions = Runner(folder, threads=1).caption(paths, beam_size=int(beam))
print(json.dumps({"tokens": [c.tokens for c in captions], "log_probs": [c.log_prob for c in captions],
                  "words": [c.words for c in captions], "heavy": heavy()}))
"""

COMMAND = BLOCK + """
import runpy
sys.argv = ["runner", *sys.argv[1:]]
try:
    runpy.run_module("captioning.tools.run_export", run_name="__main__")
finally:
    print("HEAVY", json.dumps(heavy()), file=sys.stderr)
"""


@pytest.fixture(scope="module")
def export(shapes_json, tmp_path_factory):
    """A tiny random model over the shapes vocabulary, exported to ONNX, and the set's 12 test images."""
    splits = read_karpathy_splits(["train", "test"], shapes_json, shapes_json.parent)
    vocab = Vocabulary.build([c for r in splits["train"] for c in r.captions])
    torch.manual_seed(0)
    model = build_captioner(TINY_MODEL, len(vocab)).eval()
    with torch.no_grad():  # larger decoder weights: words that depend more on the image
        for name, p in model.decoder.named_parameters():
            if "bias" not in name:
                p.mul_(3.0)
    out = tmp_path_factory.mktemp("no_torch")
    export_model(model, vocab, out, "onnx", image_size=32, optimize=False)
    return out, model, vocab, [r.path for r in splits["test"]]


def _python(script: str, *args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_the_blocker_really_blocks_torch():
    proc = _python(BLOCK + "import torch")
    assert proc.returncode != 0 and "torch is blocked" in proc.stderr


@pytest.mark.parametrize("beam", [1, 3])
def test_runner_captions_without_torch_as_the_pytorch_model(export, beam):
    folder, model, vocab, paths = export
    proc = _python(CAPTION, folder, beam, *paths)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["heavy"] == [], f"the runner imported {out['heavy']}"
    transform = model.encoder.transform()
    decoded, _ = model.generate(torch.stack([transform(load_image(p)) for p in paths]), beam, 20)
    assert out["tokens"] == decoded.tokens and len(out["tokens"]) == len(paths) == 12
    assert out["words"] == [vocab.decode(t) for t in decoded.tokens]
    np.testing.assert_allclose(out["log_probs"], decoded.scores.numpy(), rtol=1e-5, atol=1e-4)


def test_runner_command_without_torch_prints_a_caption_per_image(export):
    folder, _, vocab, paths = export
    proc = _python(COMMAND, folder, *paths[:4], "--beam-size", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == [str(p) for p in paths[:4]]
    assert all(set(line.split("\t")[1].split()) <= set(vocab.itos) for line in lines)
    assert proc.stderr.strip().splitlines()[-1] == "HEAVY []"
