"""captioning-score is a text-only job: run as a fresh process it never imports torch, matplotlib or Hydra.

Each test starts a new interpreter (the test process itself has torch loaded by conftest), runs the real
command there and reads back what it printed and which heavy packages ended up in `sys.modules`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import needs_java
from synthetic_text import realistic_corpus

from captioning.tools.score import score_files

pytestmark = pytest.mark.integration  # every test here starts a subprocess

# Packages scoring text does not need; nltk and pycocotools are not needed either (pycocoevalcap is).
HEAVY = ("torch", "torchvision", "matplotlib", "hydra", "omegaconf", "nltk", "pycocotools")
METRICS = "bleu,rouge,cider"

# Runs captioning-score's main() in a fresh interpreter; prints its exit status, its JSON and the heavy modules.
SCRIPT = """
import contextlib, io, json, sys
from captioning.tools.score import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    status = main(sys.argv[1:])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in set(HEAVY))
print(json.dumps({"status": status, "summary": json.loads(out.getvalue()), "heavy": heavy}))
""".replace("set(HEAVY)", repr(set(HEAVY)))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A small COCO annotation file (30 images x 5 references) and a results file for it."""
    folder = tmp_path_factory.mktemp("score_imports")
    candidates, references = realistic_corpus(30, seed=3, refs_per_image=5)
    anns = [{"image_id": i, "id": 10 * i + k, "caption": c} for i, cs in references.items() for k, c in enumerate(cs)]
    (folder / "captions.json").write_text(json.dumps({"images": [{"id": i} for i in references], "annotations": anns}))
    (folder / "results.json").write_text(json.dumps([{"image_id": i, "caption": c} for i, c in candidates.items()]))
    return folder / "captions.json", folder / "results.json"


def _args(files: tuple[Path, Path], tokenizer: str) -> list[str]:
    return ["--annotations", str(files[0]), "--results", str(files[1]), "--metrics", METRICS, "--tokenizer", tokenizer]


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("tokenizer", ["python", pytest.param("ptb-java", marks=needs_java)])
def test_score_command_imports_no_torch_and_gives_the_in_process_scores(files, tokenizer):
    out = json.loads(_run([sys.executable, "-c", SCRIPT, *_args(files, tokenizer)]))
    assert out["status"] == 0
    assert out["heavy"] == [], f"captioning-score imported {sorted({m.split('.')[0] for m in out['heavy']})}"
    expected = score_files(files[0], files[1], METRICS.split(","), tokenizer)
    assert out["summary"] == expected  # == on every float: the same numbers as the in-process path
    assert out["summary"]["tokenizer"] == tokenizer and out["summary"]["num_images"] == 30


def test_installed_console_script_gives_the_in_process_scores(files):
    script = Path(sys.executable).parent / "captioning-score"
    if not script.is_file():
        pytest.skip(f"no console script next to {sys.executable} (package not installed in this environment)")
    out = json.loads(_run([str(script), *_args(files, "python")]))
    assert out == score_files(files[0], files[1], METRICS.split(","), "python")


LAZY = """
import sys
import captioning.data, captioning.base.jsonio, captioning.metrics
assert not any(m.split(".")[0] in {"torch", "pycocotools", "nltk"} for m in sys.modules), "eager import"
from captioning.metrics import CiderD, score_captions, ptb_tokenize, bleu
assert "captioning.metrics.coco_attention" not in sys.modules and "captioning.metrics.attention" not in sys.modules
assert "CocoInstances" in dir(captioning.metrics) and "CocoInstances" in captioning.metrics.__all__
from captioning.metrics import attention_correctness, CocoInstances
assert "captioning.metrics.coco_attention" in sys.modules
from captioning.metrics import coco  # submodules still import as before
try:
    captioning.metrics.no_such_name
except AttributeError as err:
    assert "no_such_name" in str(err)
else:
    raise AssertionError("missing attribute did not raise")
print("ok")
"""


def test_metrics_names_load_lazily_and_old_imports_still_work():
    assert _run([sys.executable, "-c", LAZY]).strip() == "ok"


@needs_java
def test_default_metrics_with_meteor_import_no_torch_either(files):
    """The command's default metric set adds METEOR (pycocoevalcap's jar): still a text-only process."""
    out = json.loads(_run([sys.executable, "-c", SCRIPT, "--annotations", str(files[0]), "--results", str(files[1])]))
    assert out["status"] == 0 and out["heavy"] == []
    assert 0.0 < out["summary"]["METEOR"] < 1.0 and out["summary"]["tokenizer"] == "ptb-java"
