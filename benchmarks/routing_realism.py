"""LRU expert-cache hit rates of the shipped miniatures at 10 / 25 / 50% budgets, and how skewed their routing is.

    python benchmarks/routing_realism.py [--models assets/spice-mini assets/spice-mini-qwen2] [--prompts 8]
        [--max-new-tokens 128] [--budgets 0.1 0.25 0.5] [--out docs/benchmarks/routing-realism]

The miniatures route like the real models they stand for (same MoE layers, experts and top-k), so a budget,
as a share of all routed experts, holds the same number of experts as on the real model: what differs is the
routing itself, learnt by a much smaller model. This measures it, per model and budget, over the model's
held-out bench prompts (greedy, batch 1, a fresh cache per prompt, as every engine run starts):

  engine lru         the engine's own `lru` policy (modeled timing on the CPU): one pool of slots shared by
                     every MoE layer, sized from the budget as any run's is. Hit rate over the decode steps,
                     read from the run's steps; the prefill fills the cache but is not counted (as in the
                     run summary's hit_rate).
  lru replay         the routing those runs recorded (the runtime's routing observer) replayed through the
                     engine's LayerPlanner with the lru spec and the run's slot count: equal to the run's own
                     hit rate by construction, and checked (a mismatch raises).
  lru per layer      the same replay with each MoE layer its own cache of budget x experts slots (a per-layer
                     expert cache, HybriMoE's for one); none where that is fewer than top-k slots a layer.
  static popular     the engine's cpu_compute placement: the experts most routed to on the calibration half
                     (the popularity beside the model), loaded once and never changed.
  static oracle      the budget's most-selected (layer, expert) pairs of these very decode steps: hindsight, so
                     an upper bound for any placement that never changes (per layer too).
Routing skew per MoE layer over the decode steps: usage entropy / log2(experts), the share of selections that
go to the layer's top 10 / 25 / 50% of experts, and the share of a token's experts the previous token also
selected in that layer (what an LRU cache lives on).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from spice_core.api import RunSettings, own_shape  # noqa: E402
from spice_core.machine import cpu_model_name  # noqa: E402
from spice_core.policy.cache import cache_slots_for_budget  # noqa: E402
from spice_core.policy.planner import LayerPlanner, Queues  # noqa: E402
from spice_core.policy.spec import get_spec  # noqa: E402
from spice_core.timing.costs import CostModel  # noqa: E402
from spice_core.timing.profiles import get_profile, get_shape  # noqa: E402
from spice_core.types import ExpertKey  # noqa: E402

PROFILE = "rtx4090-pcie4x16"     # any profile: lru decides from routing alone, and only hit rates are read here
TOP_SHARES = (0.10, 0.25, 0.50)
QUEUES = Queues(0.0, 0.0)        # lru never reads the clock


@dataclass
class EngineLru:
    """One budget's engine runs: decode-step hits and selections summed over prompts, the slot count the engine
    sized, and per prompt its routing (step -> MoE layer -> [T][K] expert rows; step 0 is the prefill) and tokens."""

    hits: int
    selections: int
    n_slots: int
    routing: list[list[dict[int, tuple]]]
    tokens: list[list[int]]


def run_engine_lru(engine, prompt_ids: list[list[int]], cache_frac: float, max_new_tokens: int) -> EngineLru:
    shape = own_shape(engine.info()) or "native"
    settings = RunSettings(policy="lru", cache_frac=cache_frac, max_new_tokens=max_new_tokens, profile=PROFILE,
                           shape=shape)
    hits = selections = 0
    n_slots, routing, tokens = -1, [], []
    for ids in prompt_ids:
        run = engine.start_ids(ids, settings)
        steps: dict[int, dict[int, tuple]] = collections.defaultdict(dict)
        run.observers.append(lambda layer, idx_rows, w_rows, run=run, steps=steps:
                             steps[run.token_index].__setitem__(layer, tuple(tuple(r) for r in idx_rows)))
        for st in run:
            if st.index > 0:                       # decode steps; step 0 is the prefill
                hits += st.hits
                selections += st.hits + st.misses
        rec = engine.get_record(run.run_id)
        n_slots = rec.totals["cache_slots"]
        routing.append([steps[t] for t in sorted(steps)])
        tokens.append(list(rec.token_ids))
    return EngineLru(hits, selections, n_slots, routing, tokens)


def replay_lru(routing: list[list[dict[int, tuple]]], *, n_slots: int, moe_layers: list[int], n_experts: int,
               top_k: int, costs: CostModel) -> tuple[int, int]:
    """(hits, selections) over the decode steps of the engine's LayerPlanner (lru) fed ``routing`` for
    ``moe_layers`` only, a fresh cache of ``n_slots`` per prompt; the prefill is replayed, not counted."""
    hits = selections = 0
    for steps in routing:
        planner = LayerPlanner(get_spec("lru"), n_slots=n_slots, n_experts=n_experts, top_k=top_k,
                               moe_layers=moe_layers, costs=costs)
        for t, by_layer in enumerate(steps):
            planner.begin_token(t)
            for layer in moe_layers:
                rows = by_layer[layer]
                plan = planner.plan_layer(layer, rows, [[1.0] * len(r) for r in rows], QUEUES)
                planner.plan_experts(plan)
                if t > 0:
                    hits += plan.hits
                    selections += plan.hits + plan.misses
    return hits, selections


def decode_counts(routing: list[list[dict[int, tuple]]]) -> collections.Counter:
    """Selections per ExpertKey over every prompt's decode steps."""
    counts: collections.Counter = collections.Counter()
    for steps in routing:
        for by_layer in steps[1:]:
            for layer, rows in by_layer.items():
                counts.update(ExpertKey(layer, e) for row in rows for e in row)
    return counts


