"""The lookahead plan as first written: plain Python, one expert at a time. Kept as the definition that
`spice_core.policy.prefetch.plan_lookahead` (vectorised over a residency mask) must reproduce exactly."""
from __future__ import annotations

from typing import Sequence

from spice_core.policy.prefetch import (LATE_MIN_USE_PROB, LayerPrediction, PrefetchItem, PrefetchPlan, _by_distance,
                                        _Contains, _layer_keys)
from spice_core.types import ExpertKey


def plan_lookahead_reference(
    predictions: Sequence[LayerPrediction],
    *,
    is_resident_or_inflight,
    tau_prefetch: float,
    max_lookahead: int,
    now_ms: float,
    copy_free_at_ms: float,
    copy_ms: float,
    layer_ms: float,
    top_k: int,
    max_items: int | None = None,
    h_min_value: float = 0.0,
    issue_ms: float = 0.0,
) -> PrefetchPlan:
    """See the module docstring. ``predictions`` may come in any order; one per distance.
    ``is_resident_or_inflight``: a predicate, or any container of the keys resident or in flight (a
    membership test costs less than a call, and this asks a few hundred times a layer)."""
    on_way = _Contains(is_resident_or_inflight) if callable(is_resident_or_inflight) else is_resident_or_inflight
    k = max(top_k, 1)
    queue_end = max(now_ms, copy_free_at_ms)
    next_use: dict[ExpertKey, int] = {}
    cands: dict[int, list[tuple[float, int, ExpertKey, float]]] = {}   # d -> (confidence, expert, key, use prob.)
    covered: dict[int, float] = {}          # d -> expected number of layer l+d's experts already on their way
    seen: set[ExpertKey] = set()
    not_worth: set[int] = set()              # distances with a confident expert not worth its host cost
    loop_reason, last_d = "bound", 0
    collecting = True
    for pred in sorted(predictions, key=_by_distance):
        d, probs, layer = pred.distance, pred.probs, pred.layer
        ranked = pred.ranked()
        keys = _layer_keys(layer, len(probs))
        # The 2k most confident at or above tau (ties: lower expert index): a prefix of the ranking.
        n_conf = 0
        for e in ranked[:2 * k]:
            if probs[e] < tau_prefetch:
                break
            n_conf += 1
        confident = ranked[:n_conf]
        for e in confident:      # every prediction informs eviction, also beyond the prefetch horizon
            key = keys[e]
            if key not in next_use:
                next_use[key] = d
        if not collecting:
            continue
        if d > max_lookahead:
            collecting = False
            continue
        if n_conf == 0:
            loop_reason, collecting = "confidence", False
            continue
        last_d = d
        # Probabilities of use: confidences rescaled so the layer's sum to k (a router softmax sums to 1,
        # calibrated confidences already to ~k), capped at 1. They only estimate demand copies.
        total = sum(probs)
        scale = k / total if total > 0 else 0.0
        floor = 0.05 / scale if scale > 0 else float("inf")     # experts below 5% hardly change the estimate
        cov = 0.0
        for e in ranked:
            c = probs[e]
            if c < floor:
                break
            if keys[e] in on_way:
                u = c * scale
                cov += u if u < 1.0 else 1.0
        covered[d] = cov
        cands[d] = []
        for e in confident:
            key = keys[e]
            if key not in seen and key not in on_way:
                use = min(1.0, probs[e] * scale)
                if use * copy_ms > issue_ms:
                    cands[d].append((probs[e], e, key, use))
                else:
                    not_worth.add(d)
            seen.add(key)
    dists = sorted(cands)
    chosen: dict[int, list[tuple[float, int, ExpertKey, float]]] = {d: [] for d in dists}
    dropped: dict[int, str] = {}            # distance -> why a confident expert there was not taken
    n_items = 0

    def room() -> bool:
        return max_items is None or n_items < max_items

    def take(d, cand) -> None:
        chosen[d].append(cand)
        covered[d] += cand[3]

    def untake(d) -> None:
        covered[d] -= chosen[d].pop()[3]

    # d = 1: most confident first; in time, or late but more likely needed than not.
    for cand in sorted(cands.get(1, ()), key=lambda t: (-t[0], t[1])):
        if not room():
            dropped.setdefault(1, "cache")
            break
        if queue_end + copy_ms * (n_items + 1) > now_ms + layer_ms + 1e-9 and cand[3] < LATE_MIN_USE_PROB:
            dropped.setdefault(1, "time")
            continue
        take(1, cand)
        n_items += 1

    def fits(upto: int) -> bool:
        """Everything the queue carries before layer l+upto starts arrives by then: the prefetches
        chosen for layers l+1..l+upto and the expected demand copies of layers l+1..l+upto-1."""
        load = 0       # summed in the order of dists, as sum() over them would
        for j in dists:
            if j <= upto:
                load += len(chosen[j]) + (max(0.0, k - covered[j]) if j < upto else 0.0)
        return queue_end + copy_ms * load <= now_ms + upto * layer_ms + 1e-9

    # d >= 2: most confident first, while every deadline from its layer on still holds.
    # Loads only grow as items are taken, and a later candidate of the same distance adds at least as
    # much (1 before its own layer, 1 - p with a smaller p after it): once one misses a deadline, every
    # later one of its distance does too, so those are skipped without checking.
    later = sorted(((c[0], d, c) for d in dists if d >= 2 for c in cands[d]), key=lambda t: (-t[0], t[1], t[2][1]))
    for _, d, cand in later:
        if dropped.get(d) == "time":
            continue
        if not room():
            dropped.setdefault(d, "cache")
            continue
        take(d, cand)
        if all(fits(dd) for dd in dists if dd >= d):
            n_items += 1
        else:
            untake(d)
            dropped.setdefault(d, "time")
    for d in not_worth:
        dropped.setdefault(d, "cost")
    depth, reason = last_d, loop_reason
    for d in dists:
        if d in dropped:
            depth, reason = d - 1, dropped[d]
            break
    items: list[PrefetchItem] = []
    t = queue_end
    for d in dists:
        for c, e, key, _ in sorted(chosen[d], key=lambda x: (-x[0], x[1])):
            t += copy_ms
            items.append(PrefetchItem(key, d, c, t))
    return PrefetchPlan(tuple(items), depth, reason, h_min_value, next_use)
