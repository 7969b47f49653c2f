"""LayerRuntime: one MoE layer of one forward pass, wired as predictor -> planner -> executor -> recorder.

    OffloadedExperts.forward(x, top_k_index, top_k_weights)
      └─► run_layer: draft launch (rides on the routing's readback)
                     executor.read_routing ─► planner.plan_layer ─► executor.start_layer (CPU tasks, demand copies)
                     [lookahead: predictor.predict ─► planner.plan_prefetch ─► copies.issue_many] before or after:
                     planner.plan_experts ─► executor.run_experts
                     executor.finish_layer (CPU results, combine) ─► recorder.layer_outcomes

Where the lookahead runs is a mechanism choice (``prefetch_after_experts``): with no host
cost (modeled timing) prefetches go out before the layer's experts, so they start as early as
possible; on a real GPU at batch 1 the host is the bottleneck (each layer syncs once to read its
routing), so the plan runs after the experts are launched, overlapping their GPU work.

Holds no policy state (the planner does) and moves no bytes itself (the executor does).
"""
from __future__ import annotations

import torch

from spice_core.policy.planner import LayerPlanner, Queues
from spice_core.runtime.context import PredictContext
from spice_core.runtime.graphed_plan import APPROX_SLOT
from spice_core.types import ExpertKey


