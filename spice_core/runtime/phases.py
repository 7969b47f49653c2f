"""How each executor carries out the phases of one MoE layer; `LayerRuntime.layer_phases` orders them, once, for both.

    phase        EagerLayer (the prompt; every token off the fast path)   GraphedLayer (the fast path's host step)
    routing      the draft's launch, then ONE readback of the routing      the rows the segment read back
    pending      -                                                         the last layer's deferred record
    hits         run_hits: the K experts in one gathered batch (CPU)       wait for the K slots' copies
    start        CPU jobs, demand copies                                   CPU jobs, demand copies, the jobs joined
                                                                           (a failed one falls back to a copy)
    experts      each expert from its slot, LoRE, late copies              each selection's slot (or LoRE / CPU
                                                                           kind), late copies, one wait for all
    finish       CPU results, the combine in ascending expert order        -
    after        the lookahead (unless it ran before the experts), the     the layer's record and its lookahead,
                 layer's record                                            deferred to `run_deferred`: they run
                                                                           once the next segment is launched

The runtime owns the order and the shared steps (dense-layer timing, observers, the hit-path check, the plan and
its counts); these classes own what differs. One object per layer: it carries the layer's tensors between phases.
"""
from __future__ import annotations

from spice_core.runtime.graphed_plan import APPROX_SLOT
from spice_core.types import ExpertKey


class EagerLayer:
    """A whole layer on the eager executor: x [T,H] -> [T,H]."""

    __slots__ = ("rt", "layer", "x", "top_k_index", "top_k_weights", "act", "rows", "cpu", "outs")

    def __init__(self, rt, layer: int, x, top_k_index, top_k_weights, act) -> None:
        self.rt, self.layer, self.x, self.act = rt, layer, x, act
        self.top_k_index, self.top_k_weights = top_k_index, top_k_weights

    @property
    def hit_path(self) -> bool:
        return self.x.shape[0] == 1 and self.rt.hit_path

    @property
    def prefetching(self) -> bool:
        rt = self.rt
        return rt.planner.prefetching and rt.predictor is not None

    def routing(self):
        rt = self.rt
        if self.prefetching and hasattr(rt.predictor, "launch") and rt.planner.plan_pays():
            rt.predictor.launch(self.layer, self.x[-1:], rt.ctx)    # its readback rides on the routing's below
        return rt.eager.read_routing(self.top_k_index, self.top_k_weights)

    def pending(self) -> None:
        """Nothing is left from an earlier layer on this path."""

    def hits(self, expert_ids, slots):
        rt = self.rt
        final = rt.eager.run_hits(self.layer, expert_ids, slots, self.x, self.top_k_weights, self.act)
        rt.hits_done(self.layer, expert_ids)
        return final

    def start(self, plan) -> None:
        self.rows, self.cpu = self.rt.eager.start_layer(plan, self.x, self.act)
        if self.prefetching and not self.rt.prefetch_after_experts:
            self._lookahead()                  # as early as possible: no host cost to hide (modeled timing)

    def experts(self, plan) -> None:
        rt = self.rt
        self.outs = rt.eager.run_experts(self.layer, rt.planner.plan_experts(plan), self.rows, self.x, self.act)

    def finish(self, plan):
        rt = self.rt
        if self.prefetching and rt.prefetch_after_experts:
            self._lookahead()                  # planned while the GPU runs the experts just launched
        return rt.eager.finish_layer(plan, self.rows, self.outs, self.cpu, self.x, self.top_k_weights, self.act,
                                     rt.planner.plan_fallback)

    def after(self, plan) -> None:
        rt = self.rt
        rt.recorder.layer_outcomes(self.layer, plan.needed, plan.outcomes)
        for obs in rt.layer_observers:
            obs(rt, self.layer)

    def _lookahead(self) -> None:
        rt, layer, x = self.rt, self.layer, self.x
        rt.lookahead(layer, lambda: rt.predictor.predict(layer, x[-1:], rt.ctx))


