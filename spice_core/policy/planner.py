"""LayerPlanner: every decision of one MoE layer, as plain data; all policy state lives here.

    routing lists ─► plan_layer  ─► LayerPlan: outcome per expert, CPU tasks, demand copies (slot, victim)
    predictions   ─► plan_prefetch ─► PrefetchOrders: copies into slots for layers ahead (+ depth, stop reason)
                     plan_experts ─► ExpertRuns: per expert in ascending order, late demand copies, drops
    executed copy ─► prefetch_issued (the in-flight table learns the copy's arrival time)
    one token     ─► plan_hits (all plain hits, a policy that never prefetches): both phases in one call

A layer is planned in phases because the mechanism interleaves them: the CPU tasks and
demand copies go out first, the lookahead plan is made either before the experts (no host
cost: modeled timing) or after they are launched (a real GPU at batch 1), and demand copies
that find no free slot are placed while the experts run, into slots the layer's earlier
experts free up. The planner replays exactly that order on its book (`Residency`), so the
executor only carries the plan out.

State kept here and nowhere else: the residency book, the recent miss rate (an EMA), the
predicted next use of each expert, the in-flight prefetch table, the tick and position
counters. Pure: plain numbers in, plain data out; no tensors, streams or clocks (times come
in as `Queues`, read by the caller from its clock). Decisions come from `policy/miss.py`,
`policy/prefetch.py` and `policy/cache.py`; this module only sequences them.
"""
from __future__ import annotations

import math
from typing import AbstractSet, Sequence

from spice_core.errors import ConfigError
from spice_core.policy.cache import EVICTION_POLICIES, FarthestNextUseEviction
from spice_core.policy.miss import MissAction, MissOptions, MissRequest, QueueState, plan_misses
from spice_core.policy.plans import (CopyOrder, CpuTasks, ExpertRun, InflightPrefetch, LayerPlan, PlanCosts,  # noqa: F401
                                     PrefetchOrders, Queues, int8_tasks)
from spice_core.policy.prefetch import LayerPrediction, h_min, plan_lookahead, plan_pays
from spice_core.policy.residency import Residency
from spice_core.policy.spec import PolicySpec
from spice_core.types import ExpertKey

# Outcome names of a routed selection (trace.events.OUTCOMES); MissAction values are the miss ones.
HIT, PREFETCH_HIT = "hit", "prefetch_hit"
# ... as plain strings: an Enum member's .value is a descriptor call, and these are compared per expert.
_APPROX, _CPU, _COPY = MissAction.APPROX.value, MissAction.CPU.value, MissAction.COPY.value
_CPU_INT8 = MissAction.CPU_INT8.value
_ACTION_NAMES = {a: a.value for a in MissAction}
# How the lookahead admits a prefetch where the policy approximates cheap misses (LayerPlanner).
PREFETCH_ADMISSIONS = ("exact", "all")


def check_prefetch_admission(value: str) -> str:
    if value not in PREFETCH_ADMISSIONS:
        raise ConfigError(f"prefetch_admission={value!r} is unknown: use one of {', '.join(PREFETCH_ADMISSIONS)}")
    return value


