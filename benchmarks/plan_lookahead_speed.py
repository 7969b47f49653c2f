"""Host µs per lookahead plan: the plan as first written (per key) against the current one (per-layer rows).

    python benchmarks/plan_lookahead_speed.py [--model assets/spice-mini] [--tokens 24] [--repeats 5]

Records every `plan_lookahead` call of one `spice` generation of the shipped model on the CPU (the draft's
8 distances x 64 experts, the same shapes the lifted DeepSeek-V2-Lite plans over), then replays the recorded
calls through each implementation, interleaved, and prints the best of ``--repeats`` µs per call. The plans
must be equal call for call (checked). Timing label: *measured* (wall clock, this machine's CPU).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402

import spice_core.policy.planner as planner_module  # noqa: E402
from prefetch_reference import plan_lookahead_reference  # noqa: E402
from spice_core.api import RunSettings  # noqa: E402
from spice_core.engine import SpiceEngine  # noqa: E402
from spice_core.heldout import DEFAULT_PROMPTS  # noqa: E402
from spice_core.tools.args import int_in  # noqa: E402
from spice_core.policy.prefetch import plan_lookahead  # noqa: E402
from spice_core.policy.residency import Residency  # noqa: E402


def record_calls(model: Path | None, tokens: int) -> list[tuple[list, dict, Residency]]:
    """Every plan of one generation: its predictions, its arguments and a copy of the residency it saw."""
    calls = []

    def recording(preds, **kw):
        where = dict(kw["is_resident_or_inflight"])
        res = Residency(len(where))
        for key in where:
            res.assign(res.free_slot(), key, 0, prefetched=False)
        kw = {k: v for k, v in kw.items() if k not in ("is_resident_or_inflight", "on_way_rows")}
        calls.append((list(preds), kw, res))
        return plan_lookahead(preds, is_resident_or_inflight=where, **kw)

    planner_module.plan_lookahead = recording
    try:
        eng = SpiceEngine.load(model)
        st = RunSettings(policy="spice", cache_frac=0.25, max_new_tokens=tokens, tau_approx=0.05, tau_prefetch=0.2,
                         max_lookahead=4, lore_rank=4)
        list(eng.start_prompt(DEFAULT_PROMPTS[1], st))
    finally:
        planner_module.plan_lookahead = plan_lookahead
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--tokens", type=int_in(1), default=24)
    ap.add_argument("--repeats", type=int_in(1), default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    calls = record_calls(a.model, a.tokens)
    ways = {
        "current, asking a dict": lambda p, kw, res: plan_lookahead(p, is_resident_or_inflight=res.where, **kw),
        "current, per-layer rows": lambda p, kw, res: plan_lookahead(p, is_resident_or_inflight=res.where,
                                                                     on_way_rows=res.on_way_row, **kw),
    }
    # The first version predates the CPU lane's miss_ms and the LoRE admission's min_weight: compared only on plans
    # that use neither.
    if all(kw.get("miss_ms") is None and not kw.get("min_weight") for _, kw, _ in calls):
        ways = {"per key (first version)": lambda p, kw, res: plan_lookahead_reference(
            p, is_resident_or_inflight=res.where,
            **{k: v for k, v in kw.items() if k not in ("miss_ms", "min_weight")}), **ways}
    else:
        print("the first version is left out: these plans use miss_ms or min_weight, which it predates")
    plans = {name: [f(p, kw, res) for p, kw, res in calls] for name, f in ways.items()}
    first = next(iter(plans.values()))
    assert all(v == first for v in plans.values()), "the implementations disagree"
    best = {name: float("inf") for name in ways}
    for _ in range(a.repeats):
        for name, f in ways.items():
            t0 = time.perf_counter()
            for p, kw, res in calls:
                f(p, kw, res)
            best[name] = min(best[name], (time.perf_counter() - t0) / len(calls) * 1e6)
    print(f"measured on this CPU, {len(calls)} recorded plans of spice on the shipped model (best of {a.repeats}):")
    for name, us in best.items():
        print(f"  {name:26s} {us:7.1f} µs per plan")


if __name__ == "__main__":
    main()
