#!/usr/bin/env bash
# The decoders side by side on `shapes` (experiments/README.md, "Decoders on shapes"): Show-Attend-Tell with soft and
# with hard attention, Up-Down and the Transformer, each trained with cross-entropy (the shapes defaults) and then
# fine-tuned with SCST (objective=scst, mean-of-samples baseline) from its best checkpoint; test split, beam 3.
#
#   experiments/decoders_shapes.sh [OUT]
#
# OUT  where the runs go (default: outputs/decoders_shapes); finished runs there are kept, not rerun.
# Prints the Markdown table (also written to experiments/decoders_shapes.md) and draws SAT soft's and the
# Transformer's attention on the same test image side by side (experiments/figures/decoders_sat_vs_transformer.png).
# Environment: XE_ARGS / SCST_ARGS, overrides added to every cross-entropy / SCST run.
set -euo pipefail
out=${1:-outputs/decoders_shapes}
mkdir -p "$out" experiments/figures
declare -A model=([sat_soft]="attention=soft" [sat_hard]="attention=hard" [updown]="decoder=updown"
                  [transformer]="decoder=transformer")
names=(sat_soft sat_hard updown transformer)
for name in "${names[@]}"; do
  xe=$out/xe_$name
  [ -f "$xe/metrics.json" ] || captioning-train ${model[$name]} hydra.run.dir="$xe" trainer.progress=false ${XE_ARGS:-}
  scst=$out/scst_$name
  [ -f "$scst/metrics.json" ] || captioning-train ${model[$name]} objective=scst init_from="$xe/checkpoints/best.pt" \
    hydra.run.dir="$scst" trainer.progress=false ${SCST_ARGS:-}
done
python experiments/decoders_table.py "$out" experiments/decoders_shapes.md experiments/figures/decoders_sat_vs_transformer.png
