"""The lock on Windows, exercised on Linux: tests/base/test_lock.py in a child pytest whose processes (the child and
the lock holders it starts) cannot import fcntl, have no os.pread/pwrite/O_NOFOLLOW, and get an `msvcrt.locking`
that keeps Windows' rules over flock (tests/base/windows/sitecustomize.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.integration
def test_the_lock_tests_pass_without_fcntl(tmp_path: Path) -> None:
    env = {**os.environ, "CAPTIONING_TEST_LOCK_WITHOUT_FCNTL": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE / "windows"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    probe = subprocess.run([sys.executable, "-c", "import os, sys; import captioning.base.lock as m; "
                            "print(m._fcntl, m._msvcrt.__name__, hasattr(os, 'pread'), 'fcntl' in sys.modules and "
                            "sys.modules['fcntl'] is not None)"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert probe.stdout.split() == ["None", "msvcrt", "False", "False"], probe.stderr
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                             str(HERE / "test_lock.py"), f"--basetemp={tmp_path / 'base'}"],
                            env=env, capture_output=True, text=True, timeout=300, cwd=HERE.parents[1])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "7 passed" in result.stdout, result.stdout[-2000:]