class LayerRuntime:
    def __init__(self, lm, planner: LayerPlanner, executor, clock, recorder, *, predictor=None,
                 prefetch_after_experts: bool = False) -> None:
        self.lm, self.planner, self.executor, self.clock, self.recorder = lm, planner, executor, clock, recorder
        self.predictor = predictor
        # The executor that runs a whole layer eagerly (the prompt; every token off the fast path): the executor
        # itself, or the eager executor the graphed one composes for its prefill.
        self.eager = getattr(executor, "eager", executor)
        self.prefetch_after_experts = prefetch_after_experts
        self.ctx = PredictContext(max_lookahead=planner.max_lookahead, clock=clock,
                                  stream=getattr(executor, "compute_stream", None))
        prev = -1
        self._layers_before: dict[int, tuple[int, ...]] = {}
        for layer in lm.moe_layers:
            self._layers_before[layer] = tuple(range(prev + 1, layer + 1))
            prev = layer
        self._tail_layers = tuple(range(prev + 1, lm.n_layers))
        # One token's all-hit layers in one planner call and one executor call (the CPU's batched executor, a
        # policy without lookahead): the phases' objects (routes, outcomes, plan, runs) cost more than the math.
        # The fast path's host step takes the same planner call for any policy without lookahead.
        self._decide_hits = not planner.prefetching
        self._hit_path = self.eager.batched and self._decide_hits
        self._deferred = None        # the graphed step's lookahead, planned after the next segment's launch
        self._deferred_record = None  # ... and the last decided layer's outcomes, recorded then
        self.observers: list = []   # callables(layer, idx_rows, w_rows): the routing as read back ([T][K] lists)
        self.layer_observers: list = []   # callables(runtime, layer) after each MoE layer: accounting checks

    # ------------------------------------------------------------------ settings and state
    @property
    def slots(self):
        return self.executor.slots

    @property
    def used_bytes(self) -> int:
        """Bytes of the experts the cache holds now."""
        return len(self.planner.residency) * self.lm.expert_bytes

    @property
    def totals(self) -> dict:
        return self.recorder.totals

    def set_thresholds(self, *, tau_prefetch: float, tau_approx: float, max_lookahead: int) -> None:
        """Live thresholds (from the next token). tau_approx only matters when LoRE is loaded."""
        p = self.planner
        p.tau_prefetch, p.max_lookahead = tau_prefetch, max_lookahead
        if p.can_approx:
            p.tau_approx = tau_approx
        self.ctx.max_lookahead = max_lookahead

    # ------------------------------------------------------------------ per token
    def begin_token(self, token: int) -> None:
        self.planner.begin_token(token)
        self.ctx.token = token
        self.recorder.begin_token()
        self.clock.start_token(token)
        self.executor.start_token()
        self.ctx.stream = getattr(self.executor, "compute_stream", None)

    def end_token(self) -> float:
        if self._deferred_record is not None:     # a step that ended without its after-replay hook
            self._record_deferred()
        for layer in self._tail_layers:
            self.clock.layer(layer, 1, dense=True)
        return self.clock.end_token()

    def _queues(self) -> Queues:
        return Queues(self.clock.now_ms(), self.clock.copy_free_at_ms())

    # ------------------------------------------------------------------ the layer
    def run_layer(self, layer: int, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, act):
        """x [T,H], top_k_index/top_k_weights [T,K] -> [T,H]. Called with autograd off: every pass that installs
        a runtime runs under inference mode or no_grad (a decorator here cost 3 µs a layer)."""
        T = x.shape[0]
        clock, planner, ex = self.clock, self.planner, self.eager
        for l_ in self._layers_before[layer]:
            clock.layer(l_, T, dense=l_ != layer)
        prefetching = planner.prefetching and self.predictor is not None
        if prefetching and hasattr(self.predictor, "launch") and planner.plan_pays():
            self.predictor.launch(layer, x[-1:], self.ctx)    # its readback rides on the routing's below
        idx_rows, w_rows = ex.read_routing(top_k_index, top_k_weights)
        for obs in self.observers:
            obs(layer, idx_rows, w_rows)
        if T == 1 and self._hit_path:
            slots = planner.plan_hits(layer, idx_rows[0])
            if slots is not None:
                final = ex.run_hits(layer, idx_rows[0], slots, x, top_k_weights, act)
                self._hits_done(layer, idx_rows[0])
                return final

        plan = planner.plan_layer(layer, idx_rows, w_rows, self._queues())
        self.recorder.layer_counts(plan.hits, plan.misses)
        rows, cpu = ex.start_layer(plan, x, act)
        predict = lambda: self.predictor.predict(layer, x[-1:], self.ctx)   # noqa: E731
        if prefetching and not self.prefetch_after_experts:
            self._prefetch(layer, predict)
        outs = ex.run_experts(layer, planner.plan_experts(plan), rows, x, act)
        if prefetching and self.prefetch_after_experts:
            self._prefetch(layer, predict)     # planned while the GPU runs the experts just launched
        final = ex.finish_layer(plan, rows, outs, cpu, x, top_k_weights, act, planner.plan_fallback)
        self.recorder.layer_outcomes(layer, plan.needed, plan.outcomes)
        for obs in self.layer_observers:
            obs(self, layer)
        return final

    def decide_layer(self, layer: int, expert_ids: list[int], weights: list[float], draft_row=None) -> list[int]:
        """The graphed executor's per-layer host step (T=1): the layer's routing has been read back and
        every earlier segment has finished. Plans the layer, issues its demand copies, makes the compute
        stream wait for what this layer needs, and returns the slot of each selection (the next segment
        runs the experts from them). The lookahead and the layer's recording are left for `run_deferred`, which
        the decoder calls once that segment is launched, so the GPU need not wait for them: until then this
        layer's experts stay protected from eviction (the segment reads their slots while the lookahead plans)."""
        clock, planner, ex = self.clock, self.planner, self.executor
        for l_ in self._layers_before[layer]:
            clock.layer(l_, 1, dense=l_ != layer)
        for obs in self.observers:
            obs(layer, [expert_ids], [weights])
        if self._deferred_record is not None:    # the decoder launched no segment since the last layer: record now
            self._record_deferred()
        if self._decide_hits:       # an all-hit layer: one planner call, no plan objects (`plan_hits`)
            slots = planner.plan_hits(layer, expert_ids)
            if slots is not None:
                ex.copies.wait_ready_many(slots)
                self._deferred_record = (layer, expert_ids, None)
                return slots
        plan = planner.plan_layer(layer, [expert_ids], [weights], self._queues())
        self.recorder.layer_counts(plan.hits, plan.misses)
        jobs = ex.submit_cpu(layer, plan.cpu) if plan.cpu else None     # first: they overlap the copies' issue
        copies = ex.copies
        copies.issue_many(plan.copies)
        slot_of, fell_back = {}, ()
        if jobs:
            # Joined before the next segment's launch (it reads their outputs); a failed job falls back to a
            # copy placed while the layer's experts are still busy, so none of them is evicted for it.
            fallback = lambda key: planner.plan_fallback(key, hold=True)   # noqa: E731
            slot_of = ex.join_cpu(layer, jobs, expert_ids, fallback)
        fell_back = [e for e, slot in slot_of.items() if slot >= 0]
        wait = []               # the slots the segment reads: waited for at once, after the late copies' issue
        for r in planner.plan_experts(plan, batched=True):
            key = (layer, r.expert)
            if r.late_copy is not None:
                copies.issue(r.late_copy)
            if r.prefetch_used is not None:
                self.recorder.prefetch_used(ExpertKey(*key), r.prefetch_used, clock.now_ms())
            if r.outcome == "approx":          # the segment's LoRE branch computes it
                slot_of[r.expert] = APPROX_SLOT
                continue
            wait.append(r.slot)
            slot_of[r.expert] = r.slot
        copies.wait_ready_many(wait)
        for e in fell_back:            # fell back to a copy: an ordinary cached expert from here on
            planner.release_fallback(ExpertKey(layer, e))
        # Recorded once the next segment is launched (`run_deferred`): the GPU need not wait for the bookkeeping.
        self._deferred_record = (layer, plan.needed, plan.outcomes)
        if planner.prefetching and self.predictor is not None:
            if draft_row is not None:
                predict = lambda: self.predictor.predictions_from_readback(layer, draft_row)   # noqa: E731
            else:
                predict = lambda: self.predictor.predict(layer, None, self.ctx)   # noqa: E731
            self._deferred = (layer, predict, plan.needed)
        return [slot_of[e] for e in expert_ids]

    @staticmethod
    def lm_keys(layer: int, experts) -> frozenset:
        return frozenset(ExpertKey(layer, e) for e in experts)

    def run_deferred(self) -> None:
        """What `decide_layer` left, done now that the decoder has launched the segment that reads the layer's
        experts: the layer's outcomes recorded (and its observers called), then the lookahead planned (the
        layer's slots stay protected meanwhile). Nothing when none is pending. ``draft_row`` is read here,
        before the next token's segment overwrites it (FASTPATH H5)."""
        if self._deferred_record is not None:
            self._record_deferred()
        job, self._deferred = self._deferred, None
        if job is not None:
            layer, predict, needed = job
            self._prefetch(layer, predict, self.lm_keys(layer, needed))

    def _record_deferred(self) -> None:
        """The recorder's and the observers' part of the last `decide_layer` (outcomes None: all plain hits)."""
        (layer, experts, outcomes), self._deferred_record = self._deferred_record, None
        if outcomes is None:
            self._hits_done(layer, experts)
            return
        self.recorder.layer_outcomes(layer, experts, outcomes)
        for obs in self.layer_observers:
            obs(self, layer)

    def _hits_done(self, layer: int, expert_ids) -> None:
        """What the phases record of a layer whose selections were all plain hits, and its observers."""
        self.recorder.layer_hits(layer, sorted(expert_ids))
        for obs in self.layer_observers:
            obs(self, layer)

    def _prefetch(self, layer: int, predict, protected: frozenset = frozenset()) -> None:
        """``protected``: experts a launched segment still reads, which no prefetch may evict."""
        planner = self.planner
        if not planner.plan_pays():
            if hasattr(self.predictor, "discard"):
                self.predictor.discard()
            orders = planner.plan_prefetch(layer, None, self._queues())
        else:
            preds = predict()
            self.clock.plan(layer)
            orders = planner.plan_prefetch(layer, preds, self._queues(), protected=protected)
        now = self.clock.now_ms
        for order, handle in zip(orders.copies, self.executor.copies.issue_many(orders.copies)):
            planner.prefetch_issued(order, layer, now(), handle.end_ms)
        self.recorder.lookahead(orders.depth, orders.stop_reason, orders.h_min, orders.skipped_approx)
