"""How many experts a MoE layer sends the CPU lane, per policy: the planner's own decisions over a modeled bench run.

    python benchmarks/lane_batches.py --config docs/benchmarks/headline/model-check/config-modeled-dsv2-x8-50-lane.json \\
        --budget 0.25 --prompts 3 --policies spice spice_no_lore cpu_compute

Runs ``bench`` on the config (modeled timing on this machine: the CPU lane is modeled, the planner is the real one)
with `LayerPlanner.plan_layer` observed, and prints per policy the share of decode-step MoE layers that send 0, 1, 2,
... experts to the lane, the mean, and the share of lane experts that sit in layers of 3 or more (those the auto
lane runs side by side, spice_core/exec/cpu_lane.py). The decisions are the modeled clock's, not a GPU run's.
"""
from __future__ import annotations

import collections
import contextlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))        # bench_args, when imported from elsewhere

import bench_args  # noqa: E402
from bench_args import ca  # noqa: E402
from spice_core.api import POLICIES  # noqa: E402
from spice_core.errors import SpiceError  # noqa: E402
from spice_core.policy import planner as planner_mod  # noqa: E402


def _config(ap, a) -> dict:
    """The config with the flags applied, checked as bench checks it (ap.error naming --config): bench itself runs
    a temporary copy, whose name its errors would give."""
    from spice_core.tools.bench import check_budgets_fit_the_model
    from spice_core.tools.bench_config import check_config, load_config_file

    try:
        cfg = load_config_file(a.config)
        if a.budget is not None:       # for every run: a run's own "budgets" would override the top level's
            cfg["budgets"] = [a.budget]
            if isinstance(cfg.get("runs"), list):
                cfg["runs"] = [{k: v for k, v in run.items() if k != "budgets"} if isinstance(run, dict) else run
                               for run in cfg["runs"]]
        if a.prompts is not None:
            cfg["prompts"] = {"heldout": a.prompts}
            cfg["runs"] = [{"long_prompt": False}]
        if a.policies:
            cfg["policies"] = a.policies
        check_config(cfg, f"--config {a.config} with the flags")
        check_budgets_fit_the_model(cfg)
    except SpiceError as e:
        ap.error(str(e))
    return cfg


def main(argv=None) -> int:
    ap = bench_args.Parser(prog=bench_args.prog(__file__), description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=ca.existing_file, required=True, help="a bench config of modeled timing")
    ap.add_argument("--budget", type=ca.float_in(0.0, 1.0, lo_open=True), default=None,
                    help="run at this budget alone, a fraction in (0, 1] (default: the config's)")
    ap.add_argument("--prompts", type=ca.positive_int, default=None, help="held-out prompts (default: the config's)")
    ap.add_argument("--policies", nargs="+", type=bench_args.one_of(POLICIES, "policy"), default=None)
    a = ap.parse_args(argv)
    cfg = _config(ap, a)
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
    if rc:
        return rc               # bench said why on stderr: no table of a run that did not happen
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
