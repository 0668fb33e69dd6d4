"""What the README promises a newcomer, held against the code: where data goes, and one set of figures for the
default run (the results table and the self-critical table's cross-entropy row are the same run)."""

from __future__ import annotations

import re
from pathlib import Path

from hydra import compose, initialize_config_dir

from captioning.runtime import CONF_DIR

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def table_after(heading: str) -> list[list[str]]:
    """The rows (cells stripped) of the first Markdown table after `heading`, header row first."""
    start = README.index(heading)
    lines = README[start:].splitlines()
    first = next(k for k, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        if not re.fullmatch(r"\|(\s*-+\s*\|)+", line):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_data_folder_setting_is_the_one_the_readme_quotes(monkeypatch):
    line = next(ln for ln in (CONF_DIR / "train.yaml").read_text().splitlines() if ln.startswith("data_dir:"))
    assert f"`{line.split('#')[0].strip()}`" in README
    monkeypatch.setenv("CAPTIONING_DATA_DIR", "/big/disk/data")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train")
        assert cfg.data_dir == "/big/disk/data" and cfg.dataset.root == "/big/disk/data/shapes"
        monkeypatch.delenv("CAPTIONING_DATA_DIR")
        assert compose("train").dataset.root == "data/shapes"  # relative to the folder the command starts in


def test_the_default_runs_scores_are_the_same_wherever_the_readme_gives_them():
    results = dict(zip(*table_after("## Results of the default run")[:2], strict=True))
    header, *rows = table_after("## Self-critical training")
    xe = dict(zip(header, next(r for r in rows if r[0].startswith("cross-entropy (default run)")), strict=True))
    for metric in ("BLEU-4", "METEOR", "ROUGE-L", "CIDEr"):
        assert xe[metric] == results[metric], metric
    distinct = re.search(r"(\d+) distinct captions for the 250\s+test images", README)
    assert distinct and xe["distinct captions"] == f"{distinct.group(1)} of 250"


def test_the_shapes_only_model_is_said_before_the_first_photo_is_captioned():
    first_photo = README.index('"photo.jpg"')
    assert "knows only `shapes`" in README[:first_photo] and "[Train on COCO](#train-on-coco)" in README[:first_photo]
