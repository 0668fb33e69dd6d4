"""Prepare a data set's captions ahead of time, or write a data set as a Karpathy split file.

    captioning-prepare dataset=coco dataset.annotations=data/coco/dataset_coco.json dataset.image_root=data/coco
    captioning-prepare dataset=coco dataset/reader=table dataset.annotations=photos/captions.csv \
        dataset.image_root=photos --to-karpathy photos/dataset_photos.json

The first reads, checks and tokenises the annotation files once and stores the captions under dataset.prepared
(captioning/data/prepared/store.py), where every later run with the same settings opens them in a moment: prepare on a
cluster's login node, then launch the sweep. The second writes the data set's splits as a Karpathy file, which
captioning-score, captioning-html and the karpathy reader take. Overrides are captioning-train's dataset settings.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from captioning.cli import ArgumentParser, run_cli, writable_dir, writable_file
from captioning.config.overrides import check_overrides
from captioning.data.readers.records import SPLITS
from captioning.runtime import CONF_DIR

logger = logging.getLogger(__name__)
PROG = "captioning-prepare"
EPILOG = """examples:
  captioning-prepare dataset=coco dataset.annotations=data/coco/dataset_coco.json dataset.image_root=data/coco
  captioning-prepare dataset=coco dataset.prepared=/scratch/prepared ...   (where the prepared captions go)
  captioning-prepare dataset=coco dataset/reader=table dataset.annotations=photos/captions.csv \\
      dataset.image_root=photos --to-karpathy photos/dataset_photos.json"""


def compose_dataset(overrides: list[str]) -> DictConfig:
    """captioning-train's config with the overrides (checked), without starting a Hydra run (no output folder)."""
    check_overrides(overrides, CONF_DIR, "train")  # a misspelt name first, before the full check loads the models
    from captioning.config import validate_train_config

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    validate_train_config(cfg)
    return cfg


def prepare(dataset_cfg: DictConfig) -> dict[str, Any]:
    """Build (or find) the prepared captions of a data set; returns what they hold."""
    from captioning.factory.datasets import load_table

    if not dataset_cfg.get("prepared"):
        raise ValueError("dataset.prepared is null: set dataset.prepared=FOLDER, where the prepared captions go")
    writable_dir(dataset_cfg.prepared)
    table = load_table(dataset_cfg)
    assert table is not None
    vocab = table.vocabulary(dataset_cfg.min_word_freq, dataset_cfg.get("max_vocab"))
    return {"prepared": str(table.folder or dataset_cfg.prepared), "words": len(table.words),
            "vocabulary": len(vocab), "splits": {s: {"images": len(a), "captions": len(a.caption_offsets) - 1}
                                                  for s, a in table.splits.items()}}


def to_karpathy(dataset_cfg: DictConfig, out: Path) -> dict[str, Any]:
    """Write every split of a data set as a Karpathy split file at `out`; returns what it holds."""
    from captioning.data.readers.convert import write_karpathy
    from captioning.factory.datasets import load_records

    writable_file(out)
    records = load_records(dataset_cfg, SPLITS)
    reader = dataset_cfg.get("reader") or {}
    root = reader.get("image_root") or dataset_cfg.get("image_root") or Path(dataset_cfg.annotations).parent
    write_karpathy(records, root, out)
    return {"karpathy_file": str(out), "image_root": str(root),
            "splits": {s: {"images": len(rs), "captions": sum(len(r.captions) for r in rs)}
                       for s, rs in records.items()}}


def main(argv: list[str] | None = None) -> None:
    """Console entry point `captioning-prepare [dataset overrides] [--to-karpathy OUT.json]`."""
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0], epilog=EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="captioning-train overrides: dataset=..., dataset.*=...")
    parser.add_argument("--to-karpathy", metavar="OUT.json", type=Path,
                        help="write the data set's splits as a Karpathy split file instead of preparing captions")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S")
    cfg = run_cli(lambda: compose_dataset(list(args.overrides)), PROG)
    dataset = cfg.dataset
    summary = run_cli(lambda: to_karpathy(dataset, args.to_karpathy) if args.to_karpathy else prepare(dataset), PROG)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
