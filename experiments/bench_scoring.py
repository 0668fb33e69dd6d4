"""Benchmark: `captioning-score`'s scorers against pycocoevalcap on 5,000 images x 5 references.

Not a test: it prints timings (best of ``--repeat`` runs) side by side and checks with ``==`` that every
number is identical (overall and per image for scoring only, the six overall metrics end to end).
Two comparisons:

1. scoring only - BLEU-1..4, ROUGE-L and CIDEr-D on the same tokens (tokenized once, with the Java
   PTB tokenizer when Java is available), pycocoevalcap's ``Bleu(4)``, ``Rouge()``, ``Cider()``
   against :func:`captioning.metrics.fast_scores.bleu`, :func:`~captioning.metrics.fast_scores.rouge_l`
   and :class:`captioning.metrics.cider.CiderD` (building the document frequencies included);
2. end to end - from the annotation and results JSON files to the three metrics, tokenization
   included: pycocoevalcap as ``COCOEvalCap.evaluate`` runs it (pycocotools ``COCO`` / ``loadRes``,
   ``PTBTokenizer``, the three scorers) against ``captioning-score --metrics bleu,rouge,cider`` with the
   Java tokenizer, and with the pure-Python tokenizer; twice: inside this process (imports already
   paid), and as fresh processes from start to exit, imports included (a ``python -c`` script doing
   the above for pycocoevalcap, the installed ``captioning-score`` command for captioning), which is
   what a user waits for.

Times are CPU seconds (this process plus the child processes it waited for: the tokenizer JVMs and
the fresh Python processes), which stay meaningful on a shared machine, and wall seconds.  The
captions come from the deterministic generator the parity tests use,
:func:`synthetic_text.realistic_corpus`.

    .venv/bin/python experiments/bench_scoring.py            # 5,000 images, best of 3
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/synthetic_text.py: the caption text


@dataclass
class Timing:
    cpu: float  # CPU seconds of this process and of the child processes it waited for (the JVMs)
    wall: float


def _cpu_seconds() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def best_time(fn: Callable[[], Any], repeat: int) -> tuple[Timing, Any]:
    """(fastest CPU and wall times over `repeat` calls, the last result)."""
    cpu, wall, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        cpu0, wall0 = _cpu_seconds(), time.perf_counter()
        out = fn()
        cpu, wall = min(cpu, _cpu_seconds() - cpu0), min(wall, time.perf_counter() - wall0)
    return Timing(cpu, wall), out


def max_diff(a: Any, b: Any) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


Row = tuple[str, Timing | None, Timing, float]  # (what, pycocoevalcap, captioning, max |difference|)
NAMES = ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr"]
TOKENIZERS = ("ptb-java", "python")


def scoring_only(gts: dict, res: dict, repeat: int) -> list[Row]:
    """Rows (metric, pycocoevalcap s, ours s, max |difference|) on the same tokens."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    from captioning.metrics.cider import CiderD
    from captioning.metrics.fast_scores import bleu, rouge_l

    cands = {k: v[0] for k, v in res.items()}
    jobs = [
        ("BLEU-1..4", lambda: Bleu(4).compute_score(gts, res, verbose=0), lambda: bleu(gts, res)),
        ("ROUGE-L", lambda: Rouge().compute_score(gts, res), lambda: rouge_l(gts, res)),
        ("CIDEr-D", lambda: Cider().compute_score(gts, res), lambda: CiderD(gts).score(cands)),
    ]
    rows = []
    for name, theirs, ours in jobs:
        t_ref, (ref_score, ref_scores) = best_time(theirs, repeat)
        t_our, (our_score, our_scores) = best_time(ours, repeat)
        same = np.array_equal(np.asarray(our_score), np.asarray(ref_score)) and np.array_equal(
            np.asarray(our_scores), np.asarray(ref_scores))
        assert same, f"{name} differs from pycocoevalcap (max |diff| {max_diff(our_scores, ref_scores):.3g})"
        rows.append((name, t_ref, t_our, max(max_diff(our_score, ref_score), max_diff(our_scores, ref_scores))))
    cider = CiderD(gts)
    t_rescore, _ = best_time(lambda: cider.score(cands), repeat)
    rows.append(("CIDEr-D rescoring, object built once (per-epoch validation)", None, t_rescore, 0.0))
    return rows


