"""The planner's plain data: what a layer's plan, a lookahead's orders and a copy are (named tuples, cheap to make on
the fast path's host step), the clock readings the planner is given, and what it believes things cost.

Pure: no tensors, streams or clocks. `policy/planner.py` makes these; the executors read them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from spice_core.types import ExpertKey


class CpuTasks(tuple):
    """`LayerPlan.cpu` when some of the layer's CPU-lane experts run the lossy int8 kernel: the experts (ascending
    ids, a tuple like any other plan's) and ``int8``, those of them that do. A plain tuple: every one is exact.
    The executors pick each job's kernel from it (`int8_tasks`)."""

    def __new__(cls, experts, int8):
        self = super().__new__(cls, experts)
        self.int8 = frozenset(int8)
        return self


def int8_tasks(cpu: tuple) -> frozenset:
    """The experts of ``cpu`` (a `LayerPlan.cpu`) that run the int8 kernel: none unless it is a `CpuTasks`."""
    return cpu.int8 if isinstance(cpu, CpuTasks) else frozenset()


class PlanCosts(Protocol):
    """What the planner believes things cost, in ms (timing/costs.py:CostModel implements it)."""

    expert_bytes: int                      # of the modeled shape (for H_min)
    profile: object                        # h2d_pinned_gbps, host_plan_us, host_copy_us, cpu_side_speedup
    lane_side_from: int                    # from how many experts a layer the CPU lane runs them side by side (0: never)

    def copy_ms(self) -> float: ...
    def gpu_layer_ms(self) -> float: ...
    def gpu_expert_ms(self, n_tokens: int = 1) -> float: ...
    def cpu_expert_ms(self, n_tokens: int = 1, link_busy: bool = False) -> float: ...
    def cpu_int8_expert_ms(self, n_tokens: int = 1, link_busy: bool = False) -> float: ...


class Queues(NamedTuple):
    """When the caller's clock says it is, and when the copy queue drains (ms). Made once per layer."""

    now_ms: float
    copy_free_at_ms: float


@dataclass(frozen=True)
class InflightPrefetch:
    key: ExpertKey
    issued_at_layer: int
    issued_ms: float
    arrival_ms: float
    confidence: float


class CopyOrder(NamedTuple):
    """Copy ``key`` into ``slot``; ``evicted`` left it first (``wasted``: a prefetch never used). A named tuple:
    one is made per copy, several a layer for a small cache (a frozen dataclass of nine fields cost ~4 µs)."""

    key: ExpertKey
    slot: int
    kind: str                                   # "copy" (demand) | "prefetch"
    evicted: ExpertKey | None = None
    wasted: InflightPrefetch | None = None      # the evicted prefetch's in-flight entry, when it had one
    evicted_unused_prefetch: bool = False
    distance: int = 0                           # prefetch: layers ahead
    confidence: float = 0.0
    planned_arrival_ms: float = 0.0


class ExpertRun(NamedTuple):
    """One needed expert of the layer, in ascending expert order (the stock loop's). A named tuple: one is made
    per selection per layer, and a frozen dataclass took ~3 µs to build (its fields set one by one)."""

    expert: int
    outcome: str                          # hit | prefetch_hit | approx | copy (cpu, cpu_int8: no run)
    slot: int = -1                        # GPU experts: the slot to read
    late_copy: CopyOrder | None = None    # a demand copy placed only now (no slot was free earlier)
    prefetch_used: InflightPrefetch | None = None   # the prefetch this use consumes
    drop_after: bool = False              # on_demand: the copy is not kept


class LayerPlan(NamedTuple):
    """Phase 1's result for one layer (a named tuple, made once per layer: cheaper than a frozen dataclass)."""

    layer: int
    needed: tuple[int, ...]                            # experts selected by any token, ascending
    routes: dict                                       # expert -> (token rows, top-k positions)
    outcomes: dict                                     # expert -> outcome name
    cpu: tuple[int, ...]                               # experts for the CPU lane, ascending (a CpuTasks when
                                                       # some run the int8 kernel)
    copies: tuple[CopyOrder, ...]                      # demand copies placed before the experts
    hits: int                                          # selections served from the cache
    misses: int


@dataclass(frozen=True)
class PrefetchOrders:
    copies: tuple[CopyOrder, ...]
    depth: int
    stop_reason: str
    h_min: float                                       # -1.0 when not finite or not planned
    skipped_approx: int = 0                            # predicted experts not copied: their misses are approximated
