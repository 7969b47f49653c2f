"""The fast path's per-layer host step with and without the all-hit shortcut (measured, this machine's CPU).

    python benchmarks/host_step_hit_path.py [--reps 4] [--tokens 32] [--out FILE]

Runs the graphed executor's decode step op by op on the CPU (no CUDA graphs; the host step, LayerRuntime.
decide_layer, is the same Python as on a GPU) with the shipped model, 25% cache, two prompts, for `resident`
and `lru`, alternating "hit path" (LayerPlanner.plan_hits as shipped) and "phases" (plan_hits switched off, so
every layer goes through plan_layer and plan_experts) in each repetition, and prints the median wall time of
one decide_layer call per repetition, in µs. Host times on the development CPU are larger than on a GPU
server's host; the ratio between the two modes is what carries over.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spice_core.api import RunSettings  # noqa: E402
from spice_core.engine import SpiceEngine  # noqa: E402
from spice_core.policy.planner import LayerPlanner  # noqa: E402
from spice_core.runtime.layer import LayerRuntime  # noqa: E402

PROMPTS = ("Tell me a story about a cat", "Once upon a time there was a fox")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=None, help="also write the printed lines here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    times: list[float] = []
    decide = LayerRuntime.decide_layer

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return decide(*a, **k)
        finally:
            times.append(time.perf_counter() - t)

    LayerRuntime.decide_layer = timed
    real_hits = LayerPlanner.plan_hits
    engine = SpiceEngine.load("assets/spice-mini", device="cpu", executor="graphed")
    res: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.reps):
        for policy in ("resident", "lru"):
            for mode in ("hit path", "phases"):
                LayerPlanner.plan_hits = real_hits if mode == "hit path" else (lambda self, layer, ids: None)
                times.clear()
                for prompt in PROMPTS:
                    for _step in engine.start_prompt(prompt, RunSettings(policy=policy, cache_frac=0.25,
                                                                         max_new_tokens=args.tokens,
                                                                         profile="h200-pcie5x16")):
                        pass
                res.setdefault((policy, mode), []).append(statistics.median(times) * 1e6)
    LayerPlanner.plan_hits = real_hits
    lines = [f"# measured: median wall µs of one decide_layer call per repetition; {platform.processor() or 'cpu'}, "
             f"torch {torch.__version__}, one thread, {args.reps} repetitions x {len(PROMPTS)} prompts x "
             f"{args.tokens} tokens",
             "| policy | host step | µs per repetition | median |", "|---|---|---|---|"]
    for (policy, mode), v in res.items():
        lines.append(f"| {policy} | {mode} | {', '.join(f'{x:.1f}' for x in v)} | {statistics.median(v):.1f} |")
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
