"""Confidence-aware adaptive lookahead: which predicted experts to prefetch now.

After layer l's router runs, for d = 1, 2, ...: take layer l+d's experts whose predicted
confidence >= tau_prefetch, in order of need (nearer layers first, then by confidence),
and queue each while the copy queue can still deliver it before layer l+d starts:

    arrival = max(now, copy_free_at) + queued_ms + copy_ms   <=   now + d * layer_ms

(d = 1 is exempt: a late prefetch of the next layer's expert still lands before the
demand copy that would otherwise be issued when that layer starts.)

The depth therefore adapts every step, and we record why it stopped:
  "confidence"  no expert at depth d reached tau_prefetch
  "time"        the queue could not deliver depth d's experts in time
  "bound"       d reached max_lookahead (or the end of the predictions)
  "cache"       no slot could be freed without evicting something needed sooner

Alongside, the SPICE paper's H_min = P * M_e / (B * T_comp): the lookahead depth needed
to hide a layer's P missing experts of M_e bytes over a link of B bytes/ms behind
T_comp ms of compute per layer.

Pure: lists of floats in, a plan out.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Sequence

from spice_core.types import ExpertKey


@dataclass(frozen=True)
class LayerPrediction:
    """Predicted routing of the MoE layer ``distance`` layers ahead (may cross into the next token)."""

    distance: int
    layer: int
    probs: tuple[float, ...]     # confidence per expert


@dataclass(frozen=True)
class PrefetchItem:
    key: ExpertKey
    distance: int
    confidence: float
    arrival_ms: float            # predicted, on the planner's clock


@dataclass(frozen=True)
class PrefetchPlan:
    items: tuple[PrefetchItem, ...]
    depth: int                   # deepest distance that got (or needed nothing more than) prefetches
    stop_reason: str
    h_min: float
    next_use: dict = field(default_factory=dict)   # ExpertKey -> predicted distance (confident ones)


def h_min(missing_per_layer: float, expert_bytes: int, bandwidth_bytes_per_ms: float, layer_ms: float) -> float:
    """The paper's minimum lookahead depth H_min = P * M_e / (B * T_comp)."""
    if bandwidth_bytes_per_ms <= 0 or layer_ms <= 0:
        return float("inf")
    return missing_per_layer * expert_bytes / (bandwidth_bytes_per_ms * layer_ms)


def plan_lookahead(
    predictions: Sequence[LayerPrediction],
    *,
    is_resident_or_inflight: Callable[[ExpertKey], bool],
    tau_prefetch: float,
    max_lookahead: int,
    now_ms: float,
    copy_free_at_ms: float,
    copy_ms: float,
    layer_ms: float,
    top_k: int,
    max_items: int | None = None,
    h_min_value: float = 0.0,
) -> PrefetchPlan:
    items: list[PrefetchItem] = []
    planned: set[ExpertKey] = set()
    next_use: dict[ExpertKey, int] = {}
    queue_end = max(now_ms, copy_free_at_ms)
    depth, reason = 0, "bound"
    for pred in sorted(predictions, key=lambda p: p.distance):
        if pred.distance > max_lookahead:
            reason = "bound"
            break
        # The 2k most confident (ties: lower expert index), without sorting all E experts.
        ranked = heapq.nsmallest(max(top_k, 1) * 2, range(len(pred.probs)), key=lambda e: (-pred.probs[e], e))
        confident = [e for e in ranked if pred.probs[e] >= tau_prefetch]
        for e in confident:
            next_use.setdefault(ExpertKey(pred.layer, e), pred.distance)
        if not confident:
            reason = "confidence"
            break
        deadline = now_ms + pred.distance * layer_ms
        stopped = False
        for e in confident:
            key = ExpertKey(pred.layer, e)
            if key in planned or is_resident_or_inflight(key):
                continue
            if max_items is not None and len(items) >= max_items:
                reason, stopped = "cache", True
                break
            arrival = queue_end + copy_ms
            # The next layer's experts are always worth queueing: even a late prefetch lands before
            # a demand copy issued when the layer starts. Deeper speculation must arrive in time,
            # or it would only delay the copies nearer layers need.
            if arrival > deadline and pred.distance > 1:
                reason, stopped = "time", True
                break
            items.append(PrefetchItem(key, pred.distance, pred.probs[e], arrival))
            planned.add(key)
            queue_end = arrival
        if stopped:
            break
        depth = pred.distance
    return PrefetchPlan(tuple(items), depth, reason, h_min_value, next_use)
