"""`python -m captioning.tools.shapes`: the synthetic data set generated from the command line, with
build_shapes' own options."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from captioning.tools.shapes import main


def test_cli(tmp_path: Path) -> None:
    path = main(["--root", str(tmp_path), "--num-train", "3", "--num-val", "1", "--num-test", "1",
                 "--image-size", "64", "--seed", "2"])
    data = json.loads(path.read_text())
    assert len(data["images"]) == 5 and data["images"][0]["width"] == 64
    assert Image.open(tmp_path / "images" / "test_00000.png").size == (64, 64)