def routing_skew(routing, moe_layers: list[int], n_experts: int) -> dict:
    """Per MoE layer over the decode steps: normalised usage entropy, top-share concentration, reuse."""
    counts = decode_counts(routing)
    per_layer = {}
    for layer in moe_layers:
        c = sorted((counts[ExpertKey(layer, e)] for e in range(n_experts)), reverse=True)
        total = sum(c) or 1
        entropy = -sum(n / total * math.log2(n / total) for n in c if n)
        kept = reused = 0
        for steps in routing:
            for prev, cur in zip(steps[1:], steps[2:]):
                now = {e for row in cur[layer] for e in row}
                kept += len(now & {e for row in prev[layer] for e in row})
                reused += len(now)
        per_layer[layer] = {
            "entropy_norm": entropy / math.log2(n_experts),
            **{f"top{round(s * 100)}pct_share": sum(c[: int(s * n_experts)]) / total for s in TOP_SHARES},
            "reuse_prev_token": kept / reused if reused else 0.0}
    keys = next(iter(per_layer.values())).keys()
    summary = {k: {"mean": sum(d[k] for d in per_layer.values()) / len(per_layer),
                   "min": min(d[k] for d in per_layer.values()), "max": max(d[k] for d in per_layer.values())}
               for k in keys}
    return {"summary": summary, "per_layer": {str(k): v for k, v in per_layer.items()}}


def static_hit_rate(counts: collections.Counter, keys) -> float:
    total = sum(counts.values())
    return sum(counts[k] for k in keys) / total if total else 0.0


