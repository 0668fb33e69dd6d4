"""Hydra callbacks of the console commands (conf/*.yaml `hydra.callbacks`).

`ReplacePlantedLinks`: Hydra writes `<run dir>/.hydra/{config,hydra,overrides}.yaml` with a plain open(), which
follows a symlink planted there (in a run folder someone else shared, say, where captioning-evaluate writes
`<run>/eval/...` by default) and would overwrite its target. Before Hydra writes them, such links (and a `.hydra`
that is itself a link) are removed, so Hydra makes new files in their place, as the project's own writes replace a
link (captioning/base/files.py). A single run only: a sweep's job folders are made after its callbacks' start hook.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

logger = logging.getLogger(__name__)
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")


def replace_planted_links(run_dir: Path, subdir: str = ".hydra") -> list[Path]:
    """Remove the symlinks at `run_dir/subdir` and at Hydra's files in it; returns the links removed."""
    hydra_dir = run_dir / subdir
    candidates = [hydra_dir] if hydra_dir.is_symlink() else [hydra_dir / name for name in HYDRA_FILES]
    removed = [p for p in candidates if p.is_symlink()]
    for link in removed:
        link.unlink()
        logger.warning("replaced the symbolic link %s: Hydra writes its own file there", link)
    return removed


class ReplacePlantedLinks(Callback):
    """Before a single run's Hydra files are written, remove symlinks planted where they go (module docstring)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        subdir = config.hydra.output_subdir
        if subdir is not None:
            replace_planted_links(Path(str(config.hydra.run.dir)), str(subdir))
