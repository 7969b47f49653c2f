"""The table of a CPU-decode round from `engine_cpu_speed.py --json` files (measured, this machine's CPU time).

    python benchmarks/cpu_decode_table.py docs/benchmarks/cpu-decode/round3-before-{1,2,3}.json \
        --after docs/benchmarks/cpu-decode/round3-{1,2,3}.json

Per policy, over all runs of the files given: the median decode tokens per CPU-second (min-max), the 10th
percentile of single decode steps' CPU time (pooled), and the median over every lockstep pair of the engine's
step time over stock transformers' (``--paired``). With ``--after``, one row per policy compares the two sets.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

STOCK = "transformers_batched_mm_fp32"


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def summarise(paths: list[str]) -> dict:
    """{policy: (median rate, min, max, p10 step ms, lockstep ratio or None, n pairs)} over ``paths``."""
    out = {}
    data = [json.load(open(p)) for p in paths]
    policies = [k for k in data[0]["runs"]]
    for pol in policies:
        rates = [r["tokens_per_cpu_s"] for d in data for r in d["runs"][pol]]
        steps = [s for d in data for r in d["runs"][pol] for s in r["step_cpu_ms"]]
        pairs = [e / s for d in data for e, s in d.get("paired_step_cpu_ms", {}).get(pol, [])]
        out[pol] = (statistics.median(rates), min(rates), max(rates), _pct(steps, 0.10),
                    statistics.median(pairs) if pairs else None, len(pairs))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", nargs="+", help="engine_cpu_speed.py --json files")
    ap.add_argument("--after", nargs="+", default=None, help="a second set to compare with the first")
    args = ap.parse_args(argv)
    a = summarise(args.before)
    b = summarise(args.after) if args.after else None

    def cells(s):
        rate, lo, hi, p10, ratio, _ = s
        return f"{rate:.1f} ({lo:.1f}–{hi:.1f})", f"{p10:.1f}", "–" if ratio is None else f"{ratio:.3f}"

    if b is None:
        print("| | tokens per CPU-second | 10th-percentile step (ms) | step ÷ stock step |\n|---|---|---|---|")
        for pol, s in a.items():
            print(f"| `{pol}` | " + " | ".join(cells(s)) + " |")
        return 0
    print("| | tokens per CPU-second, before | after | 10th-percentile step, before → after (ms) "
          "| step ÷ stock step, before → after | lockstep pairs |\n|---|---|---|---|---|---|")
    for pol in a:
        if pol not in b:
            continue
        ca, cb = cells(a[pol]), cells(b[pol])
        pairs = f"{a[pol][5]} / {b[pol][5]}" if a[pol][5] else "–"
        print(f"| `{pol}` | {ca[0]} | {cb[0]} | {ca[1]} → {cb[1]} | {ca[2]} → {cb[2]} | {pairs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
