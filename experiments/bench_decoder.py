"""Benchmark: the decoder's training step, beam search and greedy decoding at the paper's sizes, against the
machine's own matmul peak measured in the same run.

Sizes: L = 196 regions (14 x 14) of D = 512 (VGG conv5_4) or D = 2048 (ResNet layer4); E = H = A = 512,
V = 10,000; training on 32 captions (one per image) of 20 steps: forward, doubly stochastic loss, backward and
an Adam step; decoding `--images` random grids with beam k = 3 and 5 and greedily, max_len 20. FLOPs are the
model's matmul FLOPs (`captioning.models.flops`), so GFLOP/s and the share of the peak (a 4096^3 GEMM of the
same dtype on the same threads, best of its repeats) say how close to the machine each part runs. Times are the
best of `--repeats` (the machine may be shared; the median is printed too). `--evaluate N` also times decoding
N cached-feature grids (196 x D) with beam 3 in batches of 50, as `captioning-evaluate` does, and scoring N
synthetic captions with `captioning.metrics.score_captions`.

    .venv/bin/python experiments/bench_decoder.py                      # CPU, 2 threads, both sizes
    .venv/bin/python experiments/bench_decoder.py --device cuda        # torch.cuda.synchronize around timings
    .venv/bin/python experiments/bench_decoder.py --sizes vgg --evaluate 5000
    .venv/bin/python experiments/bench_decoder.py --compile             # decoding through torch.compile too

`--compile` adds rows for greedy and beam search through a compiled decoder step (`eval.compile`; the first,
untimed call compiles, and its seconds are printed).

`--lengths coco` trains on captions of real lengths instead of 32 x 20 steps: each caption's words are drawn from
the caption lengths of the project's synthetic COCO-like text (`synthetic_text.karpathy_file`, 10,000 captions:
mean 11.7 words, 5..23; COCO's own average is about 10.5) at most `--max-words` (20), plus <end>, and the batch
is padded to its longest as the data loader pads it. The decoder is given the lengths where its `forward` takes
them (an older checkout runs the padded batch), and the table adds real tokens per second and the share of the
peak counting the FLOPs of real tokens only. `--lengths-seed` picks the batch.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from captioning.models.attention import SoftAttention
from captioning.models.captioner import CompiledStep
from captioning.models.decoders.sat import ShowAttendTellDecoder
from captioning.models.decoding import beam_search, greedy_decode
from captioning.models.flops import DecoderSizes, decoding_flops, teacher_forcing_flops
from captioning.models.fused.additive import tanh_
from captioning.training.losses import caption_loss

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/synthetic_text.py: the caption text

SIZES = {"vgg": 512, "resnet": 2048}  # D
V, L, M, CAPTIONS, STEPS = 10_000, 196, 512, 32, 20


def sync(device: torch.device) -> None:
    """Wait for queued GPU work, so timings cover it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 1) -> tuple[float, float]:
    """(best, median) wall seconds of fn() over `repeats` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def matmul_peak(device: torch.device, dtype: torch.dtype, repeats: int, n: int = 4096) -> float:
    """GFLOP/s of an n x n x n GEMM in `dtype` (best of `repeats`)."""
    x, y = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    best, _ = timed(lambda: torch.mm(x, y), device, repeats, warmup=2)
    return 2 * n**3 / best / 1e9


def elementwise(device: torch.device, repeats: int) -> dict[str, float]:
    """Microseconds for the two element-wise costs the fast paths avoid: tanh over one 2 MiB chunk of the
    additive score's hidden layer (torch's tanh against 2 sigmoid(2x) - 1, `fused.additive.tanh_`), and one Adam step
    over the ResNet-size decoder's parameters (the per-parameter loop against the fused kernel)."""
    x = torch.randn(1 << 19, device=device) * 3
    y = torch.empty_like(x)
    out = {"tanh_us": timed(lambda: torch.tanh(x, out=y), device, repeats * 20)[0] * 1e6,
           "sigmoid_tanh_us": timed(lambda: tanh_(y.copy_(x)), device, repeats * 20)[0] * 1e6,
           "copy_us": timed(lambda: y.copy_(x), device, repeats * 20)[0] * 1e6}
    params = list(build(SIZES["resnet"], device).parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    for name, kwargs in (("adam_loop_ms", {"foreach": False}), ("adam_fused_ms", {"fused": True})):
        opt = torch.optim.Adam(params, lr=1e-4, **kwargs)
        out[name] = timed(opt.step, device, repeats, warmup=2)[0] * 1e3
    return out


def has_bf16(device: torch.device) -> bool:
    """Whether bfloat16 matmuls have hardware support here (AVX512-BF16/AMX on a CPU, Ampere+ on a GPU)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def build(D: int, device: torch.device) -> ShowAttendTellDecoder:
    """A paper-size decoder with soft attention (dropout 0.5 as the paper)."""
    torch.manual_seed(0)
    dec = ShowAttendTellDecoder(V, D, functools.partial(SoftAttention, attention_dim=M), embed_dim=M,
                                hidden_dim=M, dropout=0.5)
    return dec.to(device)


def sizes(D: int) -> DecoderSizes:
    return DecoderSizes(vocab_size=V, annotation_dim=D, regions=L, embed_dim=M, hidden_dim=M, attention_dim=M)


@functools.cache
def corpus_lengths() -> list[int]:
    """Words per caption of 10,000 captions of the synthetic COCO-like text (its Karpathy file's tokens)."""
    from synthetic_text import karpathy_file

    return [len(s["tokens"]) for im in karpathy_file({"train": 2000})["images"] for s in im["sentences"]]


def target_lengths(kind: str, seed: int, max_words: int, count: int = CAPTIONS) -> list[int]:
    """Real targets (words + <end>) of `count` captions (the benchmark's CAPTIONS): all STEPS, or drawn from the
    corpus."""
    if kind == "full":
        return [STEPS] * count
    pool = corpus_lengths()
    picks = torch.randint(len(pool), (count,), generator=torch.Generator().manual_seed(seed)).tolist()
    return [min(pool[i], max_words) + 1 for i in picks]


def training_batch(D: int, device: torch.device, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The seeded training batch: grids a (B, L, D) and one caption (B, T + 1) per image with these numbers of
    real targets, <end> after them and padding to the longest."""
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(len(lengths), L, D, generator=gen).relu().to(device)  # (B, L, D)
    captions = torch.randint(4, V, (len(lengths), max(lengths) + 1), generator=gen)  # (N, T + 1)
    captions[:, 0] = 1  # <start>
    for r, n in enumerate(lengths):
        captions[r, n], captions[r, n + 1:] = 2, 0  # <end>, then padding
    return a, captions.to(device)


def bench_training(D: int, device: torch.device, dtype: torch.dtype, repeats: int,
                   lengths: list[int]) -> dict[str, float]:
    """One training step: forward (autocast for bf16 and fp16), loss in float32, backward, Adam (fp16: through a
    GradScaler, as trainer.precision=fp16), on one caption per image with these numbers of real targets padded to
    the longest."""
    dec = build(D, device).train()
    opt = torch.optim.Adam(dec.parameters(), lr=1e-4, fused=True)  # as conf/optim/adam.yaml
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
    B, T = len(lengths), max(lengths)
    a, captions = training_batch(D, device, lengths)
    lengths_t = torch.tensor(lengths, device=device)
    kwargs = {"lengths": lengths_t} if "lengths" in inspect.signature(dec.forward).parameters else {}
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)

    def step() -> None:
        with autocast:
            out = dec(a, captions, **kwargs)
        loss = caption_loss(out.logits.float(), captions[:, 1:], out.alphas.float(), pad_id=0).total
        opt.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    best, median = timed(step, device, repeats)
    flops = teacher_forcing_flops(sizes(D), B, B, T, backward=True)  # the padded batch
    real = teacher_forcing_flops(sizes(D), B, 1, sum(lengths), backward=True)  # its real tokens only
    return {"ms": best * 1e3, "median_ms": median * 1e3, "per_s": B / best, "gflop_s": flops / best / 1e9,
            "tokens_s": sum(lengths) / best, "real_gflop_s": real / best / 1e9}


class RowCounter:
    """Wraps a decoder and counts the rows (images or beams) each `step` runs, for the FLOP count."""

    def __init__(self, decoder: ShowAttendTellDecoder):
        self.decoder, self.attention, self.rows = decoder, decoder.attention, 0
        self.rows_share_images = getattr(decoder, "rows_share_images", False)  # absent before the fast paths

    def init_state(self, a, mask=None):
        return self.decoder.init_state(a, mask)

    def step(self, words, state, a, keys, mask=None):
        self.rows += words.shape[0]
        return self.decoder.step(words, state, a, keys, mask)


def bench_decoding(D: int, device: torch.device, dtype: torch.dtype, images: int, repeats: int,
                   beams: tuple[int, ...], compile_step: bool = False) -> dict[str, dict[str, float]]:
    """Images per second of greedy decoding and beam search (k in `beams`) on random grids."""
    dec = build(D, device).eval()
    suffix = ""
    if compile_step:
        dec.step = CompiledStep(dec.step)  # type: ignore[method-assign]
        a0 = torch.randn(images, L, D).relu().to(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            greedy_decode(dec, a0, STEPS), beam_search(dec, a0, max(beams), STEPS)
        sync(device)
        suffix = ", compiled" + (" (FAILED: plain step)" if dec.step.failed else "")
        print(f"compiling the step ({D=}): {time.perf_counter() - start:.1f} s", flush=True)
    a = torch.randn(images, L, D, generator=torch.Generator().manual_seed(2)).relu().to(device)  # (B, L, D)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    out = {}
    for k in (1, *beams):
        counter = RowCounter(dec)

        def run(counter: RowCounter = counter, k: int = k) -> None:
            counter.rows = 0
            with autocast:
                greedy_decode(counter, a, STEPS) if k == 1 else beam_search(counter, a, k, STEPS)

        best, median = timed(run, device, repeats)
        flops = decoding_flops(sizes(D), images, counter.rows)
        out[("greedy" if k == 1 else f"beam {k}") + suffix] = {"ms": best * 1e3, "median_ms": median * 1e3,
                                                    "per_s": images / best, "gflop_s": flops / best / 1e9,
                                                    "gflop_per_image": flops / images / 1e9}
    return out


def bench_evaluation(D: int, device: torch.device, images: int) -> dict[str, float]:
    """Seconds to decode `images` cached grids with beam 3 (batches of 50) and to score as many captions."""
    from synthetic_text import realistic_corpus

    from captioning.metrics import score_captions

    dec = build(D, device).eval()
    gen = torch.Generator().manual_seed(3)
    sync(device)
    start = time.perf_counter()
    for i in range(0, images, 50):
        a = torch.randn(min(50, images - i), L, D, generator=gen).relu().to(device)  # (B, L, D)
        beam_search(dec, a, 3, STEPS)
    sync(device)
    decode = time.perf_counter() - start
    candidates, references = realistic_corpus(images)
    start = time.perf_counter()
    score_captions(candidates, references, metrics=("bleu", "meteor", "rouge", "cider"))
    return {"decode_s": decode, "score_s": time.perf_counter() - start}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (CPU)")
    p.add_argument("--sizes", default="vgg,resnet", help="comma-separated: vgg (D = 512), resnet (D = 2048)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--images", type=int, default=50, help="images per decoding batch")
    p.add_argument("--beams", default="3,5")
    p.add_argument("--no-bf16", action="store_true", help="fp32 only")
    p.add_argument("--skip-decoding", action="store_true")
    p.add_argument("--evaluate", type=int, default=0, help="also time decoding + scoring this many images")
    p.add_argument("--compile", action="store_true", help="also decode through a torch.compile'd step")
    p.add_argument("--lengths", choices=("full", "coco"), default="full",
                   help="training captions: all 20 steps, or COCO-like lengths padded per batch")
    p.add_argument("--lengths-seed", type=int, default=0)
    p.add_argument("--max-words", type=int, default=20, help="--lengths coco: longest caption in words")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtypes = [torch.float32] + ([torch.bfloat16] if has_bf16(device) and not args.no_bf16 else [])
    beams = tuple(int(k) for k in args.beams.split(","))
    print(f"torch {torch.__version__}, {device}, {torch.get_num_threads()} threads, dtypes "
          f"{[str(d).split('.')[-1] for d in dtypes]}, best of {args.repeats}")
    lengths = target_lengths(args.lengths, args.lengths_seed, args.max_words)
    print(f"training captions: {CAPTIONS} of {sum(lengths) / len(lengths):.1f} targets on average (words + <end>), "
          f"padded to {max(lengths)}: real tokens {sum(lengths) / (len(lengths) * max(lengths)):.2f} of the positions"
          f" ({args.lengths})")
    e = elementwise(device, args.repeats)
    print(f"element-wise: tanh of 2^19 floats {e['tanh_us']:.0f} us, as 2 sigmoid(2x) - 1 "
          f"{e['sigmoid_tanh_us'] - e['copy_us']:.0f} us (+ {e['copy_us']:.0f} us copy); Adam step at the ResNet "
          f"sizes: per-parameter loop {e['adam_loop_ms']:.1f} ms, fused {e['adam_fused_ms']:.1f} ms")
    for dtype in dtypes:
        name = str(dtype).split(".")[-1]
        peak = matmul_peak(device, dtype, args.repeats)
        print(f"\n== {name}: matmul peak (4096^3 GEMM) {peak:.1f} GFLOP/s")
        print("| sizes | part | ms (best) | ms (median) | captions or images / s | GFLOP/s | share of peak "
              "| real tokens / s | share of peak, real tokens |")
        print("|---|---|---|---|---|---|---|---|---|")
        for size in args.sizes.split(","):
            D = SIZES[size]
            rows = {"train step": bench_training(D, device, dtype, args.repeats, lengths)}
            if not args.skip_decoding:
                rows.update(bench_decoding(D, device, dtype, args.images, args.repeats, beams))
                if args.compile:
                    rows.update(bench_decoding(D, device, dtype, args.images, args.repeats, beams, True))
            for part, r in rows.items():
                real = (f"{r['tokens_s']:.0f} | {100 * r['real_gflop_s'] / peak:.0f}%" if "tokens_s" in r
                        else "| ")
                print(f"| {size} (D = {D}) | {part} | {r['ms']:.0f} | {r['median_ms']:.0f} | {r['per_s']:.1f} "
                      f"| {r['gflop_s']:.1f} | {100 * r['gflop_s'] / peak:.0f}% | {real} |", flush=True)
    if args.evaluate:
        for size in args.sizes.split(","):
            r = bench_evaluation(SIZES[size], device, args.evaluate)
            print(f"\nevaluate {args.evaluate} cached {size} grids, beam 3: decode {r['decode_s']:.1f} s, "
                  f"score (BLEU, METEOR, ROUGE-L, CIDEr-D) {r['score_s']:.1f} s")


if __name__ == "__main__":
    main()
