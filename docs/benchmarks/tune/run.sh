#!/usr/bin/env bash
# The tuner's picks for both shipped models at two hardware profiles, 25% budget, default quality budget
# (perplexity +1 % at most, greedy agreement 0.9 at least), modeled speed, quality on the CPU: screened on 128
# teacher-forced tokens and 3 prompts x 16 greedy tokens, a lossy pick confirmed on the CLI's default confirmation
# sample (512 tokens, 8 prompts x 32 greedy tokens, at most 3 settings). The models run side by side.
set -euo pipefail
cd "$(dirname "$0")/../../.."
for model in spice-mini spice-mini-qwen2; do
  for profile in h200-pcie5x16 rtx4090-pcie4x16; do
    /usr/bin/time -f "%e s" python -m spice_core tune --model "$model" --device cpu --profile "$profile" \
      --cache-frac 0.25 --budget-ppl 1 --budget-agreement 0.9 --max-tokens 128 --n-prompts 3 --new-tokens 16 --out "docs/benchmarks/tune/$model.json" \
      > "docs/benchmarks/tune/$model-$profile.txt" 2> "docs/benchmarks/tune/$model-$profile.log"
  done &
done
wait
