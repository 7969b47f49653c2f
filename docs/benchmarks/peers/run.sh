#!/usr/bin/env bash
# The peer rows on the GPU machine (see README.md beside this file), from the repository root:
#     bash docs/benchmarks/peers/run.sh OUT_DIR
# writes OUT_DIR/results.json (bench's records), OUT_DIR/results.md and OUT_DIR/run.log.
set -euo pipefail
out=${1:?usage: bash docs/benchmarks/peers/run.sh OUT_DIR}
here=$(dirname "$0")
mkdir -p "$out"
python benchmarks/peers.py --config "$here/config.json" --out "$out" 2>&1 | tee "$out/run.log"
