"""Quality of the headline run's lossy settings, measured on the miniature itself.

    python benchmarks/headline_quality.py --out docs/benchmarks/full-scale/headline/quality.json

The headline run (docs/benchmarks/full-scale/headline/) times the miniature lifted to
DeepSeek-V2-Lite's shapes on the GPU. Its lossy settings are `spice` and `spice_no_cpu` with LoRE
(tau_approx 0.05, rank 4); on the CUDA-graph fast path the CPU lane is off, so both run the same
decisions. This script measures their quality on the shipped miniature (`spice_core.tools.quality`:
teacher-forced perplexity change and mean KL against the exact model on the evaluation half of the
held-out set, and greedy agreement over held-out prompts), with the same settings: the budget, the
thresholds, the fast path's decision profile, DeepSeek-V2-Lite's expert sizes for every cost, and
the link's bandwidth. Timing here is modeled (quality does not depend on the clock), so the
per-token decisions follow the same rules as on the GPU but not necessarily the same clock
readings: the numbers are the quality of the setting, not of one GPU run's exact token stream.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the package without installing it

import torch

SETTINGS = dict(tau_approx=0.05, lore_rank=4, tau_prefetch=0.2, max_lookahead=4, cpu_lane=False,
                profile="h200-pcie5x16-graphed", shape="deepseek-v2-lite")
CASES = (("native", None, 0.25), ("pcie4x8", 13.0, 0.25), ("native", None, 0.10), ("pcie4x8", 13.0, 0.10),
         ("native", None, 0.50), ("pcie4x8", 13.0, 0.50))


def _cases(specs: list[str] | None) -> tuple:
    """``["native:0.25", ...]`` as CASES rows (link, emulated GB/s or None, budget)."""
    if not specs:
        return CASES
    known = {(link, budget): (link, gbps, budget) for link, gbps, budget in CASES}
    out = []
    for spec in specs:
        link, _, budget = spec.partition(":")
        try:
            key = (link, float(budget))
        except ValueError:
            key = None
        if key not in known:
            raise ValueError(f"--cases {spec!r} is not one of {', '.join(f'{l}:{b}' for l, b in known)}")
        out.append(known[key])
    return tuple(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model folder (default: the shipped miniature)")
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--tau-approx", type=float, default=SETTINGS["tau_approx"],
                    help="LoRE's gate-weight threshold (default: the headline run's)")
    ap.add_argument("--lore-rank", type=int, default=SETTINGS["lore_rank"], help="LoRE rank (default: the headline's)")
    ap.add_argument("--tau-prefetch", type=float, default=SETTINGS["tau_prefetch"],
                    help="the draft's prefetch confidence threshold (default: the headline's)")
    ap.add_argument("--max-lookahead", type=int, default=SETTINGS["max_lookahead"],
                    help="the lookahead's deepest layer distance (default: the headline's)")
    ap.add_argument("--cases", nargs="+", default=None, metavar="LINK:BUDGET",
                    help="only these settings, e.g. native:0.25 pcie4x8:0.25 (default: all six)")
    ap.add_argument("--shape", default=SETTINGS["shape"],
                    help="the real model whose expert sizes every cost uses (default: deepseek-v2-lite; "
                         "qwen2-57b-a14b for spice-mini-qwen2)")
    ap.add_argument("--cpu-lane", action="store_true",
                    help="offer the CPU lane, as bench does (the engine keeps it where it pays: the x8 link, not native)")
    ap.add_argument("--prefetch-admission", choices=("exact", "all"), default="exact",
                    help="spice's prefetch admission (the engine's default: exact; all is the rule before it)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        cases = _cases(args.cases)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from spice_core.config import SETTING_RANGES       # the engine's ranges (RunSettings takes the same)
    (ta_lo, ta_hi), (tp_lo, tp_hi), (la_lo, la_hi) = (SETTING_RANGES[k] for k in ("tau_approx", "tau_prefetch",
                                                                                   "max_lookahead"))
    for name, v, ok in (("--tau-approx", args.tau_approx, ta_lo <= args.tau_approx <= ta_hi),
                        ("--tau-prefetch", args.tau_prefetch, tp_lo <= args.tau_prefetch <= tp_hi),
                        ("--lore-rank", args.lore_rank, args.lore_rank >= 1),
                        ("--max-lookahead", args.max_lookahead, la_lo <= args.max_lookahead <= la_hi)):
        if not ok:
            print(f"error: {name} {v} is out of range (τ_approx in [{ta_lo:g}, {ta_hi:g}], τ_prefetch in "
                  f"[{tp_lo:g}, {tp_hi:g}], rank >= 1, lookahead {la_lo}..{la_hi})", file=sys.stderr)
            return 2
    from spice_core.timing.profiles import shape_names
    if args.shape not in shape_names():
        print(f"error: --shape {args.shape!r} is not one of {', '.join(shape_names())}", file=sys.stderr)
        return 2
    settings = dict(SETTINGS, shape=args.shape, tau_approx=args.tau_approx, cpu_lane=args.cpu_lane, lore_rank=args.lore_rank,
                    tau_prefetch=args.tau_prefetch, max_lookahead=args.max_lookahead)
    admission = args.prefetch_admission
    torch.set_num_threads(1)
    from spice_core.api import RunSettings
    from spice_core.engine import SpiceEngine
    from spice_core.tools.quality import eval_set, evaluate, exact_reference

    base_engine = SpiceEngine.load(args.model, device="cpu", timing="modeled")
    data = eval_set(base_engine, max_tokens=args.max_tokens, n_prompts=args.n_prompts)
    base = replace(RunSettings(), **settings)
    t0 = time.time()
    ref = exact_reference(base_engine, data, args.new_tokens, base=base)
    rows = []
    for link, gbps, budget in cases:
        eng = SpiceEngine(base_engine.lm, timing="modeled", link_gbps=gbps, prefetch_admission=admission)
        eng.artifacts = base_engine.artifacts
        rep = evaluate(eng, replace(base, policy="spice", cache_frac=budget), ref)
        # without the lane spice_no_cpu makes spice's decisions; with it they differ where the lane is kept
        same = ["spice", "spice_no_cpu"] if not args.cpu_lane else ["spice"]
        # The lifted model's name in bench's records ("lift:<folder>"): the headline report matches rows by it.
        row = {"model": f"lift:{Path(base_engine.lm.path).name}", "link": link, "budget_frac": budget,
               "policies": same, **rep.as_dict()}
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("link", "budget_frac", "ppl_delta_pct", "mean_kl", "greedy_agreement",
                                               "approx_share")}), flush=True)
    out = {"timing": "modeled (quality is measured; decisions replayed with the profile below)",
           "settings": dict(settings, prefetch_admission=admission),
           "tokens": rows[0]["tokens"] if rows else 0, "source": data.source, "seconds": round(time.time() - t0, 1),
           "command": "python benchmarks/headline_quality.py " + " ".join(argv if argv is not None else sys.argv[1:]), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
