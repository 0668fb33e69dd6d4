"""Feature cache: a frozen encoder's annotation grids of every image, computed once and stored on disk.

A cache is a folder:
  meta.json      what made the features: encoder config, weights (name and SHA-256), preprocessing,
                 grid (h, w), D, dtype, cache format, code version, checked_finite (rows checked before storing)
  index.json     the image ids (and files) in row order
  grids.npy      (N, L, D) float16, read memory-mapped; row k holds image index.json["image_ids"][k]
  progress.json  rows written so far and the images that could not be read (rewritten after every batch)

`extract_features` writes a cache and continues an interrupted one where it stopped (or one stopped by a failed
write: see extract_features); it never stores a grid holding NaN or inf. `FeatureCache.open` reads one and refuses
a cache made by another encoder, one not finished, or files that are not what they should be (checks.py: JSON
types, grids.npy's layout, sampled rows finite), with a clear message; every row read is checked finite too.
meta.json is data: its encoder config is only compared with the model's, never built or imported (SECURITY.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from omegaconf import ListConfig, OmegaConf

from captioning.data.images import ImageError
from captioning.data.prepared.arrays import SplitView
from captioning.data.readers.records import ImageRecord
from captioning.features.checks import (
    HOW_TO_EXTRACT,
    check_grids_file,
    check_index,
    check_meta,
    check_progress,
    check_sample,
    differences,
    not_finite,
    read_cache_json,
    read_optional,
)
from captioning.features.fingerprint import check_frozen, fingerprint
from captioning.features.regions import RegionCache, RegionFolder, is_region_cache, open_regions
from captioning.models.encoder import Encoder
from captioning.models.multi_encoder import as_spec
from captioning.models.region_encoder import RegionFeatures


class FeatureCache:
    """Read access to a finished cache: `cache[image_id]` is the image's annotation grid a (L, D), float32."""

    sets = False  # every image has the same grid

    def __init__(self, root: Path, meta: dict[str, Any], image_ids: list[int], failed: dict[str, str]):
        self.root, self.meta, self.failed = root, meta, failed
        self.row = {int(i): k for k, i in enumerate(image_ids)}
        self.grid: tuple[int, int] = tuple(meta["grid"]) if meta.get("grid") else (0, 0)
        self._grids: np.ndarray | None = None  # opened lazily, so DataLoader workers each map the file

    @classmethod
    def open(cls, root: str | os.PathLike, encoder: Encoder | None = None,
             encoder_cfg: Mapping[str, Any] | None = None) -> FeatureCache:
        """Open a cache; with an encoder, refuse it unless that encoder (same config and weights) made it.

        Its JSON files and grids.npy's header are checked in full; of the grids, SAMPLE_ROWS rows spread over the
        file are checked finite (checks.py: 6.4 MB read for COCO, whatever N), the others as they are read.
        """
        root = Path(root)
        if not ((root / "meta.json").exists() or (root / "meta.json").is_symlink()):
            raise FileNotFoundError(f"no feature cache at {root} (meta.json missing); create it with {HOW_TO_EXTRACT}")
        meta = check_meta(root, read_cache_json(root / "meta.json"))
        if encoder is not None:
            check_frozen(encoder)
            diff = differences(fingerprint(encoder, encoder_cfg or {}), meta["fingerprint"])
            if diff:
                raise ValueError(f"the feature cache {root} was made by a different encoder or code version, so its "
                                 f"features do not match this model ({'; '.join(diff)}). Extract a new cache with "
                                 f"{HOW_TO_EXTRACT} (another PATH), or use the encoder settings it was made with")
        image_ids = check_index(root, read_cache_json(root / "index.json"))
        done, failed = check_progress(root, read_optional(root / "progress.json", {"rows_done": 0}), image_ids)
        if done < len(image_ids) or meta["grid"] is None:
            raise ValueError(f"the feature cache {root} is unfinished ({done} of {len(image_ids)} "
                             f"images): rerun {HOW_TO_EXTRACT} with the same PATH to finish it")
        if meta["grid"][0] != meta["grid"][1]:
            raise ValueError(f"{root}: cached grids must be square to be fed to the captioner, got {meta['grid']}")
        check_grids_file(root, meta, len(image_ids))
        cache = cls(root, meta, image_ids, failed)
        check_sample(root, cache.grids, image_ids)
        return cache

    @property
    def grids(self) -> np.ndarray:
        """All grids (N, L, D) float16, memory-mapped read-only."""
        if self._grids is None:
            self._grids = np.load(self.root / "grids.npy", mmap_mode="r")
        return self._grids

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_grids": None}  # never pickle the mapped array

    def __len__(self) -> int:
        return len(self.row)

    def __contains__(self, image_id: int) -> bool:
        return image_id in self.row

    def __getitem__(self, image_id: int) -> torch.Tensor:
        """The (L, D) float32 grid of an image; an ImageError if it could not be read at extraction, a ValueError
        naming the row if the row holds NaN or inf."""
        if str(image_id) in self.failed:
            raise ImageError(f"image {image_id} has no cached features: {self.failed[str(image_id)]}")
        row = self.row[image_id]
        a = np.asarray(self.grids[row], dtype=np.float32)  # (L, D)
        # Measured on a COCO row (196 x 512 float16, page cache, one CPU thread): about 10 us on top of the 171 us
        # of reading and converting it (6%), far less than a training step.
        if not np.isfinite(a).all():
            raise not_finite(self.root, row, image_id)
        return torch.from_numpy(a)

    def require(self, records: Sequence[ImageRecord]) -> None:
        """Refuse records whose images the cache does not hold (it was extracted for other splits or data)."""
        ids = records.image_ids if isinstance(records, SplitView) else [r.image_id for r in records]
        missing = [i for i in ids if i not in self.row]
        if missing:
            raise ValueError(f"{len(missing)} of {len(records)} images are not in the feature cache {self.root} "
                             f"(e.g. image ids {missing[:5]}); extract the splits you use with {HOW_TO_EXTRACT}")



