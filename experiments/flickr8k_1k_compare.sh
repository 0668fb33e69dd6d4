#!/usr/bin/env bash
# The recipe's models on real photographs, three seeds each (experiments/README.md, "Real photographs"): soft and
# hard attention, the no-attention control (mean) and Up-Down, all with the flickr8k_1k recipe's settings (chosen
# on the validation split for soft attention: experiments/flickr8k_1k_sweep.sh), the 125 test photos, beam 3.
#
#   experiments/flickr8k_1k_compare.sh [OUT]     (default OUT: outputs/flickr8k_1k_compare)
#
# JOBS runs at a time (default 2), THREADS threads each (default 1); finished runs in OUT are kept, an unfinished one
# starts again. Then prints the table (mean and sample standard deviation over the seeds):
#   python experiments/flickr8k_1k_table.py OUT
set -euo pipefail
out=${1:-outputs/flickr8k_1k_compare}
export THREADS=${THREADS:-1} OUT=$out
mkdir -p "$out"
runs=()
for seed in 0 1 2; do
  for model in "soft|attention=soft" "hard|attention=hard" "mean|attention=mean" "updown|decoder=updown"; do
    runs+=("${model%%|*}-seed$seed|${model#*|} seed=$seed")
  done
done
run() {
  local name=${1%%|*} overrides=${1#*|}
  [ -f "$OUT/$name/metrics.json" ] && return 0
  rm -rf "${OUT:?}/$name"
  { date -u +%FT%TZ; lscpu | sed -n 's/^Model name: *//p'; } > "$OUT/$name.machine"  # where and when it ran
  # shellcheck disable=SC2086  # the overrides are words
  OMP_NUM_THREADS=$THREADS captioning-train experiment=flickr8k_1k $overrides hydra.run.dir="$OUT/$name" \
    trainer.progress=false > "$OUT/$name.log" 2>&1 || echo "$name failed: see $OUT/$name.log"
}
export -f run
printf '%s\n' "${runs[@]}" | xargs -P "${JOBS:-2}" -I{} bash -c 'run "$1"' _ {}
python experiments/flickr8k_1k_table.py "$out"
