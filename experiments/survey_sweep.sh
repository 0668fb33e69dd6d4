#!/usr/bin/env bash
# Every attention form on `shapes` in one sweep (experiments/README.md, "Every form in one sweep"): the default run's
# settings with one attention each (and its encoder, for multirep), JOBS runs at a time with THREADS threads each,
# each given MINUTES of training (trainer.max_minutes); test split, beam 3.
#
#   experiments/survey_sweep.sh [OUT]
#
# OUT  where the runs go (default: outputs/survey_sweep); finished runs there are kept, not rerun (an unfinished one
#      is rerun from the start), and OUT/NAME.machine says when and on which CPU each ran.
# Writes the table (captioning-report: OUT/table.md, .csv, .png) and the figure of one test image's maps under each
# form (experiments/figures/survey_sweep_maps.jpg). Environment: MINUTES (default 4; null: the full default budget,
# early stopping), JOBS (default 2), THREADS (default 1; e.g. JOBS=1 THREADS=2 for each run alone on 2 cores), ARGS
# (overrides added to every run).
set -euo pipefail
out=${1:-outputs/survey_sweep}
export MINUTES=${MINUTES:-4} THREADS=${THREADS:-1} ARGS=${ARGS:-} OUT=$out
# The longest runs first (multirep's two encoders, channel's per-step keys, ...), so that JOBS runs end together.
forms=("multirep|encoder=multi attention=multirep" "channel|attention=channel"
       "local-m|attention=local attention.centre=monotonic"
       "location-smoothing|attention=location attention.normalization=smoothing" "local|attention=local"
       "location|attention=location" "concat|attention=concat" "multihead|attention=multihead"
       "multilevel|attention=multilevel" "soft|attention=soft" "hard|attention=hard" "dot|attention=dot"
       "general|attention=general" "monotonic|attention=monotonic" "mean|attention=mean")
mkdir -p "$out" experiments/figures
run() {
  local name=${1%%|*} overrides=${1#*|}
  [ -f "$OUT/$name/metrics.json" ] && return 0
  # a run stopped part way (the sweep interrupted) starts again from nothing, not from its checkpoint
  rm -rf "${OUT:?}/$name"
  { date -u +%FT%TZ; lscpu | sed -n 's/^Model name: *//p'; } > "$OUT/$name.machine"  # where and when it ran
  # shellcheck disable=SC2086  # the overrides are words
  OMP_NUM_THREADS=$THREADS captioning-train $overrides hydra.run.dir="$OUT/$name" trainer.progress=false \
    trainer.max_minutes="$MINUTES" $ARGS > "$OUT/$name.log" 2>&1 || echo "$name failed: see $OUT/$name.log"
}
export -f run
printf '%s\n' "${forms[@]}" | xargs -P "${JOBS:-2}" -I{} bash -c 'run "$1"' _ {}
captioning-report "$out" --out "$out/table.md" --plot-metric CIDEr \
  --metrics Bleu_4,CIDEr,METEOR,attention_correctness,distinct_captions,epochs,train_seconds
python experiments/survey_figure.py $(for f in "${forms[@]}"; do n=${f%%|*}; printf '%s=%s ' "$n" "$out/$n"; done) \
  --out experiments/figures/survey_sweep_maps.jpg
