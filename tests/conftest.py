"""Shared pytest fixtures: a tiny captioner, a tiny generated `shapes` data set and a tiny trained run (plain
helpers: fixtures.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from fixtures import TINY_MODEL, compose_tiny_train

from captioning.data.shapes import build_shapes
from captioning.factory.models import build_captioner
from captioning.models.captioner import Captioner
from captioning.train import train


@pytest.fixture
def tiny_model() -> Captioner:
    """A small captioner over a 12-word vocabulary (8x8 grid for 32 px images)."""
    torch.manual_seed(0)
    return build_captioner(TINY_MODEL, vocab_size=12)


@pytest.fixture(scope="session")
def shapes_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small shapes data set shared by the tests that need real files."""
    root = tmp_path_factory.mktemp("shapes")
    return build_shapes(root, seed=1, num_train=48, num_val=12, num_test=12, image_size=32, object_scale=1.0)


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
