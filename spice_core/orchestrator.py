"""LayerRuntime: places and runs one MoE layer's experts for one forward pass.

    router output ─► group selections by expert ─► per expert: hit | prefetch_hit | miss
                                                            miss ─► decide_miss (policy/miss.py)
          ─► issue: CPU-lane tasks, demand copies, prefetches for layers ahead (policy/prefetch.py)
          ─► GPU: each expert in ascending index order (waiting on its copy) ─► collect CPU results

Where the prefetch planning goes is a mechanism choice (``prefetch_after_experts``). With
no host cost (modeled timing) prefetches are issued before the layer's experts, so they
start as early as possible. On a real GPU at batch 1 the host is the bottleneck (each layer
syncs once to read its routing, so the GPU idles while Python plans): there the plan runs
after the experts are launched, overlapping their GPU work, and its copies start a little
later.
          ─► combine in ascending expert order (the stock loop's order: exact policies match it)

Mechanisms used: GpuSlots (cache + staging), HostStore, CpuLane, a Timeline. Decisions come
from the PolicySpec, the eviction policy, decide_miss and plan_lookahead. Per token it
accumulates the outcomes, prefetch records and counters the engine turns into StepStats.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from spice_core.api import ExpertOutcome, PrefetchRecord
from spice_core.exec.experts import expert_forward
from spice_core.memory.gpu_slots import GpuSlots
from spice_core.model.loader import LoadedModel
from spice_core.policy.cache import EVICTION_POLICIES, FarthestNextUseEviction, SlotView
from spice_core.policy.miss import MissAction, MissOptions, MissRequest, QueueState, plan_misses
from spice_core.policy.prefetch import h_min, plan_lookahead, plan_pays
from spice_core.policy.spec import PolicySpec
from spice_core.timing.costs import CostModel
from spice_core.types import ExpertKey


@dataclass
class TokenCounters:
    hits: int = 0
    misses: int = 0
    bytes_copied: int = 0
    outcomes: list = field(default_factory=list)
    prefetches: list = field(default_factory=list)
    depths: list = field(default_factory=list)
    stop_reasons: list = field(default_factory=list)
    h_mins: list = field(default_factory=list)
    cpu_fallbacks: int = 0


@dataclass
class _Inflight:
    key: ExpertKey
    issued_at_layer: int
    issued_ms: float
    arrival_ms: float
    confidence: float
    handle: object


class _Rows:
    """Per-expert token rows of one layer, as device index tensors made with ONE host->device
    copy per layer (a list index per expert would cost a blocking copy each). At T=1 they are
    plain slices: no index tensors at all."""

    def __init__(self, routes, needed, T: int, device) -> None:
        self.T = T
        self.routes = routes
        if T == 1:
            return
        flat_t, flat_p, self.span = [], [], {}
        for e in needed:
            toks, poss = routes[e]
            self.span[e] = (len(flat_t), len(flat_t) + len(toks))
            flat_t += toks
            flat_p += poss
        both = torch.tensor([flat_t, flat_p], dtype=torch.long)
        if device.type == "cuda":
            both = both.pin_memory().to(device, non_blocking=True)
        self.tok, self.pos = both[0], both[1]

    def __call__(self, x, e):
        if self.T == 1:
            return x
        a, b = self.span[e]
        return x[self.tok[a:b]]

    def add_into(self, final, e, y) -> None:
        """final[rows of e] += y, like the stock loop's index_add_ (a plain add at T=1)."""
        if self.T == 1:
            final.add_(y)
            return
        a, b = self.span[e]
        final.index_add_(0, self.tok[a:b], y)

    def weights(self, w, e):
        """Router weights of expert e's selections, [n,1]."""
        if self.T == 1:
            p = self.routes[e][1][0]
            return w[:, p:p + 1]
        a, b = self.span[e]
        return w[self.tok[a:b], self.pos[a:b], None]


class _NextUse:
    """Read-only view: predicted distance (in MoE layers from now) to each expert's next use."""

    __slots__ = ("_abs", "_pos")

    def __init__(self, abs_pos: dict, pos: int) -> None:
        self._abs, self._pos = abs_pos, pos

    def get(self, key, default=math.inf):
        v = self._abs.get(key)
        return default if v is None or v < self._pos else v - self._pos