class LayerPlanner:
    def __init__(self, spec: PolicySpec, *, n_slots: int, n_experts: int, top_k: int,
                 moe_layers: Sequence[int], costs: PlanCosts, tau_prefetch: float = 0.2,
                 tau_approx: float = 0.0, max_lookahead: int = 4, can_approx: bool = False,
                 can_cpu: bool = False, host_aware: bool = True, tau_int8: float = 0.0,
                 can_int8: bool = False, prefetch_admission: str = "exact") -> None:
        """``tau_int8``/``can_int8``: misses below that router weight may run on the CPU lane from the int8 copy
        (lossy; the engine offers it only to policies that may be lossy, `PolicySpec.use_int8`).
        ``prefetch_admission``: "exact" prefetches, for a policy that approximates, only experts whose predicted
        router weight reaches tau_approx (the others' misses are approximated, so their copies buy no time);
        "all" also copies those (an A/B of that rule)."""
        self.prefetch_admission = check_prefetch_admission(prefetch_admission)
        self.spec, self.costs = spec, costs
        self.n_experts, self.top_k = n_experts, top_k
        self.moe_pos = {layer: p for p, layer in enumerate(moe_layers)}
        self.n_moe = len(self.moe_pos)
        self.tau_prefetch, self.tau_approx, self.max_lookahead = tau_prefetch, tau_approx, max_lookahead
        self.can_approx, self.can_cpu, self.host_aware = can_approx, can_cpu, host_aware
        self.tau_int8, self.can_int8 = tau_int8, can_int8 and tau_int8 > 0
        self.residency = Residency(n_slots)
        self.eviction = EVICTION_POLICIES[spec.eviction]()
        self.tick = 0
        self.token = 0
        self.global_pos = 0
        self.miss_rate_ema = 1.0
        self.next_use_abs: dict[ExpertKey, int] = {}
        self.inflight: dict[ExpertKey, InflightPrefetch] = {}
        # What the costs come to, asked once: the cost model is fixed for the planner's life, and these were
        # recomputed for every layer.
        self._copy_ms = costs.copy_ms()
        self._layer_ms = costs.gpu_layer_ms() + top_k * costs.gpu_expert_ms()
        self._plan_ms = costs.profile.host_plan_us / 1e3
        self._lane_ms = self._lane_miss_ms()     # the lookahead asks every layer; spec, lane and costs are fixed
        # What a later miss of a cached expert would cost (the copy's caching credit), and the miss options per
        # live threshold: fixed but for tau_approx (set_thresholds), and each layer built them anew.
        lane = spec.use_cpu and can_cpu
        self._later_miss_ms = min(self._copy_ms, costs.cpu_expert_ms(1)) if lane else self._copy_ms
        self._miss_opts: dict[tuple[float, float], MissOptions] = {}
        self._expert_ms: dict[int, tuple] = {}   # n_tokens -> (CPU lane, GPU, CPU lane while the link reads the
                                                 # same DRAM, the int8 run, the int8 run so) ms of one expert
        # Each MoE layer's ExpertKeys, made once: a layer's plan looks up a dozen or more of them.
        self._keys = {layer: tuple(ExpertKey(layer, e) for e in range(n_experts)) for layer in moe_layers}

    # ------------------------------------------------------------------ set-up and settings
    def place_static(self, keys: Sequence[ExpertKey]) -> list[tuple[int, ExpertKey]]:
        """Fill the cache once (resident, cpu_compute): (slot, key) pairs for the executor to load."""
        placed = []
        for key in keys[: self.residency.n_slots]:
            slot = self.residency.free_slot()
            self.residency.assign(slot, key, self.tick, prefetched=False)
            placed.append((slot, key))
        return placed

    def begin_token(self, token: int) -> None:
        self.token = token

    @property
    def prefetching(self) -> bool:
        return self.spec.prefetches

    def plan_pays(self) -> bool:
        """With host costs in the profile: is this layer's lookahead plan worth its host time?"""
        if not self.host_aware:
            return True
        return plan_pays(self._plan_ms, self.miss_rate_ema, self.top_k, self._copy_ms)

    # ------------------------------------------------------------------ phase 1: the layer's misses
    def plan_layer(self, layer: int, idx_rows: Sequence[Sequence[int]], w_rows: Sequence[Sequence[float]],
                   queues: Queues) -> LayerPlan:
        """idx_rows/w_rows [T][K]: the router's choice per token. Classifies each needed expert,
        decides each miss and places the demand copies that fit without touching this layer."""
        self.global_pos = self.token * self.n_moe + self.moe_pos[layer]
        keys, n_experts = self._keys[layer], self.n_experts
        routes: dict[int, tuple[list[int], list[int]]] = {}
        for t, row in enumerate(idx_rows):
            for pos, e in enumerate(row):
                if 0 <= e < n_experts:
                    route = routes.get(e)
                    if route is None:
                        routes[e] = ([t], [pos])
                    else:
                        route[0].append(t)
                        route[1].append(pos)
        needed = sorted(routes)
        self.tick += 1
        res = self.residency
        where, state = res.where, res.state
        outcomes: dict[int, str] = {}
        hits = misses_sel = n_miss = 0
        misses: list[tuple[int, float, int]] = []     # (expert, largest router weight (orchestrating only), tokens)
        orchestrate, now = self.spec.miss_mode == "orchestrate", queues.now_ms
        for e in needed:
            key = keys[e]
            slot = where.get(key)
            if slot is not None:
                st = state[slot]
                inf = self.inflight.get(key) if st.prefetched else None
                if not (orchestrate and inf is not None and inf.arrival_ms > now):
                    outcomes[e] = PREFETCH_HIT if st.prefetched else HIT
                    st.busy = True
                    hits += len(routes[e][0])
                    continue
                # A prefetch still in flight: the miss decision weighs waiting for it against the others.
            toks, poss = routes[e]
            if not orchestrate:          # only weighed there
                weight = 0.0
            elif len(toks) == 1:         # one selection (a decode step): its weight
                weight = w_rows[toks[0]][poss[0]]
            else:
                weight = max(w_rows[t][p] for t, p in zip(toks, poss))
            misses.append((e, weight, len(toks)))
        for (e, _, n_sel), action in zip(misses, self._decide_misses(layer, misses, queues)):
            if action == MissAction.WAIT_PREFETCH:
                res.book(keys[e]).busy = True
                outcomes[e] = PREFETCH_HIT
                hits += n_sel
                continue
            outcomes[e] = _ACTION_NAMES[action]
            misses_sel += n_sel
            n_miss += 1
        self.miss_rate_ema = 0.8 * self.miss_rate_ema + 0.2 * (n_miss / max(1, len(needed)))
        cpu = tuple(e for e in needed if outcomes[e] == _CPU or outcomes[e] == _CPU_INT8) if n_miss else ()
        if cpu and self.can_int8:
            int8 = [e for e in cpu if outcomes[e] == _CPU_INT8]
            if int8:
                cpu = CpuTasks(cpu, int8)
        # Demand copies, pipelined while slots can be freed without touching this layer's experts.
        copies = []
        needed_keys = None
        for e in needed:
            if outcomes[e] != _COPY:
                continue
            if needed_keys is None:
                needed_keys = {keys[x] for x in needed}
            order = self._acquire(keys[e], "copy", needed_keys)
            if order is None:
                break
            res.book(order.key).busy = True
            copies.append(order)
        return LayerPlan(layer, tuple(needed), routes, outcomes, cpu, tuple(copies), hits, misses_sel)

    def plan_hits(self, layer: int, expert_ids: Sequence[int]) -> list[int] | None:
        """Phases 1 and 3 at once for one token whose K selections (``expert_ids``, top-k order) are all plain
        hits, in a policy that never prefetches: the slot of each selection, in the same order, with the book
        kept exactly as `plan_layer` then `plan_experts` keep it (every outcome "hit", no copy, no miss). None,
        with nothing changed, when any selection is not a plain hit: the caller plans the layer in phases."""
        if self.spec.prefetches:        # its lookahead runs between the phases and must see the layer's busy marks
            return None
        keys, n_experts = self._keys[layer], self.n_experts
        where, state = self.residency.where, self.residency.state
        slots = []
        for e in expert_ids:
            if not 0 <= e < n_experts:
                return None
            slot = where.get(keys[e])
            if slot is None or state[slot].prefetched:
                return None
            slots.append(slot)
        if len(set(slots)) != len(slots):        # a repeated expert: the phases count it once
            return None
        self.global_pos = self.token * self.n_moe + self.moe_pos[layer]
        self.tick += 1
        self.miss_rate_ema *= 0.8             # plan_layer's update with no miss
        use, tick = self.residency.use, self.tick
        for e in sorted(expert_ids):             # touched in ascending expert order, as plan_experts does
            use(keys[e], tick)
        return slots

    def _decide_misses(self, layer: int, misses: list[tuple[int, float, int]], queues: Queues) -> list[MissAction]:
        """One action per miss of this layer (policy/miss.py), each charged to its queue in turn."""
        spec, c = self.spec, self.costs
        if spec.miss_mode == "cpu":
            return [MissAction.CPU] * len(misses)
        if spec.miss_mode == "copy":
            return [MissAction.COPY] * len(misses)
        # A copied expert stays cached: credit it with what a later use saves (recent hit rate x the cheaper of
        # the ways that later miss would take: a copy, or with a CPU lane its run there, FASTPATH §2.5; on a
        # slow link the lane is cheaper than a copy, and crediting the copy's full time overpaid the cache).
        copy_value = (1.0 - self.miss_rate_ema) * self._later_miss_ms if spec.keep_misses else 0.0
        opts = self._options()
        keys, inflight, expert_ms = self._keys[layer], self.inflight, self._expert_ms
        # Rule 2 first (policy/miss.py): a miss below tau_approx is approximated unless its prefetch has landed, and
        # charges no queue, so it needs no request; the rest are decided in order as if it were not there. Most of
        # spice's misses are such, and this runs with the GPU idle.
        # Without a CPU lane an exact miss whose prefetch is on its way is always waited for (a second copy is not
        # offered, policy/miss.py), whatever the queues: it needs no request either (and charges no queue).
        actions: list[MissAction | None] = [None] * len(misses)
        rest = []
        tau, now = (opts.tau_approx if opts.can_approx else 0.0), queues.now_ms
        wait_only = not (opts.can_cpu or opts.can_int8)
        for i, (e, weight, _) in enumerate(misses):
            inf = inflight.get(keys[e])
            if weight < tau and (inf is None or inf.arrival_ms > now):
                actions[i] = MissAction.APPROX
                continue
            if wait_only and inf is not None:
                actions[i] = MissAction.WAIT_PREFETCH
                continue
            rest.append((i, inf))         # inf: only an expert whose prefetch is still in flight has one
        if not rest:
            return actions
        reqs = []
        for i, inf in rest:
            e, weight, n_tokens = misses[i]
            ms = expert_ms.get(n_tokens)
            if ms is None:
                int8 = (c.cpu_int8_expert_ms(n_tokens), c.cpu_int8_expert_ms(n_tokens, link_busy=True)) \
                    if self.can_int8 else (None, None)
                ms = expert_ms[n_tokens] = (c.cpu_expert_ms(n_tokens), c.gpu_expert_ms(n_tokens),
                                            c.cpu_expert_ms(n_tokens, link_busy=True), *int8)
            reqs.append(MissRequest(weight, self._copy_ms, ms[0], ms[1],
                                    inf.arrival_ms if inf is not None else None, copy_value, *ms[2:]))
        # CPU-lane tasks are collected within their layer, so the lane is idle when a layer starts.
        q = QueueState(now_ms=queues.now_ms, copy_free_at_ms=queues.copy_free_at_ms, side_from=c.lane_side_from,
                       side_speedup=c.profile.cpu_side_speedup)
        for (i, _), action in zip(rest, plan_misses(reqs, q, opts)):
            actions[i] = action
        return actions

    def _options(self) -> MissOptions:
        """The miss options at the current thresholds, made once per threshold pair."""
        key = (self.tau_approx, self.tau_int8)
        opts = self._miss_opts.get(key)
        if opts is None:
            spec = self.spec
            opts = self._miss_opts[key] = MissOptions(
                tau_approx=self.tau_approx, can_approx=spec.use_lore and self.can_approx,
                can_cpu=spec.use_cpu and self.can_cpu, can_copy=True, tau_int8=self.tau_int8,
                can_int8=spec.use_int8 and self.can_int8)
        return opts

    # ------------------------------------------------------------------ phase 3: the experts, in order
    def plan_experts(self, plan: LayerPlan, *, batched: bool = False) -> tuple[ExpertRun, ...]:
        """GPU experts ascending, CPU ones skipped (collected later). A demand copy that found no
        slot in phase 1 takes one now; experts computed earlier in this layer may go, unless
        ``batched``: the executor runs the layer's experts together after the plan is made (a CUDA
        graph segment), so no expert of the layer may be evicted for another."""
        layer, res = plan.layer, self.residency
        keys = self._keys[layer]
        placed = {o.key.expert: o for o in plan.copies}
        late_orders: dict[int, CopyOrder] = {}
        outcomes, tick, keep_misses = plan.outcomes, self.tick, self.spec.keep_misses
        if batched:
            # Every expert of the layer is read at once, later: place all late copies while the layer's
            # experts are still busy, so none of them is evicted.
            for e in plan.needed:
                if outcomes[e] == _COPY and e not in placed:
                    key = keys[e]
                    late_orders[e] = self._acquire(key, "copy", {key})
                    assert late_orders[e] is not None, "cache smaller than one layer's experts"
                    res.book(key).busy = True
        runs = []
        for e in plan.needed:
            outcome = outcomes[e]
            if outcome == _CPU or outcome == _CPU_INT8:
                continue
            if outcome == _APPROX:
                runs.append(ExpertRun(e, outcome))
                continue
            key = keys[e]
            if outcome == HIT:          # the common case: nothing to place, consume or drop
                runs.append(ExpertRun(e, outcome, res.use(key, tick)))
                continue
            late = late_orders.get(e)
            if outcome == _COPY and e not in placed and late is None:
                late = self._acquire(key, "copy", {key})
                assert late is not None, "cache smaller than one expert"
                res.book(key).busy = True
            used = self.inflight.pop(key, None) if outcome == PREFETCH_HIT else None
            slot = res.use(key, tick)
            drop = not keep_misses and outcome == _COPY
            if drop:
                res.evict(key)
            runs.append(ExpertRun(e, outcome, slot, late, used, drop))
        return tuple(runs)

    def plan_fallback(self, key: ExpertKey, *, hold: bool = False) -> CopyOrder:
        """A CPU-lane task failed: copy the expert in after all (exact). ``hold``: the layer's experts are still
        busy (the fast path falls back before it places them): keep this one busy too, until `release_fallback`.
        An expert whose prefetch is still in flight (the lane was picked over waiting for it) already has its slot:
        it is copied again into that slot, behind the prefetch on the copy stream, and is a demand copy from then
        on (its in-flight entry goes: a stale one outlived the expert's eviction and was waited for later)."""
        slot = self.residency.where.get(key)
        if slot is not None:
            self.inflight.pop(key, None)
            self.residency.book(key).prefetched = False
            order = CopyOrder(key, slot, "copy")
        else:
            order = self._acquire(key, "copy", {key})
        assert order is not None, "cache smaller than one expert"
        if hold:
            self.residency.book(key).busy = True
        return order

    def release_fallback(self, key: ExpertKey) -> None:
        """The layer that fell back to copying ``key`` has been placed: it is an ordinary cached expert again."""
        self.residency.use(key, self.tick)

    # ------------------------------------------------------------------ phase 2: the lookahead
    def plan_prefetch(self, layer: int, predictions: Sequence[LayerPrediction] | None, queues: Queues, *,
                      protected: AbstractSet[ExpertKey] = frozenset()) -> PrefetchOrders:
        """``predictions`` None: the plan was skipped because it does not pay (stop reason "cost").
        ``protected``: experts no prefetch may evict besides the busy ones (those a launched CUDA-graph
        segment still reads while this plan runs after it)."""
        if predictions is None:
            return PrefetchOrders((), 0, "cost", -1.0)
        c = self.costs
        layer_ms = self._layer_ms
        hm = h_min(self.miss_rate_ema * self.top_k, c.expert_bytes, c.profile.h2d_pinned_gbps * 1e6, layer_ms)
        res = self.residency
        plan = plan_lookahead(
            predictions, is_resident_or_inflight=res.where,     # its keys: resident or in flight (= res.__contains__)
            on_way_rows=res.on_way_row,
            tau_prefetch=self.tau_prefetch, max_lookahead=self.max_lookahead, now_ms=queues.now_ms,
            copy_free_at_ms=queues.copy_free_at_ms, copy_ms=self._copy_ms, layer_ms=layer_ms,
            top_k=self.top_k, max_items=max(0, res.n_slots - self.top_k), h_min_value=hm,
            issue_ms=c.profile.host_copy_us / 1e3 if self.host_aware else 0.0, miss_ms=self._lane_ms,
            min_weight=self._min_prefetch_weight())
        if len(self.next_use_abs) > 4 * res.n_slots + 256:
            self.next_use_abs = {k: v for k, v in self.next_use_abs.items() if v >= self.global_pos}
        pos, get = self.global_pos, self.next_use_abs.get
        self.next_use_abs.update({key: pos + d for key, d in plan.next_use.items()
                                  if (cur := get(key)) is None or cur < pos or pos + d < cur})
        depth, reason = plan.depth, plan.stop_reason
        orders = []
        for item in plan.items:
            order = self._acquire(item.key, "prefetch", protected, incoming_distance=item.distance,
                                  distance=item.distance, confidence=item.confidence,
                                  planned_arrival_ms=item.arrival_ms)   # busy slots are protected too
            if order is None:
                reason = "cache"
                depth = min(depth, item.distance - 1)
                break
            orders.append(order)
        return PrefetchOrders(tuple(orders), depth, reason, hm if math.isfinite(hm) else -1.0, plan.skipped_approx)

    def _min_prefetch_weight(self) -> float:
        """The predicted router weight a prefetch must reach: tau_approx where this policy approximates the misses
        below it and the admission is "exact", else 0 (read per plan: tau_approx is a live setting)."""
        if self.prefetch_admission == "exact" and self.spec.use_lore and self.can_approx:
            return self.tau_approx
        return 0.0

    def _lane_miss_ms(self) -> float | None:
        """An exact miss's time on the CPU lane (busy link), where the policy sends exact misses there and that
        beats a copy: the lookahead then leaves the link to prefetches that land in time (plan_lookahead's
        ``miss_ms``). None where misses are copied."""
        if not (self.spec.use_cpu and self.can_cpu) or self.spec.miss_mode == "copy":
            return None
        ms = self.costs.cpu_expert_ms(1, link_busy=True)
        return ms if ms < self._copy_ms else None

    def prefetch_issued(self, order: CopyOrder, layer: int, issued_ms: float, arrival_ms: float) -> None:
        """The executor issued ``order``; ``arrival_ms`` is when its clock expects it to land."""
        self.inflight[order.key] = InflightPrefetch(order.key, layer, issued_ms, arrival_ms or order.planned_arrival_ms,
                                                    order.confidence)

    # ------------------------------------------------------------------ slots
    def _acquire(self, key: ExpertKey, kind: str, protected: AbstractSet[ExpertKey], incoming_distance: float | None = None,
                 **extra) -> CopyOrder | None:
        """A slot for ``key``, evicting if needed, assigned in the book. ``incoming_distance`` None: a demand
        miss (needed now), anything not busy may go; a prefetch for distance d only evicts experts
        predicted later than d."""
        res = self.residency
        slot = res.free_slot()
        evicted = wasted = None
        unused = False
        if slot is None:
            views = res.views(protected)
            if isinstance(self.eviction, FarthestNextUseEviction):
                d = -math.inf if incoming_distance is None else incoming_distance
                victim = self.eviction.victim_for(views, _NextUse(self.next_use_abs, self.global_pos), d)
            else:
                victim = self.eviction.choose_victim(views)
            if victim is None:
                return None
            unused = res.book(victim).prefetched
            if unused:
                wasted = self.inflight.pop(victim, None)
            evicted = victim
            slot = res.evict(victim)
        res.assign(slot, key, self.tick, prefetched=kind == "prefetch")
        return CopyOrder(key, slot, kind, evicted, wasted, unused, **extra)


class _NextUse:
    """Read-only view: predicted distance (in MoE layers from now) to each expert's next use."""

    __slots__ = ("_abs", "_pos")

    def __init__(self, abs_pos: dict, pos: int) -> None:
        self._abs, self._pos = abs_pos, pos

    def get(self, key, default=math.inf):
        v = self._abs.get(key)
        return default if v is None or v < self._pos else v - self._pos
