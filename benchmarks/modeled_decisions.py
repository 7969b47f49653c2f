"""Every modeled decision of the shipped model's runs, dumped to compare two checkouts of the engine.

    PYTHONPATH=. python benchmarks/modeled_decisions.py dump before.json      # on one checkout
    PYTHONPATH=. python benchmarks/modeled_decisions.py dump after.json       # on the other
    python benchmarks/modeled_decisions.py compare before.json after.json

57 runs: every policy x (rtx4090-pcie4x16 and h200-pcie5x16-host at the deepseek-v2-lite shape,
rtx4090-pcie4x16 at the native shape) x 25% and 50% cache (resident at 25% only), 20 tokens each. The
model computes in float32 on both checkouts, so that both see the same routing and only the engine's
decisions can differ. Per run: the tokens, each step's modeled time, hits, misses, bytes, stall,
lookahead depth and stops, outcomes and prefetch records, every trace event, the run's totals and notes.
``compare`` prints the runs that differ and what differs; exit status 1 when any does.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the package without installing it

MODEL = "assets/spice-mini"
PROMPT = "Tell me a story about a cat and a ball"
POLICIES = ("resident", "on_demand", "lru", "cpu_compute", "gate_prefetch", "spice_prefetch", "oracle_prefetch",
            "spice", "spice_no_lore", "spice_no_cpu")
SETTINGS = (("rtx4090-pcie4x16", "deepseek-v2-lite"), ("h200-pcie5x16-host", "deepseek-v2-lite"),
            ("rtx4090-pcie4x16", "native"))


def dump(path: str) -> int:
    import torch

    from spice_core.api import RunSettings
    from spice_core.engine import SpiceEngine
    from spice_core.model.loader import load_model

    torch.set_num_threads(1)
    eng = SpiceEngine(load_model(MODEL, "cpu", dtype=torch.float32))
    eng.load_artifacts()
    out = []
    for policy in POLICIES:
        for profile, shape in SETTINGS:
            for frac in (0.25, 0.5):
                if policy == "resident" and frac == 0.5:
                    continue
                s = RunSettings(policy=policy, profile=profile, shape=shape, cache_frac=frac, max_new_tokens=20,
                                tau_approx=0.05 if policy in ("spice", "spice_no_cpu") else 0.0)
                run = eng.start_prompt(PROMPT, s)
                steps = list(run)
                rec = eng.get_record(run.run_id)
                out.append({
                    "case": f"{policy}/{profile}/{shape}/{frac}",
                    "tokens": [st.token_id for st in steps],
                    "steps": [[st.step_ms, st.hits, st.misses, st.bytes_copied, st.shape_bytes_copied, st.stall_ms,
                               st.lookahead_depth, list(st.lookahead_stops),
                               [[o.layer, o.expert, o.outcome] for o in st.outcomes],
                               [[p.layer, p.expert, p.issued_at_layer, p.issued_ms, p.arrived_ms, p.needed_ms,
                                 p.confidence] for p in st.prefetches], len(st.intervals)] for st in steps],
                    "events": [[e.token, e.layer, e.expert, e.lane, e.kind, e.start_ms, e.end_ms, e.bytes, e.detail]
                               for e in rec.events],
                    "totals": rec.totals, "notes": list(rec.notes)})
    with open(path, "w") as f:
        json.dump(out, f, default=str)
    print(f"{len(out)} runs, {sum(len(r['events']) for r in out)} events -> {path}")
    return 0


def compare(a_path: str, b_path: str) -> int:
    with open(a_path) as f:
        a = json.load(f)
    with open(b_path) as f:
        b = json.load(f)
    if [r["case"] for r in a] != [r["case"] for r in b]:
        print("the two dumps hold different runs")
        return 1
    differ = 0
    for x, y in zip(a, b):
        keys = [k for k in x if x[k] != y.get(k)]
        if keys:
            differ += 1
            print(f"{x['case']}: {', '.join(keys)} differ")
    print(f"{len(a) - differ} of {len(a)} runs identical ({sum(len(r['events']) for r in a)} events)")
    return 1 if differ else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "dump":
        sys.exit(dump(args[1]))
    if len(args) == 3 and args[0] == "compare":
        sys.exit(compare(args[1], args[2]))
    print(__doc__)
    sys.exit(2)
