"""Generate the built-in synthetic `shapes` data set into a folder (training generates it on first use by itself).

    python -m captioning.tools.shapes --root data/shapes [--num-train 4000 ...]

The options are build_shapes' own arguments, with its defaults (= conf/dataset/shapes.yaml's).
"""

from __future__ import annotations

import argparse
import inspect
import logging
from collections.abc import Sequence
from pathlib import Path

from captioning.data.shapes.generate import build_shapes

logger = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> Path:
    """Command-line entry point: ``python -m captioning.tools.shapes --root DIR``."""
    parser = argparse.ArgumentParser(description="Generate the synthetic 'shapes' captioning data set.")
    parser.add_argument("--root", required=True, help="output directory")
    defaults = {k: p.default for k, p in inspect.signature(build_shapes).parameters.items()
                if k not in ("root", "writable")}
    for name, default in defaults.items():  # build_shapes' own defaults (= conf/dataset/shapes.yaml's)
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path = build_shapes(args.root, **{name: getattr(args, name) for name in defaults})
    logger.info("shapes data set ready: %s", path)
    return path


if __name__ == "__main__":
    main()
