"""Shared pytest fixtures: a tiny captioner, a tiny generated `shapes` data set and a tiny trained run (plain
helpers: fixtures.py)."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fixtures import TINY_MODEL, compose_tiny_train

from captioning.data.shapes.generate import build_shapes
from captioning.factory.models import build_captioner
from captioning.models.captioner import Captioner
from captioning.train import train

# One intra-op thread, as the subprocesses the tests start get (OMP_NUM_THREADS=1): the tests' tensors are small, so a
# second thread gains little alone, and where another process shares the CPU it costs much (PyTorch's threads wait for
# each other at every op): two runs at once of tests/models/test_fast_path.py and test_luong_decoder.py on a 2-core
# machine took 90 s each with two threads per process, 40 s with one.
torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def no_jvm_in_process(pytestconfig: pytest.Config) -> Iterator[None]:
    """A run of the in-process tier only (`make test-fast`: -m "... not integration") starts no Java process: there
    `tokenizer="auto"` (the scoring of every training and evaluation) finds no Java and tokenizes with the
    pure-Python PTB tokenizer, token for token Java's (tests/metrics), instead of a JVM per scoring (0.3-1 s each,
    about 140 of them). The tests that need Java (`needs_java`) are in the integration tier; a run with that tier
    (`make test`) sees Java as it is."""
    if not re.search(r"\bnot\s+integration\b", pytestconfig.getoption("markexpr") or ""):
        yield
        return
    which = shutil.which
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shutil, "which", lambda name, *a, **k: None if name == "java" else which(name, *a, **k))
        yield


@pytest.fixture
def tiny_model() -> Captioner:
    """A small captioner over a 12-word vocabulary (8x8 grid for 32 px images)."""
    torch.manual_seed(0)
    return build_captioner(TINY_MODEL, vocab_size=12)


SHARED_SHAPES: dict[Path, bytes] = {}  # the shared set's meta.json as made, to check no test regenerates it


@pytest.fixture(scope="session")
def shapes_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small shapes data set shared by the tests that need real files (tiny_overrides' settings)."""
    root = tmp_path_factory.mktemp("shapes")
    path = build_shapes(root, seed=1, num_train=48, num_val=12, num_test=12, image_size=32, object_scale=1.0)
    SHARED_SHAPES[root / "meta.json"] = (root / "meta.json").read_bytes()
    return path


@pytest.fixture(autouse=True)
def shared_shapes_kept() -> Iterator[None]:
    """A test that runs on the shared set with other generation settings regenerates it under the tests after it
    (and under a parallel sweep's jobs): it fails here, instead of them."""
    yield
    for meta, made in SHARED_SHAPES.items():
        assert meta.read_bytes() == made, f"this test regenerated the shared shapes set {meta.parent} with other " \
            "settings: give it its own dataset.root, or tiny_overrides' generation settings"


@pytest.fixture(scope="session")
def trained_run(shapes_json: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model trained for 4 epochs on the `shapes_json` set (about 10 s): its run folder, with
    checkpoints/best.pt and metrics.json (test split, beam 3, BLEU / ROUGE-L / CIDEr)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    train(compose_tiny_train(shapes_json, "trainer.max_epochs=4", "eval.num_figures=0",
                             "eval.metrics=[bleu,rouge,cider]"), out)
    return out


CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
INSTALL = "apt-get install -y chromium chromium-driver"


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium driven by selenium through /usr/bin/chromedriver (skipped when not installed)."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip(f"chromium / chromedriver not installed (Debian: `{INSTALL}`)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium not installed: pip install -e '.[dev]'")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
