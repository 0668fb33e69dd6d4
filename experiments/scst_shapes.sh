#!/usr/bin/env bash
# Self-critical training on `shapes` (experiments/README.md, "Self-critical training on shapes"): from the
# cross-entropy runs' best checkpoints, SCST with the greedy baseline and with the mean of the other samples, for
# soft and hard attention; then one table (test split, beam 3) and the figures under experiments/figures/.
#
#   experiments/scst_shapes.sh SOFT_XE_RUN [HARD_XE_RUN] [OUT]
#
# SOFT_XE_RUN  the default run's folder:  captioning-train hydra.run.dir=SOFT_XE_RUN trainer.progress=false
# HARD_XE_RUN  the same with attention=hard; trained into OUT/xe_hard when not given (or given as "")
# OUT          where the SCST runs go (default: outputs/scst_shapes); finished runs there are kept, not rerun
# Environment: SCST_ARGS, overrides added to every SCST run; FIGURES (default experiments/figures), where the PNGs go.
set -euo pipefail
soft_xe=${1:?usage: experiments/scst_shapes.sh SOFT_XE_RUN [HARD_XE_RUN] [OUT]}
hard_xe=${2:-}
out=${3:-outputs/scst_shapes}
figures=${FIGURES:-experiments/figures}
mkdir -p "$out" "$figures"
if [ -z "$hard_xe" ]; then
  hard_xe=$out/xe_hard
  [ -f "$hard_xe/metrics.json" ] || captioning-train attention=hard hydra.run.dir="$hard_xe" trainer.progress=false
fi
for attention in soft hard; do
  xe=$soft_xe
  [ "$attention" = hard ] && xe=$hard_xe
  [ -f "$xe/metrics.json" ] || { echo "$xe: not a finished cross-entropy run (no metrics.json)" >&2; exit 2; }
  for baseline in greedy mean; do
    run=$out/scst_${attention}_${baseline}
    [ -f "$run/metrics.json" ] || captioning-train objective=scst attention="$attention" \
      init_from="$xe/checkpoints/best.pt" objective.baseline="$baseline" hydra.run.dir="$run" \
      trainer.progress=false ${SCST_ARGS:-}
  done
done

# The table (Markdown, on stdout) and the figures: reward and greedy CIDEr-D of the training batches (TensorBoard,
# every trainer.log_every steps) and validation CIDEr by epoch, epoch 0 being the cross-entropy checkpoint's.
python - "$soft_xe" "$hard_xe" "$out" "$figures" <<'EOF'
import json, sys
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

soft_xe, hard_xe, out, figures = map(Path, sys.argv[1:])
runs = {}  # name -> (run folder, starting XE folder)
for attention, xe in (("soft", soft_xe), ("hard", hard_xe)):
    runs[f"{attention} XE"] = (xe, None)
    for baseline in ("greedy", "mean"):
        runs[f"{attention} SCST {baseline}"] = (out / f"scst_{attention}_{baseline}", xe)


def best_val(history, epoch):
    return next(h["val_CIDEr"] for h in history if h["epoch"] == epoch)


print("| run | BLEU-4 | CIDEr | METEOR | ROUGE-L | words per caption | best val CIDEr (epoch) | train seconds |")
print("|---|---|---|---|---|---|---|---|")
for name, (run, _) in runs.items():
    m = json.loads((run / "metrics.json").read_text())
    words = [len(r["caption"].split()) for r in json.loads((run / "results.json").read_text())]
    history = json.loads((run / "history.json").read_text())
    print(f"| {name} | {m['Bleu_4']:.4f} | {m['CIDEr']:.3f} | {m.get('METEOR', float('nan')):.4f} | "
          f"{m['ROUGE_L']:.4f} | {sum(words) / len(words):.2f} | {best_val(history, m['best_epoch']):.3f} "
          f"({m['best_epoch']}/{m['epochs']}) | {m['train_seconds']:.0f} |")

reward, val = Figure(figsize=(9, 3.4), dpi=100), Figure(figsize=(4.6, 3.4), dpi=100)
axes = reward.subplots(1, 2, sharey=True)
val_ax = val.subplots()
for name, (run, xe) in runs.items():
    if xe is None:
        continue
    events = EventAccumulator(str(run / "tensorboard")).Reload()
    ax = axes[0 if name.startswith("soft") else 1]
    for tag, style, what in (("train/reward", "-", "sampled"), ("train/greedy_CIDEr", ":", "greedy")):
        points = events.Scalars(tag)
        ax.plot([p.step for p in points], [p.value for p in points], style,
                label=f"baseline {name.split(' ', 2)[2]}: {what} captions")
    start = json.loads((xe / "metrics.json").read_text())
    history = json.loads((run / "history.json").read_text())
    xs = [0] + [h["epoch"] for h in history]
    val_ax.plot(xs, [best_val(json.loads((xe / "history.json").read_text()), start["best_epoch"])]
                + [h["val_CIDEr"] for h in history], marker="o", markersize=3, label=name)
for ax, attention in zip(axes, ("soft", "hard")):
    ax.set_title(f"{attention} attention: training batches (CIDEr-D)")
    ax.set_xlabel("SCST step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
val_ax.set_title("validation CIDEr (greedy)")
val_ax.set_xlabel("SCST epoch (0: the cross-entropy checkpoint)")
val_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
val_ax.grid(alpha=0.3)
val_ax.legend(fontsize=7)
for fig, name in ((reward, "scst_shapes_reward.png"), (val, "scst_shapes_val_cider.png")):
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(figures / name)
    print(f"wrote {figures / name}", file=sys.stderr)
EOF