def coco_eval(ann_file: Path, res_file: Path) -> dict[str, float]:
    """pycocoevalcap end to end as COCOEvalCap.evaluate runs it, with BLEU, ROUGE-L and CIDEr only."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
    from pycocotools.coco import COCO

    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools and the tokenizer print progress
        coco = COCO(str(ann_file))
        coco_res = coco.loadRes(str(res_file))
        img_ids = coco_res.getImgIds()
        gts = {i: coco.imgToAnns[i] for i in img_ids}
        res = {i: coco_res.imgToAnns[i] for i in img_ids}
        tokenizer = PTBTokenizer()
        gts, res = tokenizer.tokenize(gts), tokenizer.tokenize(res)
        out: dict[str, float] = {}
        score, _ = Bleu(4).compute_score(gts, res, verbose=0)
        out.update({f"Bleu_{n + 1}": s for n, s in enumerate(score)})
        out["ROUGE_L"] = Rouge().compute_score(gts, res)[0]
        out["CIDEr"] = Cider().compute_score(gts, res)[0]
    return out


def captioning_score(ann_file: Path, res_file: Path, tokenizer: str) -> dict[str, Any]:
    """What `captioning-score --metrics bleu,rouge,cider` computes, called in this process."""
    from captioning.tools.score import score_files

    return score_files(ann_file, res_file, ["bleu", "rouge", "cider"], tokenizer)


# pycocoevalcap in a fresh process, as COCOEvalCap.evaluate runs it (BLEU, ROUGE-L, CIDEr only); argv: ann, res.
COCO_EVAL_SCRIPT = """
import contextlib, io, json, sys
with contextlib.redirect_stdout(io.StringIO()):  # pycocotools, the tokenizer and Bleu print progress
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
    from pycocotools.coco import COCO
    coco = COCO(sys.argv[1])
    coco_res = coco.loadRes(sys.argv[2])
    img_ids = coco_res.getImgIds()  # the official example: cocoEval.params['image_id'] = cocoRes.getImgIds()
    gts = {i: coco.imgToAnns[i] for i in img_ids}
    res = {i: coco_res.imgToAnns[i] for i in img_ids}
    tokenizer = PTBTokenizer()
    gts, res = tokenizer.tokenize(gts), tokenizer.tokenize(res)
    out = {}
    for scorer, names in [(Bleu(4), ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"]), (Rouge(), ["ROUGE_L"]),
                          (Cider(), ["CIDEr"])]:
        score, _ = scorer.compute_score(gts, res)
        out.update(zip(names, score if isinstance(score, list) else [score]))
print(json.dumps(out))
"""


def score_command() -> list[str]:
    """The installed `captioning-score` console script of this interpreter's environment, else `python -m`."""
    script = Path(sys.executable).parent / "captioning-score"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "captioning.tools.score"]


def run_json(cmd: list[str]) -> dict[str, Any]:
    """Run a fresh process to its exit and parse the JSON it prints on stdout."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{cmd[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout)  # pycocoevalcap's prints are redirected in its script


def _check(ours: dict[str, Any], ref: dict[str, float], tokenizer: str) -> float:
    """0.0 after asserting that captioning-score used `tokenizer` and gave pycocoevalcap's numbers exactly."""
    assert ours.get("tokenizer", tokenizer) == tokenizer
    diff = max(abs(ours[n] - ref[n]) for n in NAMES)
    assert diff == 0.0, f"captioning-score ({tokenizer} tokenizer) differs from pycocoevalcap by {diff:.3g}"
    return diff


