#!/usr/bin/env bash
# The decoders side by side on `shapes` (experiments/README.md, "Decoders on shapes"): Show-Attend-Tell with soft and
# with hard attention, Up-Down, the Transformer and the zoo (Show and Tell, Att2in, Att2all, adaptive attention, AoA,
# M2; and the adaptive model without its sentinel, Lu et al.'s spatial attention ablation), each trained with
# cross-entropy (the shapes defaults) and then fine-tuned with SCST (objective=scst, mean-of-samples baseline) from
# its best checkpoint; test split, beam 3.
#
#   experiments/decoders_shapes.sh [OUT]
#   MODELS="fc aoa" XE_ONLY=1 experiments/decoders_shapes.sh [OUT]      some models, cross-entropy only
#
# OUT  where the runs go (default: outputs/decoders_shapes); finished runs there are kept, not rerun; each run's
#      wall time (s) is appended to OUT/wall_seconds.txt.
# Prints the Markdown table (also written to experiments/decoders_shapes.md) and draws SAT soft's and the
# Transformer's attention on the same test image side by side (experiments/figures/decoders_sat_vs_transformer.png),
# and the zoo's attention models' on one test image (experiments/figures/decoders_zoo.jpg).
# Environment: XE_ARGS / SCST_ARGS, overrides added to every cross-entropy / SCST run.
set -euo pipefail
out=${1:-outputs/decoders_shapes}
mkdir -p "$out" experiments/figures
declare -A model=([sat_soft]="attention=soft" [sat_hard]="attention=hard" [updown]="decoder=updown"
                  [transformer]="decoder=transformer" [fc]="decoder=fc" [att2in]="decoder=att2in"
                  [att2all]="decoder=att2all" [adaptive]="decoder=adaptive" [aoa]="decoder=aoa" [m2]="decoder=m2"
                  [adaptive_spatial]="decoder=adaptive decoder.sentinel=false")
read -r -a names <<< "${MODELS:-sat_soft sat_hard updown transformer fc att2in att2all adaptive aoa m2 adaptive_spatial}"
run() {  # run DIR OVERRIDES...: one training into DIR unless it finished there, its wall time logged
  local dir=$1; shift
  [ -f "$dir/metrics.json" ] && return
  local start=$SECONDS
  captioning-train "$@" hydra.run.dir="$dir" trainer.progress=false
  echo "$(basename "$dir") $((SECONDS - start))" >> "$out/wall_seconds.txt"
}
for name in "${names[@]}"; do
  xe=$out/xe_$name
  run "$xe" ${model[$name]} ${XE_ARGS:-}
  [ -n "${XE_ONLY:-}" ] || run "$out/scst_$name" ${model[$name]} objective=scst init_from="$xe/checkpoints/best.pt" \
    ${SCST_ARGS:-}
done
python experiments/decoders_table.py "$out" experiments/decoders_shapes.md experiments/figures/decoders_sat_vs_transformer.png
