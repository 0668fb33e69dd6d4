"""Why one model captions the test photos better than another: how well each best checkpoint fits each split
(teacher-forced per-word NLL on the training, validation and test captions, dropout off) and how far its attention is
from uniform (each word's largest cell weight, as a multiple of the uniform 1/L, and the entropy of its map in bits,
against log2 L for uniform), over the runs of experiments/flickr8k_1k_compare.sh.

    python experiments/flickr8k_1k_fit.py outputs/flickr8k_1k_compare
    python experiments/flickr8k_1k_fit.py soft-lambda0=outputs/flickr8k_1k_sweep/stage2/2    (NAME=RUN: one run)
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from captioning.data.dataset import collate
from captioning.data.vocab import Vocabulary
from captioning.factory.datasets import build_datasets
from captioning.factory.load import load_model
from captioning.features.cache import open_features
from captioning.training.losses import sequence_nll

SPLITS = ("train", "val", "test")


@torch.no_grad()
def fit(checkpoint: Path) -> dict[str, float]:
    """Per-word NLL of each split's references and the attention's peak (x uniform) and entropy (bits)."""
    model, vocab, ckpt = load_model(checkpoint)
    cfg = OmegaConf.create(ckpt["config"])
    features = open_features(cfg.dataset.features, model.encoder, ckpt["config"]["model"]["encoder"])
    _, data = build_datasets(cfg.dataset, model.encoder.transform(), SPLITS, vocab=vocab, features=features)
    out: dict[str, float] = {}
    for split in SPLITS:
        total, words, peaks, entropies = 0.0, 0, [], []
        for batch in DataLoader(data[split], batch_size=64, collate_fn=collate):
            targets = batch.captions[:, 1:]  # (N, T)
            result = model(batch.images, batch.captions, batch.image_index)  # captions (N, T+1) from <start>
            nll = sequence_nll(result.logits, targets, Vocabulary.pad_id)  # (N, T)
            real = targets != Vocabulary.pad_id
            total, words = total + float(nll.sum()), words + int(real.sum())
            alphas = result.alphas[real]  # (R, L): one map per real word
            L = alphas.shape[-1]
            peaks.append(alphas.max(-1).values * L)
            entropies.append(-(alphas.clamp_min(1e-12) * alphas.clamp_min(1e-12).log2()).sum(-1))
        out[f"{split}_nll"] = total / words
        out[f"{split}_peak"] = float(torch.cat(peaks).median())
        out[f"{split}_entropy"] = float(torch.cat(entropies).median())
        out["uniform_entropy"] = math.log2(L)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="a compare folder (<model>-seed<k>/ runs), or NAME=RUN")
    args = parser.parse_args()
    runs: list[tuple[str, Path]] = []
    for given in args.folders:
        name, _, path = given.rpartition("=")
        if name:
            runs.append((name, Path(path)))
        else:
            runs += [(run.name.split("-seed")[0], run) for run in sorted(Path(path).glob("*-seed*"))]
    by_model: dict[str, list[dict[str, float]]] = {}
    for name, run in runs:
        if (run / "checkpoints" / "best.pt").is_file() and (run / "metrics.json").is_file():
            by_model.setdefault(name, []).append(fit(run / "checkpoints" / "best.pt"))
    keys = ("train_nll", "val_nll", "test_nll", "test_peak", "test_entropy")
    print("| model | seeds | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 2) + "|")
    for model, rows in by_model.items():
        cells = []
        for k in keys:
            values = [r[k] for r in rows]
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.fmean(values):.3f} ± {sd:.3f}")
        print(f"| {model} | {len(rows)} | " + " | ".join(cells) + " |")
    print(f"(uniform attention over the grid: peak 1.0, entropy {rows[0]['uniform_entropy']:.3f} bits)")


if __name__ == "__main__":
    main()