class StackedFeatures:
    """encoder=multi read from one cache per encoder (dataset.features: a list): an image's grids side by side,
    (L, D_1 + ... + D_K), as the multi encoder would compute them."""

    sets = False

    def __init__(self, caches: Sequence[FeatureCache]):
        self.caches = list(caches)
        grids = {c.grid for c in self.caches}
        if len(grids) > 1:
            raise ValueError(f"the feature caches {', '.join(str(c.root) for c in self.caches)} hold grids of "
                             f"different sizes ({', '.join(map(str, sorted(grids)))}); encoder=multi needs one grid")
        self.grid = self.caches[0].grid

    def __getitem__(self, image_id: int) -> torch.Tensor:
        return torch.cat([c[image_id] for c in self.caches], dim=1)  # (L, D)

    def require(self, records: Sequence[ImageRecord]) -> None:
        for c in self.caches:
            c.require(records)


def open_features(path: Any, encoder: Encoder, encoder_cfg: Mapping[str, Any],
                  boxes: str | None = None) -> FeatureCache | StackedFeatures | RegionCache | RegionFolder | None:
    """The cache `dataset.features` names, checked against the model's encoder; None when it is not set. A list
    names one cache per encoder of encoder=multi (each checked against its encoder), in its order. encoder=regions
    reads a region source (features/regions.py) of its width, with its boxes in `boxes` (dataset.boxes) if given."""
    if isinstance(encoder, RegionFeatures):
        if not path or isinstance(path, (list, tuple, ListConfig)):
            raise ValueError("encoder=regions needs dataset.features: one region cache (captioning-convert-regions) or "
                             "folder of per-image npz files")
        return open_regions(str(path), encoder.out_dim, boxes)
    if boxes:
        raise ValueError(f"dataset.boxes={boxes} goes with encoder=regions (the boxes of region features); a grid "
                         "encoder's cells cover the image without boxes")
    if not path:
        return None
    if not isinstance(path, (list, tuple, ListConfig)) and is_region_cache(str(path)):
        raise ValueError(f"dataset.features={path} holds region features: they go with encoder=regions")
    paths = OmegaConf.to_container(path) if isinstance(path, ListConfig) else path
    if not isinstance(paths, (list, tuple)):
        return FeatureCache.open(cast(str, paths), encoder, encoder_cfg)
    children = list(getattr(encoder, "encoders", []))
    if len(paths) != len(children):
        raise ValueError(f"dataset.features lists {len(paths)} caches: a list needs encoder=multi with one encoder "
                         f"per cache (this model has {len(children) or 'a single'} encoder"
                         f"{'s' if len(children) > 1 else ''}); give one folder for a single encoder's cache")
    specs = encoder_cfg.get("encoders") or [{}] * len(children)
    return StackedFeatures([FeatureCache.open(p, e, as_spec(s)) for p, e, s in zip(paths, children, specs)])
