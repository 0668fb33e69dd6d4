"""The README's set-up command says which torch build it installs before pip starts (a dry run: nothing installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU = "https://download.pytorch.org/whl/cpu"

pytestmark = [pytest.mark.integration,  # a subprocess
              pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")]


def dry_run(tmp_path: Path, *args: str) -> list[str]:
    """The commands `make -n` would run for a fresh virtual environment in tmp_path."""
    proc = subprocess.run(["make", "-n", *args, f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


@pytest.mark.parametrize("index, source", [(CPU, f"from {CPU};"), ("", "from pip's configured index")])
def test_the_torch_build_is_named_before_pip_starts(tmp_path, index, source):
    lines = dry_run(tmp_path, "train", f"TORCH_INDEX={index}")
    note = next(k for k, line in enumerate(lines) if line.startswith('echo "captioning: installing torch'))
    first_pip = next(k for k, line in enumerate(lines) if "pip install" in line)
    assert note < first_pip
    assert source in lines[note] and f"make train TORCH_INDEX={CPU}" in lines[note]
    if index:
        assert f"--index-url {index}" in lines[first_pip]
    else:
        assert "--index-url" not in "\n".join(lines)
