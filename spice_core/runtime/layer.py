"""LayerRuntime: one MoE layer of one forward pass, wired as predictor -> planner -> executor -> recorder.

    OffloadedExperts.forward(x, top_k_index, top_k_weights) ─► run_layer (eager)
    GraphedDecoder's host step, between two segments        ─► decide_layer (graphed), then run_deferred
      └─► layer_phases, the one sequence both take (runtime/phases.py: how each executor does each phase):
          dense layers timed ─► routing ─► observers ─► all hits? plan_hits ─► done
          planner.plan_layer ─► start (CPU jobs, demand copies) ─► experts (planner.plan_experts)
          ─► finish (eager: CPU results, combine) ─► after: the lookahead (planner.plan_prefetch ─►
          copies.issue_many) and recorder.layer_outcomes, now (eager) or once the next segment runs (graphed)

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
from spice_core.runtime.phases import EagerLayer, GraphedLayer
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
                                  stream=executor.copies.compute_stream)
        prev = -1
        self._layers_before: dict[int, tuple[int, ...]] = {}
        for layer in lm.moe_layers:
            self._layers_before[layer] = tuple(range(prev + 1, layer + 1))
            prev = layer
        self._tail_layers = tuple(range(prev + 1, lm.n_layers))
        # One token's all-hit layers in one planner call and one executor call (the CPU's batched executor, a
        # policy without lookahead): the phases' objects (routes, outcomes, plan, runs) cost more than the math.
        # The fast path's host step takes the same planner call for any policy without lookahead.
        self.decide_hits = not planner.prefetching
        self.hit_path = self.eager.batched and self.decide_hits
        self.deferred_lookahead = None        # the graphed step's lookahead, planned after the next segment's launch
        self.deferred_record = None  # ... and the last decided layer's outcomes, recorded then
        self.observers: list = []   # callables(layer, idx_rows, w_rows): the routing as read back ([T][K] lists)
        self.layer_observers: list = []   # callables(runtime, layer) after each MoE layer: accounting checks

    # ------------------------------------------------------------------ settings and state
    @property
    def slots(self):
        return self.executor.copies.slots

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
        self.ctx.stream = self.executor.copies.compute_stream

    def end_token(self) -> float:
        if self.deferred_record is not None:     # a step that ended without its after-replay hook
            self.record_deferred()
        for layer in self._tail_layers:
            self.clock.layer(layer, 1, dense=True)
        return self.clock.end_token()

    def _queues(self) -> Queues:
        return Queues(self.clock.now_ms(), self.clock.copy_free_at_ms())

    # ------------------------------------------------------------------ the layer
    def run_layer(self, layer: int, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, act):
        """x [T,H], top_k_index/top_k_weights [T,K] -> [T,H], on the eager executor. Called with autograd off: every
        pass that installs a runtime runs under inference mode or no_grad (a decorator here cost 3 µs a layer)."""
        return self.layer_phases(EagerLayer(self, layer, x, top_k_index, top_k_weights, act), x.shape[0])

    def decide_layer(self, layer: int, expert_ids: list[int], weights: list[float], readback_row=None) -> list[int]:
        """The graphed executor's per-layer host step (T=1): the layer's routing has been read back and
        every earlier segment has finished. Plans the layer, issues its demand copies, makes the compute
        stream wait for what this layer needs, and returns the slot of each selection (the next segment
        runs the experts from them). The lookahead and the layer's recording are left for `run_deferred`, which
        the decoder calls once that segment is launched, so the GPU need not wait for them: until then this
        layer's experts stay protected from eviction (the segment reads their slots while the lookahead plans)."""
        return self.layer_phases(GraphedLayer(self, layer, expert_ids, weights, readback_row), 1)

    def layer_phases(self, step, n_tokens: int):
        """The one phase sequence of a MoE layer, for both executors (``step``: an `EagerLayer` or a `GraphedLayer`,
        runtime/phases.py, which carries out each phase its executor's way): the dense layers before it timed, the
        routing, the observers, anything left from the last layer; an all-hit layer in one planner call; else the
        plan and its counts, the start (CPU jobs, demand copies), the experts, the finish, and what comes after
        (the record and the lookahead: now, or deferred past the next segment's launch)."""
        layer, clock, planner = step.layer, self.clock, self.planner
        for l_ in self._layers_before[layer]:
            clock.layer(l_, n_tokens, dense=l_ != layer)
        idx_rows, w_rows = step.routing()
        for obs in self.observers:
            obs(layer, idx_rows, w_rows)
        step.pending()
        if step.hit_path:       # an all-hit layer: one planner call, no plan objects (`plan_hits`)
            slots = planner.plan_hits(layer, idx_rows[0])
            if slots is not None:
                return step.hits(idx_rows[0], slots)
        plan = planner.plan_layer(layer, idx_rows, w_rows, self._queues())
        self.recorder.layer_counts(plan.hits, plan.misses)
        step.start(plan)
        step.experts(plan)
        result = step.finish(plan)
        step.after(plan)
        return result

    @staticmethod
    def lm_keys(layer: int, experts) -> frozenset:
        return frozenset(ExpertKey(layer, e) for e in experts)

    def run_deferred(self) -> None:
        """What `decide_layer` left, done now that the decoder has launched the segment that reads the layer's
        experts: the layer's outcomes recorded (and its observers called), then the lookahead planned (the
        layer's slots stay protected meanwhile). Nothing when none is pending. ``readback_row`` is read here,
        before the next token's segment overwrites it (FASTPATH H5)."""
        if self.deferred_record is not None:
            self.record_deferred()
        job, self.deferred_lookahead = self.deferred_lookahead, None
        if job is not None:
            layer, predict, needed = job
            self.lookahead(layer, predict, self.lm_keys(layer, needed))

    def record_deferred(self) -> None:
        """The recorder's and the observers' part of the last `decide_layer` (outcomes None: all plain hits)."""
        (layer, experts, outcomes), self.deferred_record = self.deferred_record, None
        if outcomes is None:
            self.hits_done(layer, experts)
            return
        self.recorder.layer_outcomes(layer, experts, outcomes)
        for obs in self.layer_observers:
            obs(self, layer)

    def hits_done(self, layer: int, expert_ids) -> None:
        """What the phases record of a layer whose selections were all plain hits, and its observers."""
        self.recorder.layer_hits(layer, sorted(expert_ids))
        for obs in self.layer_observers:
            obs(self, layer)

    def lookahead(self, layer: int, predict, protected: frozenset = frozenset()) -> None:
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