class GraphedLayer:
    """The graphed executor's host step of one layer (T=1): the routing has been read back and every earlier
    segment has finished. Returns the slot of each selection (APPROX_SLOT / CPU_SLOT for a given output); the
    next segment runs the experts from them. Until `run_deferred` this layer's experts stay protected from
    eviction (the segment reads their slots while the lookahead plans)."""

    __slots__ = ("rt", "layer", "expert_ids", "weights", "readback_row", "slot_of", "fell_back")

    def __init__(self, rt, layer: int, expert_ids: list[int], weights: list[float], readback_row=None) -> None:
        self.rt, self.layer, self.expert_ids, self.weights, self.readback_row = rt, layer, expert_ids, weights, readback_row

    @property
    def hit_path(self) -> bool:
        return self.rt.decide_hits

    def routing(self):
        return [self.expert_ids], [self.weights]

    def pending(self) -> None:
        rt = self.rt
        if rt.deferred_record is not None:    # the decoder launched no segment since the last layer: record now
            rt.record_deferred()

    def hits(self, expert_ids, slots):
        rt = self.rt
        rt.executor.copies.wait_ready_many(slots)
        rt.deferred_record = (self.layer, expert_ids, None)
        return slots

    def start(self, plan) -> None:
        rt, ex, layer = self.rt, self.rt.executor, self.layer
        jobs = ex.submit_cpu(layer, plan.cpu) if plan.cpu else None     # first: they overlap the copies' issue
        ex.copies.issue_many(plan.copies)
        self.slot_of = {}
        if jobs:
            # Joined before the next segment's launch (it reads their outputs); a failed job falls back to a
            # copy placed while the layer's experts are still busy, so none of them is evicted for it.
            fallback = lambda key: rt.planner.plan_fallback(key, hold=True)   # noqa: E731
            self.slot_of = ex.join_cpu(layer, jobs, self.expert_ids, fallback)
        self.fell_back = [e for e, slot in self.slot_of.items() if slot >= 0]

    def experts(self, plan) -> None:
        rt, layer, slot_of = self.rt, self.layer, self.slot_of
        copies, recorder, now = rt.executor.copies, rt.recorder, rt.clock.now_ms
        wait = []               # the slots the segment reads: waited for at once, after the late copies' issue
        late = []               # demand copies placed only now: issued together (one clock event for them)
        for r in rt.planner.plan_experts(plan, batched=True):
            if r.late_copy is not None:
                late.append(r.late_copy)
            if r.prefetch_used is not None:
                recorder.prefetch_used(ExpertKey(layer, r.expert), r.prefetch_used, now())
            if r.outcome == "approx":          # the segment's LoRE branch computes it
                slot_of[r.expert] = APPROX_SLOT
                continue
            wait.append(r.slot)
            slot_of[r.expert] = r.slot
        if late:
            copies.issue_many(late)
        copies.wait_ready_many(wait)
        for e in self.fell_back:       # fell back to a copy: an ordinary cached expert from here on
            rt.planner.release_fallback(ExpertKey(layer, e))

    def finish(self, plan):
        return [self.slot_of[e] for e in self.expert_ids]

    def after(self, plan) -> None:
        """Recorded, and the lookahead planned, once the next segment is launched (`run_deferred`): the GPU need
        not wait for the bookkeeping."""
        rt, layer, readback_row = self.rt, self.layer, self.readback_row
        rt.deferred_record = (layer, plan.needed, plan.outcomes)
        if rt.planner.prefetching and rt.predictor is not None:
            if readback_row is not None:
                predict = lambda: rt.predictor.predictions_from_readback(layer, readback_row, rt.ctx)   # noqa: E731
            else:
                predict = lambda: rt.predictor.predict(layer, None, rt.ctx)   # noqa: E731
            rt.deferred_lookahead = (layer, predict, plan.needed)
