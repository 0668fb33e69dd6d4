"""Benchmark: the default `shapes` model's training step and its decoding, for comparing two versions of the code.

Builds the model of the default run (conf/encoder/small_cnn, attention/soft, decoder/sat, optim/adam of the checkout
that `captioning` is imported from) and times, on fixed synthetic batches, a training step (32 images of 64 px with
2 captions each, forward, loss, backward, clipping, the configured Adam) and greedy / beam-3 decoding of 50 images.
It only uses functions that every version of the package has, so an older checkout can be timed against this one in
the same session, alternating, on a quiet machine:

    git worktree add /tmp/before 7b7a337          # e.g. main before this round's speed work
    for i in 1 2 3 4; do for root in /tmp/before $PWD; do
        PYTHONPATH=$root taskset -c 1 .venv/bin/python experiments/bench_default_step.py --threads 1
    done; done

`--attention NAME` builds the default model with conf/attention/NAME.yaml instead of soft (every attention type's
step, before and after a change to the family), `--encoder NAME` with conf/encoder/NAME.yaml, `--set
attention.centre=monotonic` changes one key; `--train-only` skips decoding.
"""

from __future__ import annotations

import argparse
import inspect
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

import captioning
from captioning.factory.models import build_captioner
from captioning.training.losses import caption_loss


def best_ms(fn: Callable[[], Any], repeats: int, warmup: int = 3) -> float:
    """Best wall milliseconds of fn() over `repeats` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--attention", default="soft", help="conf/attention/<name>.yaml (default: soft, the default run's)")
    p.add_argument("--encoder", default="small_cnn",
                   help="conf/encoder/<name>.yaml (default: small_cnn, the default run's; multi: two CNNs)")
    p.add_argument("--set", action="append", default=[], metavar="GROUP.KEY=VALUE",
                   help="change one key of the model's encoder, attention or decoder config, e.g. attention.centre="
                        "monotonic (repeatable; the value is read as YAML)")
    p.add_argument("--train-only", action="store_true", help="time the training step only, not decoding")
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--ragged", action="store_true",
                   help="captions of 4..12 words (+ <end>) padded to the longest, with their lengths where forward "
                        "takes them, instead of 64 captions of 12 words")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(captioning.__file__).resolve().parents[1]
    conf = lambda group, name: OmegaConf.load(root / "conf" / group / f"{name}.yaml")  # noqa: E731
    model_cfg = {"encoder": conf("encoder", args.encoder), "attention": conf("attention", args.attention),
                 "decoder": conf("decoder", "sat")}
    for item in args.set:
        key, value = item.split("=", 1)
        group, name = key.split(".", 1)
        OmegaConf.update(model_cfg[group], name, OmegaConf.create(f"v: {value}").v)
    torch.manual_seed(0)
    model = build_captioner(model_cfg, 40).train()
    opt = instantiate(conf("optim", "adam"))(model.parameters())
    g = torch.Generator().manual_seed(0)
    images = torch.rand(32, 3, 64, 64, generator=g)  # (B, 3, H, W)
    captions = torch.randint(4, 40, (64, 14), generator=g)  # (N, T + 1): <start> 12 words <end>
    captions[:, 0], captions[:, -1] = 1, 2
    image_index = torch.arange(32).repeat_interleave(2)
    kwargs: dict[str, Any] = {}
    if args.ragged:
        lengths = torch.randint(5, 14, (64,), generator=g)  # targets: 4..12 words + <end>
        for r, n in enumerate(lengths.tolist()):
            captions[r, n], captions[r, n + 1:] = 2, 0
        if "lengths" in inspect.signature(model.forward).parameters:
            kwargs["lengths"] = lengths

    def step() -> None:
        out = model(images, captions, image_index, **kwargs)
        loss = caption_loss(out.logits, captions[:, 1:], out.alphas, pad_id=0).total
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()

    train = best_ms(step, args.repeats)
    kind = (" (ragged)" if args.ragged else "") + "".join(f" {item}" for item in args.set)
    if args.train_only:
        print(f"{root}: encoder={args.encoder} attention={args.attention} train step{kind} {train:.1f} ms (best of "
              f"{args.repeats}; "
              f"{args.threads} thread(s))")
        return
    model.eval()
    grids = torch.rand(50, 3, 64, 64, generator=g)

    def decode(k: int) -> Any:
        if hasattr(model, "generate"):
            return model.generate(grids, beam_size=k, max_len=20)
        from captioning.models.decoding import generate  # type: ignore[attr-defined]  # versions before Captioner.generate
        return generate(model, grids, beam_size=k, max_len=20)

    greedy, beam3 = (best_ms(lambda k=k: decode(k), max(5, args.repeats // 4), 1) for k in (1, 3))
    print(f"{root}: encoder={args.encoder} attention={args.attention} train step{kind} {train:.1f} ms, "
          f"greedy {greedy:.1f} ms, "
          f"beam 3 {beam3:.1f} ms (best of runs; {args.threads} thread(s))")


if __name__ == "__main__":
    main()
