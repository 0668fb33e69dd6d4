"""Encode every image once with a frozen encoder and cache the annotation grids on disk.

    captioning-extract-features experiment=coco_soft dataset.features=/data/coco/features_vgg19
    captioning-train experiment=coco_soft dataset.features=/data/coco/features_vgg19

An interrupted run continues where it stopped when started again with the same arguments. torch and the encoders
are imported when the extraction starts, so `--help` and a misspelt override answer at once.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from captioning.base.lock import FolderLock
from captioning.cli import no_unused_folder, run_cli, writable_dir
from captioning.config.help import bare_help
from captioning.config.overrides import check_overrides
from captioning.runtime import CONF_DIR

if TYPE_CHECKING:
    from captioning.features.cache import FeatureCache

logger = logging.getLogger(__name__)
PROG = "captioning-extract-features"


def extract(cfg: DictConfig) -> FeatureCache:
    """Build the encoder as training would (same seed), read the splits' images and write the cache."""
    from captioning.factory.datasets import load_records
    from captioning.factory.models import build_encoder
    from captioning.features.extract import extract_features
    from captioning.features.fingerprint import check_frozen
    from captioning.runtime import resolve_device, set_seed

    if not cfg.dataset.get("features"):
        raise ValueError("set dataset.features=PATH: the folder the feature cache is written to")
    writable_dir(cfg.dataset.features)  # a read-only cache folder fails before the encoder is built
    device = resolve_device(cfg.device)  # and so does a device this machine lacks
    set_seed(cfg.seed)  # a randomly initialised encoder then gets the same weights as in captioning-train
    encoder = build_encoder(cfg.encoder)  # first: missing pretrained weights are reported before any data is read
    check_frozen(encoder)
    encoder.to(device)
    records = load_records(cfg.dataset, list(cfg.splits))
    # one extraction writes into a cache folder at a time; one started meanwhile waits, then finds the cache filled
    with FolderLock(cfg.dataset.features, "feature extraction", wait=True):
        return extract_features([r for rs in records.values() for r in rs], encoder,
                                cast(dict[str, Any], OmegaConf.to_container(cfg.encoder, resolve=True)),
                                Path(cfg.dataset.features),
                                batch_size=int(cfg.batch_size), num_workers=int(cfg.dataset.num_workers),
                                overwrite=bool(cfg.overwrite), progress=bool(cfg.trainer.progress))


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="extract_features")
def hydra_main(cfg: DictConfig) -> None:
    """The Hydra app; a bad config or file is one `error:` line on stderr and exit status 2, and leaves no empty
    log folder."""
    with no_unused_folder(Path(HydraConfig.get().runtime.output_dir)):
        cache = run_cli(lambda: extract(cfg), PROG)
    logger.info("wrote %d images' features to %s", len(cache), cache.root)


def main() -> None:
    """Console entry point `captioning-extract-features [overrides] dataset.features=DIR`."""
    if (text := bare_help(sys.argv[1:], CONF_DIR, "extract_features")) is not None:  # Hydra's text, without composing
        print(text)
        return
    run_cli(lambda: check_overrides(sys.argv[1:], CONF_DIR, "extract_features"), PROG)  # typos, before Hydra
    hydra_main()


if __name__ == "__main__":
    main()
