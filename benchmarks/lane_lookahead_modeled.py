"""spice with the CPU lane, modeled: where its prefetches go and what the token costs.

    python benchmarks/lane_lookahead_modeled.py [--link-gbps 13] [--prompts 3] [--tokens 32] [--out FILE.json]

Runs `spice` (the headline's setting: τ_approx 0.05, LoRE rank 4, τ_prefetch 0.2, max lookahead 4) on the
shipped miniature at DeepSeek-V2-Lite's shape with the fast path's decision profile (h200-pcie5x16-graphed),
25% budget, over the first held-out prompts, and follows every prefetch to the layer it was for: used there
(a prefetch hit), the expert selected but computed another way (CPU lane, LoRE), or not selected. Prints the
modeled TPOT and those shares. Timing label: *modeled* (the planner's cost model; no GPU). It follows the
prefetches by wrapping `LayerPlanner.prefetch_issued` and `Recorder.layer_outcomes`, which every commit since
the CPU lane has, so the same command measures a commit before a change and after it.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from spice_core.api import RunSettings  # noqa: E402
from spice_core.policy.planner import LayerPlanner  # noqa: E402
from spice_core.trace.recorder import Recorder  # noqa: E402
from spice_core.engine import SpiceEngine  # noqa: E402
from spice_core.heldout import DEFAULT_PROMPTS  # noqa: E402
from spice_core.tools.args import int_in  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--link-gbps", type=float, default=13.0,
                    help="emulated link rate (default: PCIe 4.0 x8's 13; 0: the profile's native link)")
    ap.add_argument("--prompts", type=int_in(1), default=3)
    ap.add_argument("--tokens", type=int_in(1), default=32)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(1)
    base = SpiceEngine.load(None, device="cpu", timing="modeled")
    eng = SpiceEngine(base.lm, timing="modeled", link_gbps=a.link_gbps if a.link_gbps > 0 else None)
    eng.artifacts = base.artifacts
    st = replace(RunSettings(), policy="spice", cache_frac=0.25, max_new_tokens=a.tokens, tau_approx=0.05, lore_rank=4,
                 tau_prefetch=0.2, max_lookahead=4, profile="h200-pcie5x16-graphed", shape="deepseek-v2-lite")
    fate: collections.Counter = collections.Counter()
    pending: set = set()
    issued, outcomes = LayerPlanner.prefetch_issued, Recorder.layer_outcomes

    def on_issued(self, order, *args, **kw):
        pending.add(order.key)
        return issued(self, order, *args, **kw)

    def on_outcomes(self, layer, experts, outs):
        selected = set(experts)
        for key in [k for k in pending if k.layer == layer]:
            pending.discard(key)
            fate[outs[key.expert] if key.expert in selected else "not selected"] += 1
        return outcomes(self, layer, experts, outs)

    LayerPlanner.prefetch_issued, Recorder.layer_outcomes = on_issued, on_outcomes
    tpot, steps = [], 0
    try:
        for prompt in DEFAULT_PROMPTS[: a.prompts]:
            run = eng.start_prompt(prompt, st)
            for _ in run:
                steps += 1
            tpot.append(eng.get_summary(run.run_id).tpot_ms_median)
    finally:
        LayerPlanner.prefetch_issued, Recorder.layer_outcomes = issued, outcomes
    total = sum(fate.values()) or 1
    out = {"timing": "modeled", "link_gbps": a.link_gbps or "native", "prompts": a.prompts, "tokens": a.tokens,
           "tpot_ms_median_per_prompt": [round(t, 2) for t in tpot], "tpot_ms_mean_of_medians": round(statistics.mean(tpot), 2),
           "prefetches_per_token": round(total / steps, 1),
           "prefetch_fate": {k: round(v / total, 3) for k, v in fate.most_common()},
           "command": "python benchmarks/lane_lookahead_modeled.py " + " ".join(sys.argv[1:])}
    print(json.dumps(out, indent=1))
    if a.out:
        a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
