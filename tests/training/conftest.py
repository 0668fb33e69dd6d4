"""Fixtures the training tests share; a module opts in with `pytestmark = pytest.mark.usefixtures(...)`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixtures import BIN


@pytest.fixture
def quick_scoring(monkeypatch):
    """Python tokenizer (no JVM per score) and no training-curve figure, in this process."""
    monkeypatch.setenv("PATH", BIN)
    monkeypatch.setattr("captioning.training.run_state.plot_history", lambda *a, **k: None)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread, as in the killed subprocesses of test_resume.py (OMP_NUM_THREADS=1): the thread count
    changes the order of float sums, so runs are only comparable bit for bit at the same count (and these tiny
    models run faster without thread hand-offs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """A module's folder for the `shapes` set its runs generate (the first run writes it)."""
    return tmp_path_factory.mktemp("shapes")
