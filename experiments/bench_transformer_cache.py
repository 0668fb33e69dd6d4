"""What the Transformer's key/value cache saves in decoding: one step at position t with the cache (`step`) against
recomputing the whole prefix (teacher forcing over the t + 1 words, as a decoder without a cache must), at the
COCO preset's sizes (6 + 6 layers, d_model 512, 8 heads, ff 2048; 14 x 14 x 2048 grids), random weights.

    python experiments/bench_transformer_cache.py [--rows 30] [--positions 1 4 8 16] [--repeat 5]

Both give the same logits (checked below). Prints milliseconds per step for both and their ratio (the figures in
experiments/README.md, "Decoders compared").
"""

from __future__ import annotations

import argparse
import time

import torch

from captioning.factory.models import build_captioner

COCO = {"encoder": {"_target_": "small_cnn"},
        "attention": {"_target_": "multihead", "num_heads": 8,
                      "head_dim": 64},
        "decoder": {"_target_": "transformer", "d_model": 512,
                    "num_layers": 6, "num_heads": 8, "ff_dim": 2048, "encoder_layers": 6}}


def _best(fn, repeat: int) -> float:
    """The fastest of `repeat` runs, in milliseconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


def prefix(decoder, words: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The next word's logits without a cache: every layer over all t + 1 positions again (the image's memory and
    keys are still prepared once, as `prepare` does)."""
    memory, *layer_keys = decoder.attention.split(keys)
    x = decoder._inputs(words, 0)  # (N, t + 1, d)
    for i, layer in enumerate(decoder.layers):
        x, _ = layer(x, decoder._attend(i, memory, layer_keys, None))
    return decoder.out(decoder.norm(x[:, -1]))  # (N, V)


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=30, help="decoding rows (e.g. 10 images x beam 3)")
    parser.add_argument("--positions", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    decoder = build_captioner(COCO, 10000).decoder.eval()
    decoder.attention.embed[0] = torch.nn.Linear(2048, 512)  # the ResNet-101 grids' width
    a = torch.randn(args.rows, 196, 2048).relu()
    keys = decoder.attention.prepare(a, (14, 14))
    words = torch.randint(4, 10000, (args.rows, max(args.positions) + 1))
    print(f"rows {args.rows}, threads {torch.get_num_threads()}, torch {torch.__version__}")
    print("| position t | step with the cache (ms) | prefix recomputed (ms) | ratio |")
    print("|---|---|---|---|")
    for t in args.positions:
        state = decoder.init_state(a)
        for s in range(t):  # the cache of positions 0 .. t - 1
            state = decoder.step(words[:, s], state, a, keys)[1]
        logits = decoder.step(words[:, t], state, a, keys)[0]
        assert torch.allclose(logits, prefix(decoder, words[:, : t + 1], keys), atol=1e-4)
        cached = _best(lambda t=t, state=state: decoder.step(words[:, t], state, a, keys), args.repeat)
        full = _best(lambda t=t: prefix(decoder, words[:, : t + 1], keys), args.repeat)
        print(f"| {t} | {cached:.1f} | {full:.1f} | {full / cached:.1f} |")


if __name__ == "__main__":
    main()
