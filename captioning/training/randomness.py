"""Where a training run's randomness comes from, so that a run stopped anywhere and resumed repeats it exactly.

- The data order of epoch e is a pure function of (seed, epoch) (`epoch_batches`); under torchrun it is the
  DistributedSampler's (seeded with the run's seed, `set_epoch(e)`). Each item also gets its own seed, so the
  random choices a data set makes per item (e.g. which captions of an image are drawn) depend on its place in
  the epoch only: not on DataLoader workers, nor on where a resumed run picked the epoch up.
- Everything else (dropout, hard attention's coin and sampled regions) draws from the global Python, NumPy and
  torch (CUDA) generators, whose states `rng_state` captures for a checkpoint and `set_rng_state` restores.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

Key = tuple[int, int]  # (data set index, item seed)


def derive_seed(*parts: int) -> int:
    """A 63-bit seed that is a pure function of `parts` (e.g. seed, epoch, rank), well mixed."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)[0] >> np.uint64(1))


def epoch_batches(num_items: int, batch_size: int, seed: int, epoch: int, rank: int = 0,
                  sampler: Sampler[int] | None = None, lengths: np.ndarray | None = None,
                  buckets: int | None = None) -> list[list[Key]]:
    """The batches of one epoch as (index, item seed) keys: a shuffle by a generator seeded from (seed, epoch,
    rank), or the order `sampler` gives (a DistributedSampler after set_epoch); the last batch may be short.

    With `buckets` (dataset.length_buckets) and the items' caption `lengths`: each run of `buckets` batches of
    that order is sorted by length (ties keep their shuffled order) and cut into batches, and the batches are
    shuffled, so a batch holds captions of similar lengths. Still a pure function of (seed, epoch, rank)."""
    gen = torch.Generator().manual_seed(derive_seed(seed, epoch, rank))
    order = list(sampler) if sampler is not None else torch.randperm(num_items, generator=gen).tolist()
    item_seeds = torch.randint(0, 2**62, (len(order),), generator=gen).tolist()
    keys = list(zip(order, item_seeds))
    if buckets is None:
        return [keys[i:i + batch_size] for i in range(0, len(keys), batch_size)]
    if lengths is None or len(lengths) != num_items:
        raise ValueError("length buckets need the caption length of every item")
    pool, batches = buckets * batch_size, []
    for start in range(0, len(keys), pool):
        run = sorted(keys[start:start + pool], key=lambda key: lengths[key[0]])  # stable
        batches += [run[i:i + batch_size] for i in range(0, len(run), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]


class SeededItems(Dataset):
    """A map-style data set read with (index, seed) keys: the item is built with torch's CPU generator seeded
    from `seed`, and the caller's generator state is left as it was."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: Key) -> Any:
        index, seed = key
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)  # the CPU generator only: CUDA state is never touched here
            return self.dataset[index]


def rng_state(device: torch.device) -> dict[str, Any]:
    """The global generators' states (Python, NumPy, torch CPU and, on a GPU, `device`'s) as plain data for a
    checkpoint (lists, ints and tensors: readable with weights_only=True)."""
    version, internal, gauss = random.getstate()
    kind, key, pos, has_gauss, cached = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state(legacy=True))
    return {"python": [version, list(internal), gauss],
            "numpy": [kind, key.tolist(), int(pos), int(has_gauss), float(cached)],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore what `rng_state` captured (tensors may come back on any device)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"].cpu())
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


@contextmanager
def forked(device: torch.device) -> Iterator[None]:
    """Run a block (e.g. validation decoding) without moving the global torch generators of the training run."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        yield
