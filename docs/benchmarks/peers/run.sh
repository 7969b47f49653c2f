#!/usr/bin/env bash
# The peer rows on the GPU machine (see README.md beside this file), from the repository root:
#     bash docs/benchmarks/peers/run.sh OUT_DIR [CONFIG]
# CONFIG defaults to config.json beside this file (DeepSeek-V2-Lite shapes); config-qwen2.json is the second model.
# Writes OUT_DIR/results.json (bench's records), OUT_DIR/results.md and OUT_DIR/run.log.
set -euo pipefail
out=${1:?usage: bash docs/benchmarks/peers/run.sh OUT_DIR [CONFIG]}
here=$(dirname "$0")
config=${2:-$here/config.json}
mkdir -p "$out"
python benchmarks/peers.py --config "$config" --out "$out" 2>&1 | tee "$out/run.log"
