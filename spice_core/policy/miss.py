"""The per-miss decision: approximate, run on the CPU, copy in, or wait for a prefetch.

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
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum


class MissAction(str, Enum):
    WAIT_PREFETCH = "prefetch_hit"
    APPROX = "approx"
    CPU = "cpu"
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

    def __post_init__(self) -> None:
        if not 0.0 <= self.tau_approx <= 1.0:
            raise ValueError(f"tau_approx={self.tau_approx} must be in [0, 1]")


def decide_miss(router_weight: float, costs: MissCosts, opts: MissOptions) -> MissAction:
    """One miss. ``router_weight``: the largest weight any token of this step gives the expert."""
    inflight = costs.inflight_arrival_ms
    if inflight is not None and inflight <= costs.now_ms:
        return MissAction.WAIT_PREFETCH
    if opts.can_approx and router_weight < opts.tau_approx:
        return MissAction.APPROX
    # Exact options, in tie-breaking order.
    options: list[tuple[float, MissAction]] = []
    if inflight is not None:
        options.append((inflight + costs.gpu_ms, MissAction.WAIT_PREFETCH))
    if opts.can_copy:
        options.append((costs.copy_done_ms() - costs.copy_value_ms, MissAction.COPY))
    if opts.can_cpu:
        options.append((costs.cpu_done_ms(), MissAction.CPU))
    if not options:
        raise ValueError("no exact miss path enabled (copy and CPU lane both off, nothing in flight)")
    best_ms = min(t for t, _ in options)
    return next(a for t, a in options if t == best_ms)


@dataclass(frozen=True)
class MissRequest:
    """One missed expert of a layer, as `plan_misses` sees it."""

    router_weight: float
    copy_ms: float
    cpu_ms: float
    gpu_ms: float = 0.0
    inflight_arrival_ms: float | None = None    # set: a prefetch of it is in flight (no second copy)
    copy_value_ms: float = 0.0


@dataclass
class QueueState:
    """When the copy queue and each CPU worker drain (ms); `plan_misses` advances it."""

    now_ms: float
    copy_free_at_ms: float
    cpu_free_at_ms: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.cpu_free_at_ms:
            self.cpu_free_at_ms = [self.now_ms]


def plan_misses(requests: list[MissRequest], queues: QueueState, opts: MissOptions) -> list[MissAction]:
    """Decide every miss of one layer in order, charging each choice to its queue first, so
    later misses see the backlog earlier ones created (5 misses do not all pick the one lane
    that was free for the first). Mutates ``queues``; returns one action per request."""
    actions = []
    for req in requests:
        w = min(range(len(queues.cpu_free_at_ms)), key=lambda i: queues.cpu_free_at_ms[i])
        costs = MissCosts(now_ms=queues.now_ms, copy_free_at_ms=queues.copy_free_at_ms, copy_ms=req.copy_ms,
                          cpu_free_at_ms=queues.cpu_free_at_ms[w], cpu_ms=req.cpu_ms,
                          inflight_arrival_ms=req.inflight_arrival_ms, gpu_ms=req.gpu_ms,
                          copy_value_ms=req.copy_value_ms)
        req_opts = opts if req.inflight_arrival_ms is None else replace(opts, can_copy=False)
        action = decide_miss(req.router_weight, costs, req_opts)
        if action == MissAction.COPY:
            queues.copy_free_at_ms = max(queues.now_ms, queues.copy_free_at_ms) + req.copy_ms
        elif action == MissAction.CPU:
            queues.cpu_free_at_ms[w] = costs.cpu_done_ms()
        actions.append(action)
    return actions
