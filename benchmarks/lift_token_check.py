"""Does the lift keep the miniature's greedy tokens? Where each prompt's text first differs, miniature against lift.

    python benchmarks/lift_token_check.py [--hidden 256] [--prompts 5] [--tau-approx 0.05]

Builds the shipped miniature and its lift to DeepSeek-V2-Lite's topology at widths a CPU host holds (``--hidden``;
experts 48 wide, dense MLP 768, kv_lora_rank unchanged), both on the graphed executor run op by op with modeled
timing, and for each of the sweep's held-out prompts generates 64 greedy tokens with `resident` and with `spice`
(τ_approx as given, LoRE rank 4, τ_prefetch 0.2, lookahead 4, no CPU lane) on each. Prints, per prompt, the first
token where resident-on-the-miniature and resident-on-the-lift differ, the same for spice, and where spice leaves
resident on each model ("·": never within 64). Timing label: none (tokens only, CPU).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spice_core.api import RunSettings  # noqa: E402
from spice_core.engine import SpiceEngine  # noqa: E402
from spice_core.tools.bench import heldout_prompt_ids  # noqa: E402
from spice_core.tools.lift import lift_artifacts, lifted_model  # noqa: E402
from spice_core.trace.metrics import first_divergence  # noqa: E402

MINI = Path("assets/spice-mini")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256, help="the lift's hidden width (the miniature's is 128)")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--tau-approx", type=float, default=0.05)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    mini = SpiceEngine.load(str(MINI), device="cpu", executor="graphed", timing="modeled")
    lm, tok, _ = lifted_model(MINI, "cpu", overrides={"hidden_size": args.hidden, "moe_intermediate_size": 48,
                                                      "intermediate_size": 768})
    lift = SpiceEngine(lm, timing="modeled", executor="graphed")
    lift.artifacts = lift_artifacts(MINI, lm)

    def tokens(eng, policy, ids):
        s = RunSettings(policy=policy, cache_frac=0.25, max_new_tokens=64, profile="h200-pcie5x16-graphed",
                        shape="deepseek-v2-lite", tau_approx=args.tau_approx, lore_rank=4, tau_prefetch=0.2,
                        max_lookahead=4, cpu_lane=False)
        return [st.token_id for st in eng.start_ids(ids, s)]

    def show(i):
        return "·" if i is None else str(i)

    print(f"# lift to hidden {args.hidden}, spice at tau_approx {args.tau_approx:g}: first differing token (of 64)")
    print("| prompt | resident: miniature vs lift | spice: miniature vs lift | spice vs resident, miniature | "
          "spice vs resident, lift |")
    print("|---|---|---|---|---|")
    for i, ids in enumerate(heldout_prompt_ids(tok, args.prompts)):
        rm, rl = tokens(mini, "resident", ids), tokens(lift, "resident", ids)
        sm, sl = tokens(mini, "spice", ids), tokens(lift, "spice", ids)
        print(f"| {i} | {show(first_divergence(rm, rl))} | {show(first_divergence(sm, sl))} | "
              f"{show(first_divergence(rm, sm))} | {show(first_divergence(rl, sl))} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