def fresh_processes(ann_file: Path, res_file: Path, ref: dict[str, float], repeat: int) -> list[Row]:
    """Rows for the whole commands as a user runs them, start to exit (the commands alternate in each round)."""
    theirs = [sys.executable, "-c", COCO_EVAL_SCRIPT, str(ann_file), str(res_file)]
    ours = {tok: [*score_command(), "--annotations", str(ann_file), "--results", str(res_file), "--metrics",
                  "bleu,rouge,cider", "--tokenizer", tok] for tok in TOKENIZERS}
    best: dict[str, Timing] = {}
    outs: dict[str, dict[str, Any]] = {}
    for _ in range(repeat):  # alternating, so that a busy spell on the machine hits every command alike
        for key, cmd in [("theirs", theirs), *ours.items()]:
            t, outs[key] = best_time(lambda cmd=cmd: run_json(cmd), 1)
            old = best.get(key, t)
            best[key] = Timing(min(old.cpu, t.cpu), min(old.wall, t.wall))
    _check(outs["theirs"], ref, "ptb-java")  # pycocoevalcap in a fresh process: its in-process numbers
    return [(f"end to end, fresh processes, {tok} tokenizer (theirs: Java)", best["theirs"], best[tok],
             _check(outs[tok], ref, tok)) for tok in TOKENIZERS]


def end_to_end(candidates: dict[int, str], references: dict[int, list[str]], repeat: int) -> list[Row]:
    """Rows (what, pycocoevalcap s, ours s, max |difference| over the metrics) from JSON files."""
    with tempfile.TemporaryDirectory() as folder:
        ann_file, res_file = Path(folder) / "captions.json", Path(folder) / "results.json"
        anns = [{"image_id": i, "id": 10 * i + k, "caption": c}
                for i, cs in references.items() for k, c in enumerate(cs)]
        ann_file.write_text(json.dumps({"images": [{"id": i} for i in references], "annotations": anns}))
        res_file.write_text(json.dumps([{"image_id": i, "caption": c} for i, c in candidates.items()]))
        t_ref, ref = best_time(lambda: coco_eval(ann_file, res_file), repeat)
        rows = []
        for tokenizer in TOKENIZERS:
            t_our, ours = best_time(lambda tok=tokenizer: captioning_score(ann_file, res_file, tok), repeat)
            rows.append((f"end to end, in this process, {tokenizer} tokenizer (theirs: Java)", t_ref, t_our,
                         _check(ours, ref, tokenizer)))
        rows += fresh_processes(ann_file, res_file, ref, repeat)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--refs", type=int, default=5, help="references per image")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    args = parser.parse_args()

    from synthetic_text import realistic_corpus

    from captioning.metrics import java_ptb_tokenize, ptb_tokenize

    candidates, references = realistic_corpus(args.images, seed=args.seed, refs_per_image=args.refs)
    java = shutil.which("java") is not None
    tokenize = java_ptb_tokenize if java else ptb_tokenize
    gts = tokenize(references)
    res = tokenize({k: [c] for k, c in candidates.items()})
    print(f"{args.images} images x {args.refs} references, tokens from the "
          f"{'Java PTB' if java else 'pure-Python'} tokenizer; best of {args.repeat} runs\n")
    rows = scoring_only(gts, res, args.repeat)
    total = [Timing(sum(r[k].cpu for r in rows[:3]), sum(r[k].wall for r in rows[:3])) for k in (1, 2)]
    rows.insert(3, ("total, scoring only (same tokens)", total[0], total[1], max(r[3] for r in rows[:3])))
    if java:
        rows += end_to_end(candidates, references, args.repeat)
    print("| step | pycocoevalcap CPU s | captioning CPU s | CPU ratio | pycocoevalcap wall s | captioning wall s "
          "| wall ratio | max abs difference |")
    print("|---|---|---|---|---|---|---|---|")
    for name, theirs, ours, diff in rows:
        if theirs is None:
            print(f"| {name} | - | {ours.cpu:.2f} | - | - | {ours.wall:.2f} | - | {diff:.1g} |")
        else:
            print(f"| {name} | {theirs.cpu:.2f} | {ours.cpu:.2f} | {ours.cpu / theirs.cpu:.2f} | {theirs.wall:.2f} "
                  f"| {ours.wall:.2f} | {ours.wall / theirs.wall:.2f} | {diff:.1g} |")
    print("\nAll numbers identical to pycocoevalcap, compared with == (scoring only: overall and per image; end to "
          "end: the six overall metrics).")


if __name__ == "__main__":
    main()
