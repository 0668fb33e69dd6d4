"""The demo notebook runs top to bottom (so it cannot rot)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.integration  # runs the notebook in a Jupyter kernel

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "demo.ipynb"


def test_demo_notebook_executes(tmp_path, monkeypatch):
    monkeypatch.delenv("CAPTIONING_CHECKPOINT", raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the attention figures were shown
    assert "CIDEr" in str(outputs[-1].get("data", {}).get("text/plain", ""))
