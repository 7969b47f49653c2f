"""How many experts a MoE layer sends the CPU lane, per policy: the planner's own decisions over a modeled bench run.

    python benchmarks/lane_batches.py --config docs/benchmarks/headline/model-check/config-modeled-dsv2-x8-50-lane.json \\
        --budget 0.25 --prompts 3 --policies spice spice_no_lore cpu_compute

Runs ``bench`` on the config (modeled timing on this machine: the CPU lane is modeled, the planner is the real one)
with `LayerPlanner.plan_layer` observed, and prints per policy the share of decode-step MoE layers that send 0, 1, 2,
... experts to the lane, the mean, and the share of lane experts that sit in layers of 3 or more (those the auto
lane runs side by side, spice_core/exec/cpu_lane.py). The decisions are the modeled clock's, not a GPU run's.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spice_core.policy import planner as planner_mod  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, required=True, help="a bench config of modeled timing")
    ap.add_argument("--budget", type=float, default=None, help="run at this budget alone (default: the config's)")
    ap.add_argument("--prompts", type=int, default=None, help="held-out prompts (default: the config's)")
    ap.add_argument("--policies", nargs="+", default=None)
    a = ap.parse_args(argv)
    try:
        cfg = json.loads(a.config.read_text())
    except (OSError, ValueError) as err:
        ap.error(f"--config {a.config}: {err}")
    if not isinstance(cfg, dict):
        ap.error(f"--config {a.config}: not a bench config (a JSON object)")
    if a.budget is not None:
        cfg["budgets"] = [a.budget]
    if a.prompts is not None:
        cfg["prompts"] = {"heldout": a.prompts}
        cfg["runs"] = [{"long_prompt": False}]
    if a.policies:
        cfg["policies"] = a.policies
    hist: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    plan_layer = planner_mod.LayerPlanner.plan_layer

    def observed(self, layer, idx_rows, w_rows, queues):
        plan = plan_layer(self, layer, idx_rows, w_rows, queues)
        if len(idx_rows) == 1:          # a decode step's layer (the prompt's are not the lane's steady state)
            hist[self.spec.name][len(plan.cpu)] += 1
        return plan

    planner_mod.LayerPlanner.plan_layer = observed
    from spice_core.tools.cli import main as cli
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(cfg))
        with contextlib.redirect_stdout(sys.stderr):     # bench's own table: this script prints the counts alone
            rc = cli(["bench", "--config", str(path), "--out", str(Path(tmp) / "out")])
    print("The planner's own decisions over a modeled bench run (timing modeled; the counts are decisions, not times).\n")
    print("| policy | decode-step MoE layers | lane experts a layer | share of layers sending 0 / 1 / 2 / 3 / 4 / 5 / 6+ "
          "| share of lane experts in layers of 3+ |")
    print("|---|---|---|---|---|")
    for pol, h in hist.items():
        n, jobs = sum(h.values()), sum(k * v for k, v in h.items())
        shares = [h[k] / n for k in range(6)] + [sum(v for k, v in h.items() if k >= 6) / n]
        big = sum(k * v for k, v in h.items() if k >= 3) / max(1, jobs)
        print(f"| {pol} | {n} | {jobs / n:.2f} | {' / '.join(f'{s:.2f}' for s in shares)} | {big:.2f} |")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
