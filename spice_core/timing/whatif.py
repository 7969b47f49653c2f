"""What-if: a run's recorded routing replayed under another policy, in modeled time, without the model.

    recorded outcomes (layer, expert per decode token) ─► LayerPlanner (the real one) ─► ModeledTimeline
                                                        ─► modeled ms per token ─► median

Used to put a run beside its baselines ("1.6× faster than lru, 2.2× than on_demand, 1.3× the resident
floor") for the same routing. Only routing-pure policies can be replayed (resident, on_demand, lru): they
decide from the routing alone, so the replay makes exactly their decisions. The prefill is replayed for
the cache state it leaves (its experts per layer, in the engine's ascending order); its time is not
reported, and the number of prompt tokens each of its experts served is not recorded, so the first
decode steps may start from a slightly different copy-queue backlog than the run did.
Pure Python over plain data: no tensors.
"""
from __future__ import annotations

import statistics
from typing import Sequence

from spice_core.policy.cache import cache_slots_for_budget
from spice_core.policy.planner import LayerPlanner, Queues
from spice_core.policy.spec import get_spec
from spice_core.timing.costs import CostModel
from spice_core.timing.timeline import ModeledTimeline
from spice_core.types import ExpertKey

REPLAYABLE = ("resident", "on_demand", "lru")


def routing_of(steps) -> list[dict[int, list[int]]]:
    """Per step, the prefill first: MoE layer -> the experts it routed to."""
    out = []
    for st in sorted(steps, key=lambda s: s.index):
        by_layer: dict[int, list[int]] = {}
        for o in st.outcomes:
            by_layer.setdefault(o.layer, []).append(o.expert)
        out.append(by_layer)
    return out


def replay_tpot_ms(routing: Sequence[dict[int, list[int]]], policy: str, costs: CostModel, *, moe_layers: Sequence[int],
                   n_layers: int, n_experts: int, top_k: int, cache_frac: float, native_expert_bytes: int,
                   prompt_tokens: int = 1) -> float:
    """Median modeled ms per decode token of ``policy`` over the recorded routing (`routing_of`: the prefill's
    step first, of ``prompt_tokens`` tokens)."""
    if policy not in REPLAYABLE:
        raise ValueError(f"policy {policy!r} cannot be replayed from routing alone: use one of {REPLAYABLE}")
    spec = get_spec(policy)
    total = len(moe_layers) * n_experts
    n_slots = total if spec.preload_all else min(total, max(top_k, cache_slots_for_budget(
        int(cache_frac * total * native_expert_bytes), native_expert_bytes)))
    planner = LayerPlanner(spec, n_slots=n_slots, n_experts=n_experts, top_k=top_k, moe_layers=moe_layers, costs=costs)
    clock = ModeledTimeline(costs, native_expert_bytes=native_expert_bytes)
    if spec.preload_all:
        planner.place_static([ExpertKey(layer, e) for layer in moe_layers for e in range(n_experts)])
    before, prev = {}, -1
    for layer in moe_layers:
        before[layer] = tuple(range(prev + 1, layer + 1))
        prev = layer
    tail = tuple(range(prev + 1, n_layers))
    times = []
    for t, by_layer in enumerate(routing):
        planner.begin_token(t)
        clock.start_token(t)
        ready: dict[int, object] = {}
        T = prompt_tokens if t == 0 else 1
        for layer in moe_layers:
            for l_ in before[layer]:
                clock.layer(l_, T, dense=l_ != layer)
            experts = sorted(by_layer.get(layer, []))
            rows = [[e] for e in experts] if t == 0 else [experts]      # the prefill: one expert per row
            plan = planner.plan_layer(layer, rows, [[1.0] * len(r) for r in rows],
                                      Queues(clock.now_ms(), clock.copy_free_at_ms()))
            for order in plan.copies:
                ready[order.slot] = clock.copy(order.key, native_expert_bytes, order.kind)
            for run in planner.plan_experts(plan):
                if run.late_copy is not None:
                    ready[run.late_copy.slot] = clock.copy(run.late_copy.key, native_expert_bytes, "copy")
                handle = ready.pop(run.slot, None)
                if handle is not None:
                    clock.wait(handle)
                clock.gpu_expert(ExpertKey(layer, run.expert), 1)
        for l_ in tail:
            clock.layer(l_, 1, dense=True)
        ms = clock.end_token()
        clock.drain_events()
        if t > 0:
            times.append(ms)
    return statistics.median(times) if times else 0.0
