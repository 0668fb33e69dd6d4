"""Benchmark: seconds per training epoch of the default run under config variants, alternating.

Builds one Trainer per `--variant` (Hydra overrides of conf/train.yaml, comma-free, space-separated within one
variant), then runs `Trainer.train_epoch` for each in turn, `--rounds` times, printing the seconds of each epoch
(data loading and optimizer steps; no validation). Example, length buckets against the plain order:

    .venv/bin/python experiments/bench_epoch.py --variant "dataset.length_buckets=null" \\
        --variant "dataset.length_buckets=20"
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import torch
from hydra import compose, initialize_config_dir

from captioning.data.dataset import item_lengths, training_view
from captioning.factory.run import build_trainer
from captioning.runtime import CONF_DIR, set_seed
from captioning.training.tensorboard import NullWriter


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", action="append", required=True, help="space-separated overrides (repeatable)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable(logging.INFO)
    trainers = {}
    with TemporaryDirectory() as out:
        for variant in args.variant:
            with initialize_config_dir(str(CONF_DIR), version_base=None):
                cfg = compose("train", overrides=["trainer.progress=false", *variant.split()])
            set_seed(int(cfg.seed))
            trainers[variant] = build_trainer(cfg, Path(out) / str(len(trainers)))
        first = next(iter(trainers.values()))
        lengths = item_lengths(training_view(first.data["train"], first.parts.loader.batch_unit)[0])
        print(f"training items: caption length mean {lengths.mean():.2f}, sd {lengths.std():.2f}, "
              f"min {lengths.min():.1f}, max {lengths.max():.1f}")
        for r in range(args.rounds):
            for variant, trainer in trainers.items():
                start = time.perf_counter()
                losses, _ = trainer.train_epoch(NullWriter(), None)
                trainer.epoch += 1
                print(f"round {r + 1} [{variant}]: {time.perf_counter() - start:.2f} s, loss {losses['loss']:.4f}",
                      flush=True)


if __name__ == "__main__":
    main()
