"""The per-miss decision: approximate, run on the CPU (exact or int8), copy in, or wait for a prefetch.

Pure: plain numbers in (the router weight, costs in ms from the cost model, when each queue
drains), an action out; no tensors, no clocks. The rules, in order:

1. A prefetch of this expert that has already landed is used (it is a hit in all but name).
2. Low-importance misses (router weight < tau_approx) are approximated by the resident shared
   expert + LoRE surrogate: the cheapest option and lossy, so only below a threshold the user
   controls (tau_approx = 0 keeps SPICE exact). A prefetch still in flight does not stop this:
   waiting for it would stall the GPU for an expert that barely matters to this token.
3. Otherwise the exact option that finishes first by the cost model:
   - wait for the in-flight prefetch (its arrival time; its bytes are already paid for),
   - a copy (the copy queue's backlog + the transfer + the expert on the GPU),
   - the CPU lane (its queue + compute + the activation round trip).
   Ties go in that order. A copy also leaves the expert cached for later tokens, which the CPU
   lane does not: the copy is credited with ``copy_value_ms`` (the planner passes the recent
   hit rate x the copy time, the transfer a later use is expected to save). Without the credit
   the CPU lane, barely faster per miss, starves the cache and the hit rate collapses (seen on
   the shipped model's benchmark). The choice follows the machine: on a PCIe 5.0 x16 box copies usually win, on a PCIe 4.0 x8 desktop
   the CPU lane does, and with both queues in play the misses of one layer are shared out
   between them (`plan_misses` charges each decision to its queue before taking the next).
4. Then, for a miss whose router weight is still below ``tau_int8`` (a second, higher threshold the user
   controls; 0 = off): the CPU lane from the expert's int8 weight-only copy, when that run finishes
   before the exact option chosen in 3 (as that option is scored, the copy's credit included). Lossy, so
   never "exact" and never offered by an exact policy; it costs about half the lane's exact time (half
   the bytes). LoRE keeps the lowest weights (rule 2 comes first).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from spice_core.config import SETTING_RANGES


class MissAction(str, Enum):
    WAIT_PREFETCH = "prefetch_hit"
    APPROX = "approx"
    CPU = "cpu"
    CPU_INT8 = "cpu_int8"       # lossy: the CPU lane from the int8 weight-only copy
    COPY = "copy"


@dataclass(frozen=True)
class MissCosts:
    """Everything in ms on one clock; ``*_free_at_ms`` are when each queue drains."""

    now_ms: float
    copy_free_at_ms: float
    copy_ms: float
    cpu_free_at_ms: float
    cpu_ms: float
    inflight_arrival_ms: float | None = None   # a prefetch of this expert already queued
    gpu_ms: float = 0.0                        # the expert on the GPU once copied in
    copy_value_ms: float = 0.0                 # what caching the copy is expected to save later
    cpu_int8_ms: float | None = None           # the int8 kernel on the CPU lane (None: not offered)

    def copy_done_ms(self) -> float:
        return max(self.now_ms, self.copy_free_at_ms) + self.copy_ms + self.gpu_ms

    def cpu_done_ms(self) -> float:
        return max(self.now_ms, self.cpu_free_at_ms) + self.cpu_ms


@dataclass(frozen=True)
class MissOptions:
    tau_approx: float = 0.0
    can_approx: bool = False
    can_cpu: bool = False
    can_copy: bool = True
    tau_int8: float = 0.0           # lossy int8 CPU runs below this router weight (0: never)
    can_int8: bool = False

    def __post_init__(self) -> None:
        # The run's own thresholds (RunSettings' tau_approx and tau_int8, passed down by the planner): their ranges.
        for name in ("tau_approx", "tau_int8"):
            low, high = SETTING_RANGES[name]
            value = getattr(self, name)
            if not low <= value <= high:
                raise ValueError(f"{name}={value} must be in [{low:g}, {high:g}]")


def decide_miss(router_weight: float, costs: MissCosts, opts: MissOptions) -> MissAction:
    """One miss. ``router_weight``: the largest weight any token of this step gives the expert."""
    int8_ms = costs.cpu_int8_ms if opts.can_int8 and router_weight < opts.tau_int8 else None
    return _decide(router_weight, costs.now_ms, costs.copy_free_at_ms, costs.copy_ms, costs.cpu_free_at_ms,
                   costs.cpu_ms, costs.inflight_arrival_ms, costs.gpu_ms, costs.copy_value_ms,
                   opts.can_approx, opts.tau_approx, opts.can_copy, opts.can_cpu, int8_ms)


def _decide(router_weight: float, now_ms: float, copy_free_at_ms: float, copy_ms: float, cpu_free_at_ms: float,
            cpu_ms: float, inflight: float | None, gpu_ms: float, copy_value_ms: float, can_approx: bool,
            tau_approx: float, can_copy: bool, can_cpu: bool, int8_ms: float | None = None) -> MissAction:
    """`decide_miss` on plain numbers (`plan_misses` decides a few misses per layer per token, and building
    MissCosts for each cost more than the decision). ``int8_ms``: the int8 run's time where this miss may take
    it (offered, and its weight below tau_int8), else None."""
    if inflight is not None and inflight <= now_ms:
        return MissAction.WAIT_PREFETCH
    if can_approx and router_weight < tau_approx:
        return MissAction.APPROX
    # Exact options, in tie-breaking order: the first that finishes soonest wins.
    best, best_ms = None, 0.0
    if inflight is not None:
        best, best_ms = MissAction.WAIT_PREFETCH, inflight + gpu_ms
    if can_copy:
        t = (max(now_ms, copy_free_at_ms) + copy_ms + gpu_ms) - copy_value_ms
        if best is None or t < best_ms:
            best, best_ms = MissAction.COPY, t
    if can_cpu:
        t = max(now_ms, cpu_free_at_ms) + cpu_ms
        if best is None or t < best_ms:
            best, best_ms = MissAction.CPU, t
    if best is None:
        raise ValueError("no exact miss path enabled (copy and CPU lane both off, nothing in flight)")
    if int8_ms is not None and max(now_ms, cpu_free_at_ms) + int8_ms < best_ms:
        return MissAction.CPU_INT8
    return best


class MissRequest(NamedTuple):
    """One missed expert of a layer, as `plan_misses` sees it (a named tuple: made per miss per layer)."""

    router_weight: float
    copy_ms: float
    cpu_ms: float
    gpu_ms: float = 0.0
    inflight_arrival_ms: float | None = None    # set: a prefetch of it is in flight (no second copy)
    copy_value_ms: float = 0.0
    cpu_ms_link_busy: float | None = None       # the CPU lane while copies stream from the same DRAM (None: same)
    cpu_int8_ms: float | None = None            # the lossy int8 run on the lane (None: not offered)
    cpu_int8_ms_link_busy: float | None = None  # ... while copies stream (None: same)


@dataclass
class QueueState:
    """When the copy queue and each CPU worker drain (ms); `plan_misses` advances it. ``side_from`` > 0: the CPU
    lane (one queue) runs a layer's experts side by side from that many on, their wall then their one-after-another
    sum over ``side_speedup`` (the auto lane, `CostModel.lane_batch_factor`); 0: one after another."""

    now_ms: float
    copy_free_at_ms: float
    cpu_free_at_ms: list[float] = field(default_factory=list)
    side_from: int = 0
    side_speedup: float = 1.0

    def __post_init__(self) -> None:
        if not self.cpu_free_at_ms:
            self.cpu_free_at_ms = [self.now_ms]


def plan_misses(requests: list[MissRequest], queues: QueueState, opts: MissOptions) -> list[MissAction]:
    """Decide every miss of one layer in order, charging each choice to its queue first, so
    later misses see the backlog earlier ones created (5 misses do not all pick the one lane
    that was free for the first). Mutates ``queues``; returns one action per request."""
    actions = []
    free = queues.cpu_free_at_ms
    lanes = range(len(free))
    can_approx, tau, can_cpu = opts.can_approx, opts.tau_approx, opts.can_cpu
    tau_int8 = opts.tau_int8 if opts.can_int8 else 0.0
    # A lane that runs the layer's experts side by side ends them together: a lane expert is priced at when the
    # layer's lane jobs, it included, would end (their one-after-another sum, over side_speedup from side_from).
    side = queues.side_from > 0 and queues.side_speedup != 1.0 and len(free) == 1
    lane_start, lane_sum, lane_n = max(queues.now_ms, free[0]), 0.0, 0
    for req in requests:
        w = min(lanes, key=free.__getitem__) if len(free) > 1 else 0
        now = queues.now_ms
        inflight = req.inflight_arrival_ms
        # While the copy queue is busy the lane and the link share the host's DRAM: the lane runs slower.
        link_busy = queues.copy_free_at_ms > now
        cpu_ms = req.cpu_ms_link_busy if req.cpu_ms_link_busy is not None and link_busy else req.cpu_ms
        int8_ms = None
        if req.router_weight < tau_int8 and req.cpu_int8_ms is not None:
            int8_ms = req.cpu_int8_ms_link_busy if req.cpu_int8_ms_link_busy is not None and link_busy \
                else req.cpu_int8_ms
        lane_free, lane_cpu_ms, lane_int8_ms, f = free[w], cpu_ms, int8_ms, 1.0
        if side:
            f = 1.0 / queues.side_speedup if lane_n + 1 >= queues.side_from else 1.0
            lane_free, lane_cpu_ms = lane_start, (lane_sum + cpu_ms) * f
            lane_int8_ms = (lane_sum + int8_ms) * f if int8_ms is not None else None
        action = _decide(req.router_weight, now, queues.copy_free_at_ms, req.copy_ms, lane_free, lane_cpu_ms, inflight,
                         req.gpu_ms, req.copy_value_ms, can_approx, tau, opts.can_copy and inflight is None, can_cpu,
                         lane_int8_ms)
        if action == MissAction.COPY:
            queues.copy_free_at_ms = max(now, queues.copy_free_at_ms) + req.copy_ms
        elif action in (MissAction.CPU, MissAction.CPU_INT8):
            ms = cpu_ms if action == MissAction.CPU else int8_ms
            if side:
                lane_sum, lane_n = lane_sum + ms, lane_n + 1
                free[0] = lane_start + lane_sum * f
            else:
                free[w] = max(now, free[w]) + ms
        actions.append(action)
    return actions