class LayerRuntime:
    def __init__(self, lm: LoadedModel, spec: PolicySpec, n_slots: int, timeline, costs: CostModel, *,
                 tau_prefetch: float = 0.2, tau_approx: float = 0.0, max_lookahead: int = 4,
                 predictor=None, cpu_lane=None, lore=None, static_experts: list[ExpertKey] | None = None,
                 prefetch_after_experts: bool | None = None, host_aware: bool = True) -> None:
        self.lm, self.spec, self.timeline, self.costs = lm, spec, timeline, costs
        self.tau_prefetch, self.tau_approx, self.max_lookahead = tau_prefetch, tau_approx, max_lookahead
        self.predictor, self.cpu_lane, self.lore = predictor, cpu_lane, lore
        self.device = lm.device
        self.slots = GpuSlots(lm.layout, n_slots, lm.device)
        self.eviction = EVICTION_POLICIES[spec.eviction]()
        self.copy_stream = getattr(timeline, "copy_stream", None)   # measured CUDA timelines own it
        if prefetch_after_experts is None:
            prefetch_after_experts = getattr(timeline, "mode", "modeled") == "measured"
        self.prefetch_after_experts = prefetch_after_experts
        self.host_aware = host_aware      # decisions weigh the profile's host costs (when it has them)
        self._cuda_stream = None
        self.moe_pos = {layer: p for p, layer in enumerate(lm.moe_layers)}
        prev = -1
        self._layers_before: dict[int, tuple[int, ...]] = {}
        for layer in lm.moe_layers:
            self._layers_before[layer] = tuple(range(prev + 1, layer + 1))
            prev = layer
        self._tail_layers = tuple(range(prev + 1, lm.n_layers))
        self.tick = 0
        self.token = 0
        self.global_pos = 0
        self._next_use_abs: dict[ExpertKey, int] = {}
        self._inflight: dict[ExpertKey, _Inflight] = {}
        self.counters = TokenCounters()
        self.totals = {"wasted_prefetch_bytes": 0, "prefetch_bytes": 0, "cpu_fallbacks": 0}
        self.observers: list = []   # callables(layer, x, probs_or_None, idx) for calibration traces
        self._miss_rate_ema = 1.0
        self._modeled_cpu = False   # set by the engine: CPU-lane work is computed inline and timed as the lane
        if spec.preload_all:
            self._fill_static(list(lm.host.keys()))
        elif spec.static_cache and static_experts:
            self._fill_static(static_experts[:n_slots])

    # ------------------------------------------------------------------ helpers
    def _fill_static(self, keys: list[ExpertKey]) -> None:
        for key in keys[: self.slots.n_slots]:
            slot = self.slots.free_slot()
            self.slots.fill_from(slot, self.lm.host.flat(key))
            self.slots.assign(slot, key, self.tick, prefetched=False)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _compute_stream(self):
        """The model's CUDA stream; measured timelines hold it (looking it up costs ~25 µs a call)."""
        stream = getattr(self.timeline, "compute_stream", None)
        if stream is None:
            if self._cuda_stream is None:
                self._cuda_stream = torch.cuda.current_stream(self.device)
            stream = self._cuda_stream
        return stream

    def _next_use(self) -> "_NextUse":
        return _NextUse(self._next_use_abs, self.global_pos)

    def _views(self, protected: set[ExpertKey]):
        """Resident experts as SlotViews, least recently used first, produced lazily."""
        where, state = self.slots.where, self.slots.state
        for key in self.slots.lru_order:
            s = state[where[key]]
            yield SlotView(key, s.last_use_tick, s.use_count, protected=s.busy or key in protected)

    def _acquire_slot(self, protected: set[ExpertKey], incoming_distance: float | None = None) -> int | None:
        """A free slot, evicting if needed. ``incoming_distance`` None = a demand miss (needed now):
        anything not busy may go; a prefetch for distance d only evicts experts predicted later than d."""
        slot = self.slots.free_slot()
        if slot is not None:
            return slot
        views = self._views(protected)
        if isinstance(self.eviction, FarthestNextUseEviction):
            victim = self.eviction.victim_for(views, self._next_use(),
                                              -math.inf if incoming_distance is None else incoming_distance)
        else:
            victim = self.eviction.choose_victim(views)
        if victim is None:
            return None
        st = self.slots.state[self.slots.where[victim]]
        if st.prefetched:
            self._waste(victim)
        self.timeline.mark("evict", victim, self.lm.layout.nbytes, lane="copy")
        return self.slots.evict(victim)

    def _waste(self, key: ExpertKey) -> None:
        self.totals["wasted_prefetch_bytes"] += self.lm.layout.nbytes
        inf = self._inflight.pop(key, None)
        if inf is not None:
            self.counters.prefetches.append(PrefetchRecord(key.layer, key.expert, inf.issued_at_layer, inf.issued_ms,
                                                           inf.arrival_ms, None, inf.confidence))
        self.timeline.mark("prefetch_wasted", key, self.lm.layout.nbytes, lane="copy")

    def _copy_into(self, slot: int, key: ExpertKey, kind: str):
        st = self.slots.state[slot]
        if self.copy_stream is not None and st.free_event is not None:
            self.copy_stream.wait_event(st.free_event)
        handle = self.timeline.copy(key, self.lm.layout.nbytes, kind,
                                    lambda: self.slots.fill_from(slot, self.lm.host.flat(key)))
        st.ready_handle = handle
        self.counters.bytes_copied += self.lm.layout.nbytes
        return handle

    def _release(self, slot: int) -> None:
        st = self.slots.state[slot]
        st.busy = False
        if self.device.type == "cuda":
            ev = torch.cuda.Event()
            ev.record(self._compute_stream())
            st.free_event = ev

    # ------------------------------------------------------------------ per token
    def begin_token(self, token: int) -> None:
        self.token = token
        self.counters = TokenCounters()
        self.timeline.start_token(token)

    def end_token(self) -> float:
        for layer in self._tail_layers:
            self.timeline.layer(layer, 1, dense=True)
        return self.timeline.end_token()

    # ------------------------------------------------------------------ the layer
    @torch.no_grad()
    def run_layer(self, layer: int, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, act):
        """x [T,H], top_k_index/top_k_weights [T,K] -> [T,H]."""
        T = x.shape[0]
        tl = self.timeline
        for l_ in self._layers_before[layer]:
            tl.layer(l_, T, dense=l_ != layer)
        self.global_pos = self.token * len(self.lm.moe_layers) + self.moe_pos[layer]
        prefetching = self.spec.prefetches and self.predictor is not None
        if prefetching and hasattr(self.predictor, "launch") and not self._plan_not_worth_it():
            self.predictor.launch(layer, x[-1:], self)    # its readback rides on the routing's sync below
        idx_l, w_l = top_k_index.tolist(), top_k_weights.tolist()
        routes: dict[int, tuple[list[int], list[int]]] = {}
        for t, row in enumerate(idx_l):
            for pos, e in enumerate(row):
                if 0 <= e < self.lm.n_experts:
                    toks, poss = routes.setdefault(e, ([], []))
                    toks.append(t)
                    poss.append(pos)
        for obs in self.observers:
            obs(layer, x, top_k_index, top_k_weights)

        needed = sorted(routes)
        rows = self._row_index(routes, needed, T, x.device)
        needed_keys = {ExpertKey(layer, e) for e in needed}
        self.tick += 1
        actions: dict[int, MissAction | str] = {}
        n_miss = 0
        misses: list[tuple[int, float, int]] = []     # (expert, largest router weight, tokens)
        orchestrate, now = self.spec.miss_mode == "orchestrate", tl.now_ms()
        for e in needed:
            key = ExpertKey(layer, e)
            if key in self.slots.where:
                st = self.slots.state[self.slots.where[key]]
                inf = self._inflight.get(key) if st.prefetched else None
                if not (orchestrate and inf is not None and inf.arrival_ms > now):
                    actions[e] = "prefetch_hit" if st.prefetched else "hit"
                    st.busy = True
                    self.counters.hits += len(routes[e][0])
                    continue
                # A prefetch still in flight: the miss decision weighs waiting for it against the others.
            misses.append((e, max(w_l[t][p] for t, p in zip(*routes[e])), len(routes[e][0])))
        for (e, _, n_sel), action in zip(misses, self._decide_layer(layer, misses)):
            if action == MissAction.WAIT_PREFETCH:
                self.slots.state[self.slots.where[ExpertKey(layer, e)]].busy = True
                actions[e] = "prefetch_hit"
                self.counters.hits += n_sel
                continue
            actions[e] = action
            self.counters.misses += n_sel
            n_miss += 1
        self._miss_rate_ema = 0.8 * self._miss_rate_ema + 0.2 * (n_miss / max(1, len(needed)))

        # 1. CPU lane first, so it overlaps everything below.
        cpu_handles = {}
        for e in needed:
            if actions[e] == MissAction.CPU:
                cpu_handles[e] = self._submit_cpu(ExpertKey(layer, e), rows(x, e), len(routes[e][0]), act)
        # 2. Demand copies, pipelined while slots can be freed without touching this layer's experts.
        copy_slots: dict[int, int] = {}
        for e in needed:
            if actions[e] == MissAction.COPY:
                slot = self._acquire_slot(needed_keys)
                if slot is None:
                    break
                key = ExpertKey(layer, e)
                self._copy_into(slot, key, "copy")
                self.slots.assign(slot, key, self.tick, prefetched=False)
                self.slots.state[slot].busy = True
                copy_slots[e] = slot
        # 3. Prefetch for layers ahead, before the experts when the host is not the bottleneck (modeled
        #    timing has no host cost), else in step 5 (see `prefetch_after_experts`). Always after the
        #    demand copies: they must not queue behind speculation.
        if prefetching and not self.prefetch_after_experts:
            self._prefetch(layer, x)

        # 4. GPU experts, ascending.
        outs: dict[int, torch.Tensor] = {}
        for e in needed:
            key = ExpertKey(layer, e)
            toks = routes[e][0]
            act_e = actions[e]
            if act_e == MissAction.CPU:
                continue
            if act_e == MissAction.APPROX:
                outs[e] = tl.approx(key, len(toks), self.lore.rank, lambda: self.lore.apply(key, rows(x, e)))
                continue
            if act_e == MissAction.COPY and e not in copy_slots:
                slot = self._acquire_slot({key})   # experts computed earlier in this layer may go now
                assert slot is not None, "cache smaller than one expert"
                self._copy_into(slot, key, "copy")
                self.slots.assign(slot, key, self.tick, prefetched=False)
                self.slots.state[slot].busy = True
                copy_slots[e] = slot
            slot = self.slots.where[key]
            st = self.slots.state[slot]
            if act_e == "prefetch_hit":
                inf = self._inflight.pop(key, None)
                if inf is not None:
                    self.counters.prefetches.append(PrefetchRecord(
                        layer, e, inf.issued_at_layer, inf.issued_ms, inf.arrival_ms, tl.now_ms(), inf.confidence))
            if st.ready_handle is not None:
                tl.wait(st.ready_handle)
            gate_up, down = self.slots.weights(slot)
            outs[e] = tl.gpu_expert(key, len(toks), lambda: expert_forward(rows(x, e), gate_up, down, act))
            self.slots.touch(key, self.tick)
            self._release(slot)
            if not self.spec.keep_misses and act_e == MissAction.COPY:
                self.slots.evict(key)
        # 5. Or here: planned while the GPU runs the experts just launched.
        if prefetching and self.prefetch_after_experts:
            self._prefetch(layer, x)
        # 6. CPU results.
        for e, h in cpu_handles.items():
            outs[e] = self._collect_cpu(ExpertKey(layer, e), h, rows(x, e), act)

        # 7. Combine exactly as the stock loop does.
        final = torch.zeros_like(x)
        for e in needed:
            toks, poss = routes[e]
            y = outs[e] * rows.weights(top_k_weights, e)
            rows.add_into(final, e, y.to(final.dtype))
            outcome = actions[e].value if isinstance(actions[e], MissAction) else actions[e]
            self.counters.outcomes.append(ExpertOutcome(layer, e, outcome))
        return final

    @staticmethod
    def _row_index(routes, needed, T: int, device) -> "_Rows":
        return _Rows(routes, needed, T, device)

    # ------------------------------------------------------------------ decisions
    def _decide_layer(self, layer: int, misses: list[tuple[int, float, int]]) -> list[MissAction]:
        """One action per miss of this layer (policy/miss.py), each charged to its queue in turn."""
        spec = self.spec
        if spec.miss_mode == "cpu":
            return [MissAction.CPU] * len(misses)
        if spec.miss_mode == "copy":
            return [MissAction.COPY] * len(misses)
        tl = self.timeline
        reqs = []
        # A copied expert stays cached: credit it with the transfer a later use saves (recent hit rate).
        copy_value = (1.0 - self._miss_rate_ema) * self.costs.copy_ms() if spec.keep_misses else 0.0
        for e, weight, n_tokens in misses:
            inf = self._inflight.get(ExpertKey(layer, e))   # only experts whose prefetch is still in flight
            reqs.append(MissRequest(router_weight=weight, copy_ms=self.costs.copy_ms(),
                                    cpu_ms=self.costs.cpu_expert_ms(n_tokens), gpu_ms=self.costs.gpu_expert_ms(n_tokens),
                                    inflight_arrival_ms=inf.arrival_ms if inf is not None else None,
                                    copy_value_ms=copy_value))
        # CPU-lane tasks are collected within their layer, so the lane is idle when a layer starts.
        queues = QueueState(now_ms=tl.now_ms(), copy_free_at_ms=tl.copy_free_at_ms())
        opts = MissOptions(tau_approx=self.tau_approx, can_approx=spec.use_lore and self.lore is not None,
                           can_cpu=spec.use_cpu and (self.cpu_lane is not None or self._modeled_cpu), can_copy=True)
        return plan_misses(reqs, queues, opts)

    def _submit_cpu(self, key: ExpertKey, xs: torch.Tensor, n: int, act):
        gate_up, down = self.lm.host.weights(key)
        if self.cpu_lane is None:   # modeled mode on a CPU machine: compute here, time it as the CPU lane
            return self.timeline.cpu_expert(key, n, lambda: expert_forward(xs, gate_up, down, act))
        stream = self._compute_stream() if xs.device.type == "cuda" else None
        return self.timeline.cpu_expert(key, n, lambda: self.cpu_lane.submit(xs, gate_up, down, act, self.device,
                                                                             stream=stream))

    def _collect_cpu(self, key: ExpertKey, handle, xs: torch.Tensor, act) -> torch.Tensor:
        try:
            return self.timeline.cpu_result(handle)
        except Exception as err:  # noqa: BLE001 - any worker failure falls back to an exact copy
            self.counters.cpu_fallbacks += 1
            self.totals["cpu_fallbacks"] += 1
            self.timeline.mark("cpu_fallback", key, detail=f"{type(err).__name__}: {err}")
            slot = self._acquire_slot({key})
            assert slot is not None
            h = self._copy_into(slot, key, "copy")
            self.slots.assign(slot, key, self.tick, prefetched=False)
            self.timeline.wait(h)
            gate_up, down = self.slots.weights(slot)
            out = self.timeline.gpu_expert(key, xs.shape[0], lambda: expert_forward(xs, gate_up, down, act))
            self._release(slot)
            return out

    def _plan_not_worth_it(self) -> bool:
        """With a profile that models the host: skip this layer's plan when it costs the host more than
        the copy stalls it could hide (the recent miss rate x k exposed copies)."""
        if not self.host_aware:
            return False
        return not plan_pays(self.costs.profile.host_plan_us / 1e3, self._miss_rate_ema, self.lm.top_k,
                             self.costs.copy_ms())

    def _prefetch(self, layer: int, x: torch.Tensor) -> None:
        if self._plan_not_worth_it():
            if hasattr(self.predictor, "discard"):
                self.predictor.discard()
            self.counters.depths.append(0)
            self.counters.stop_reasons.append("cost")
            self.counters.h_mins.append(-1.0)
            return
        preds = self.predictor.predict(layer, x[-1:], self)
        self.timeline.plan(layer)
        layer_ms = self.costs.gpu_layer_ms() + self.lm.top_k * self.costs.gpu_expert_ms()
        bw_bytes_per_ms = self.costs.profile.h2d_pinned_gbps * 1e6
        hm = h_min(self._miss_rate_ema * self.lm.top_k, self.costs.expert_bytes, bw_bytes_per_ms, layer_ms)
        plan = plan_lookahead(
            preds, is_resident_or_inflight=lambda k: k in self.slots.where,
            tau_prefetch=self.tau_prefetch, max_lookahead=self.max_lookahead, now_ms=self.timeline.now_ms(),
            copy_free_at_ms=self.timeline.copy_free_at_ms(), copy_ms=self.costs.copy_ms(), layer_ms=layer_ms,
            top_k=self.lm.top_k, max_items=max(0, self.slots.n_slots - self.lm.top_k), h_min_value=hm,
            issue_ms=self.costs.profile.host_copy_us / 1e3 if self.host_aware else 0.0)
        if len(self._next_use_abs) > 4 * self.slots.n_slots + 256:
            self._next_use_abs = {k: v for k, v in self._next_use_abs.items() if v >= self.global_pos}
        for key, d in plan.next_use.items():
            cur = self._next_use_abs.get(key)
            if cur is None or cur < self.global_pos or self.global_pos + d < cur:
                self._next_use_abs[key] = self.global_pos + d
        depth, reason = plan.depth, plan.stop_reason
        for item in plan.items:
            slot = self._acquire_slot(set(), incoming_distance=item.distance)   # busy slots are protected
            if slot is None:
                reason = "cache"
                depth = min(depth, item.distance - 1)
                break
            h = self._copy_into(slot, item.key, "prefetch")
            self.totals["prefetch_bytes"] += self.lm.layout.nbytes
            self.slots.assign(slot, item.key, self.tick, prefetched=True)
            self._inflight[item.key] = _Inflight(item.key, layer, self.timeline.now_ms(), h.end_ms or item.arrival_ms,
                                                 item.confidence, h)
        self.counters.depths.append(depth)
        self.counters.stop_reasons.append(reason)
        self.counters.h_mins.append(hm if math.isfinite(hm) else -1.0)
