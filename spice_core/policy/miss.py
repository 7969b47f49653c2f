"""The per-miss decision: approximate, run on the CPU, copy in, or wait for a prefetch.

Pure: plain numbers in (the router weight, costs in ms from the cost model, queue
positions), an action out. Why this order:
1. An expert already in flight (prefetch) is waited for when it lands no later than a
   fresh copy or a CPU run could finish: its bytes are already paid for.
2. Low-importance misses (router weight < tau_approx) are approximated by the resident
   shared expert + LoRE surrogate: the cheapest option, lossy, so only below a threshold
   the user controls (tau_approx = 0 keeps SPICE exact).
3. Otherwise the exact option that finishes first by the cost model: the CPU lane
   (its queue + compute + activation round trip) or a copy (copy-queue backlog + transfer).
   The choice follows the machine: on a PCIe 5.0 x16 box copies usually win, on a
   PCIe 4.0 x8 desktop the CPU does.
"""
from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class MissOptions:
    tau_approx: float = 0.0
    can_approx: bool = False
    can_cpu: bool = False
    can_copy: bool = True


def decide_miss(router_weight: float, costs: MissCosts, opts: MissOptions) -> MissAction:
    copy_done = max(costs.now_ms, costs.copy_free_at_ms) + costs.copy_ms
    cpu_done = max(costs.now_ms, costs.cpu_free_at_ms) + costs.cpu_ms
    if costs.inflight_arrival_ms is not None:
        best_other = min(copy_done if opts.can_copy else float("inf"), cpu_done if opts.can_cpu else float("inf"))
        if costs.inflight_arrival_ms <= best_other or not (opts.can_copy or opts.can_cpu):
            return MissAction.WAIT_PREFETCH
    if opts.can_approx and router_weight < opts.tau_approx:
        return MissAction.APPROX
    if opts.can_cpu and (not opts.can_copy or cpu_done < copy_done):
        return MissAction.CPU
    if not opts.can_copy and not opts.can_cpu:
        raise ValueError("no exact miss path enabled")
    return MissAction.COPY
