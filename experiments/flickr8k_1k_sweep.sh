#!/usr/bin/env bash
# How the flickr8k_1k recipe's settings were chosen: Hydra sweeps on the validation split of the 1,000 shared Flickr8k
# photos (experiments/README.md, "Real photographs"), soft attention, early stopping on validation CIDEr (greedy):
#   stage 1: learning rate x LSTM size (lambda 1, dropout 0.5, the paper's);
#   stage 2: dropout x the doubly stochastic lambda, at stage 1's best (LR, HIDDEN: give them, as chosen there).
#
#   experiments/flickr8k_1k_sweep.sh [OUT]     (default OUT: outputs/flickr8k_1k_sweep)
#
# JOBS runs at a time (default 2: the joblib launcher), THREADS threads each (default 1). Writes OUT/stage{1,2}/<n>/
# (each a run folder) and OUT/stage{1,2}.md (captioning-report: validation and test scores of every run).
set -euo pipefail
out=${1:-outputs/flickr8k_1k_sweep}
export OMP_NUM_THREADS=${THREADS:-1}
common=(experiment=flickr8k_1k hydra/launcher=joblib "hydra.launcher.n_jobs=${JOBS:-2}" trainer.progress=false
        eval.num_figures=0 eval.report=false)
if [ ! -d "$out/stage1" ]; then
  captioning-train -m "${common[@]}" hydra.sweep.dir="$out/stage1" optim.lr=0.0005,0.001,0.002 \
    decoder.hidden_dim=256,512 decoder.dropout=0.5 objective.attention_weight=1.0
fi
if [ -n "${LR:-}" ] && [ -n "${HIDDEN:-}" ] && [ ! -d "$out/stage2" ]; then
  captioning-train -m "${common[@]}" hydra.sweep.dir="$out/stage2" optim.lr="$LR" decoder.hidden_dim="$HIDDEN" \
    decoder.dropout=0.3,0.5 objective.attention_weight=0.0,1.0
fi
for stage in stage1 stage2; do
  [ -d "$out/$stage" ] && captioning-report "$out/$stage" --out "$out/$stage.md" --plot-metric val_CIDEr \
    --metrics val_CIDEr,best_epoch,epochs,Bleu_4,CIDEr,METEOR,distinct_captions,train_seconds
done