def measure(engine, prompt_ids: list[list[int]], budgets: list[float], max_new_tokens: int) -> dict:
    """Every figure of one model at each budget (the script's core; fractions of routed experts in [0, 1])."""
    lm = engine.lm
    moe, E, K = list(lm.moe_layers), lm.n_experts, lm.top_k
    costs = CostModel(get_profile(PROFILE), get_shape("native", engine.native_shape))
    popular = list(engine.artifacts.popularity) if engine.artifacts and engine.artifacts.popularity else None
    rows, first = [], None
    for frac in budgets:
        t0 = time.perf_counter()
        run = run_engine_lru(engine, prompt_ids, frac, max_new_tokens)
        first = first or run
        hits, sel = replay_lru(run.routing, n_slots=run.n_slots, moe_layers=moe, n_experts=E, top_k=K, costs=costs)
        if (hits, sel) != (run.hits, run.selections):
            raise RuntimeError(f"budget {frac}: the lru replay counted {hits}/{sel} hits, the engine's runs "
                               f"{run.hits}/{run.selections}: the replay no longer follows the engine")
        per_layer_slots = cache_slots_for_budget(int(frac * E * lm.expert_bytes), lm.expert_bytes)
        pl_hits = pl_sel = 0
        if per_layer_slots >= K:     # the planner, like the engine, needs room for one token's top-k experts
            for layer in moe:
                h, s = replay_lru(run.routing, n_slots=per_layer_slots, moe_layers=[layer], n_experts=E, top_k=K,
                                  costs=costs)
                pl_hits, pl_sel = pl_hits + h, pl_sel + s
        counts = decode_counts(run.routing)
        oracle_per_layer = [k for layer in moe for k, _ in
                            sorted(((ExpertKey(layer, e), counts[ExpertKey(layer, e)]) for e in range(E)),
                                   key=lambda kv: (-kv[1], kv[0]))[:per_layer_slots]]
        rows.append({
            "budget": frac, "cache_slots": run.n_slots, "cache_slots_per_layer": per_layer_slots,
            "decode_selections": run.selections,
            "engine_lru_hit_rate": run.hits / run.selections if run.selections else 0.0,
            "lru_replay_equals_engine": True,
            "lru_per_layer_hit_rate": pl_hits / pl_sel if pl_sel else None,   # None: fewer slots a layer than top-k
            "static_popular_hit_rate": static_hit_rate(counts, popular[: run.n_slots]) if popular else None,
            "static_oracle_hit_rate": static_hit_rate(counts, [k for k, _ in counts.most_common(run.n_slots)]),
            "static_oracle_per_layer_hit_rate": static_hit_rate(counts, oracle_per_layer),
            "tokens_same_as_first_budget": run.tokens == first.tokens,
            "wall_s": time.perf_counter() - t0})
    return {"model": lm.name, "moe_layers": len(moe), "experts_per_layer": E, "top_k": K,
            "routed_experts": len(moe) * E, "prompts": len(prompt_ids),
            "prompt_tokens": [len(p) for p in prompt_ids],
            "decode_tokens": sum(len(t) - 1 for t in first.tokens) if first else 0,
            "budgets": rows, "routing_skew": routing_skew(first.routing, moe, E) if first else None}


def code_version() -> str:
    """The checkout's commit, and whether tracked files differ from it (the engine code that ran)."""
    try:
        git = ["git", "-C", str(ROOT)]
        sha = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return sha.stdout.strip() + (" with uncommitted edits" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    from spice_core.engine import SpiceEngine
    from spice_core.tools.args import int_in
    from spice_core.tools.bench import heldout_prompt_ids

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", type=Path,
                    default=[Path("assets/spice-mini"), Path("assets/spice-mini-qwen2")])
    ap.add_argument("--prompts", type=int_in(1), default=8, help="held-out bench prompts per model")
    ap.add_argument("--max-new-tokens", type=int_in(2), default=128)
    ap.add_argument("--budgets", nargs="+", type=float, default=[0.1, 0.25, 0.5],
                    help="GPU budgets as fractions of all routed experts")
    ap.add_argument("--out", type=Path, help="folder for results.json and README.md")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    models = []
    for folder in a.models:
        engine = SpiceEngine.load(folder, device="cpu", timing="modeled")
        ids = heldout_prompt_ids(engine.lm.tokenizer, a.prompts, folder)
        models.append(measure(engine, ids, sorted(a.budgets), a.max_new_tokens))
        print(json.dumps({m["budget"]: round(m["engine_lru_hit_rate"], 3) for m in models[-1]["budgets"]}))
    machine = (f"{cpu_model_name()}, {os.cpu_count()} cores, torch {torch.__version__}, "
               f"python {platform.python_version()}, 1 torch thread")
    results = {
        "what": "LRU expert-cache hit rates and routing skew of the shipped miniatures (decode steps, batch 1, greedy)",
        "timing": "modeled on the CPU (hit rates do not depend on timing)",
        "command": "python benchmarks/routing_realism.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "code": code_version(), "date": datetime.date.today().isoformat(), "machine": machine,
        "wall_s": round(time.perf_counter() - t0, 1), "models": models}
    if a.out:
        from benchmarks.routing_realism_report import report

        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        (a.out / "README.md").write_text(report(results))
        print(f"wrote {a.out / 'results.json'} and {a.out / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
