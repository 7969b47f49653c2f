"""Confidence-aware adaptive lookahead: which predicted experts to prefetch now.

After layer l's router runs, the predictor gives, for d = 1, 2, ..., a confidence per
expert of the MoE layer d steps ahead (crossing into the next token). Candidates are the
experts with confidence >= tau_prefetch (at most 2k per layer), from d = 1 up to the first
layer where none is confident or max_lookahead. Of those:

- d = 1: queued most confident first while they arrive before layer l+1 starts; a late one
  only if it is very likely needed (probability of use >= LATE_MIN_USE_PROB, see below): it
  still lands before the demand copy it replaces, while a late wasted one delays the demand
  copies of the layer it was meant for and evicts a cached expert for nothing.
- d >= 2: most confident first across all distances, each admitted while the copy queue can
  still deliver it before layer l+d starts, counting what the queue must carry before then:

      max(now, copy_free_at) + copy_ms * load(d')  <=  now + d' * layer_ms      for every d' >= d
      load(d') = prefetches chosen for layers l+1..l+d'
                 + expected demand copies of layers l+1..l+d'-1 (issued when each starts)
      expected demand of layer l+j = max(0, k - expected number of its experts resident,
                                               in flight or chosen)

  Probabilities of use are the confidences rescaled so each layer's sum to k (a router
  softmax sums to 1; calibrated confidences already sum to ~k). A chosen expert of
  probability p thus adds a full copy before its own layer but only (1 - p) before later
  ones (it replaces its own likely demand copy). Choosing unit-length copies with deadlines,
  most valuable first with a feasibility check, maximises the expected number of prefetch
  hits (a scheduling matroid). Copies are issued in order of need (nearer layers first, then
  confidence), the order their deadlines come in.

Where the policy approximates cheap misses (LoRE below tau_approx), a candidate whose predicted router
weight is below tau_approx is not copied: its miss costs no copy either way (``min_weight``).

Predictions beyond max_lookahead (or past the first distance without a confident expert)
are not prefetched, but their confident experts still get a predicted next use: the cache
evicts by farthest predicted next use (policy/cache.py), and a longer view makes that closer
to Belady's rule (measured on spice-mini at 25% cache: 57% -> ~65% of the lru -> oracle TPOT
gap with the draft's 8 distances informing eviction at max_lookahead 4).

The depth adapts every step: the farthest distance up to which every confident expert is
resident, in flight or chosen. Why it stopped there:
  "confidence"  no expert at the next distance reached tau_prefetch
  "time"        the queue could not deliver a confident expert of the next distance in time
  "bound"       max_lookahead (or the end of the predictions) was reached
  "cache"       the plan reached max_items (the planner also reports it when no slot
                could be freed without evicting something needed sooner)
  "cost"        the planner skipped the plan: on this machine planning costs the host more
                than the copy stalls it could hide (only with a profile that models the host)

Host cost (profiles that model the host, e.g. recalibrated from a measured run): issuing a
copy costs the host ``issue_ms`` whether or not the expert is used, and saves at most one
exposed copy (``copy_ms``) when it is. A candidate is only worth it when its probability of
use p satisfies p * copy_ms > issue_ms; below that it is not taken (stop reason "cost").

Alongside, the SPICE paper's H_min = P * M_e / (B * T_comp): the lookahead depth needed
to hide a layer's P missing experts of M_e bytes over a link of B bytes/ms behind
T_comp ms of compute per layer.

Pure: lists of floats and a residency test in, a plan out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from operator import attrgetter
from typing import Callable, NamedTuple, Sequence

from spice_core.types import ExpertKey


class LayerPrediction(NamedTuple):
    """Predicted routing of the MoE layer ``distance`` layers ahead (may cross into the next token).

    A named tuple: the draft makes eight per MoE layer per token, and a frozen dataclass cost ~3 µs each.
    ``probs`` and ``order`` are read-only sequences (tuples, or lists their maker no longer touches)."""

    distance: int
    layer: int
    probs: Sequence[float]       # confidence per expert
    order: Sequence[int] | None = None     # experts by descending confidence, ties by index (optional:
                                           # predictors that sort on the device save the planner a sort)
    weights: Sequence[float] | None = None   # predicted router weight per expert, as the family weighs its
                                             # top-k (optional: the draft's, a numpy row; see `min_weight`)

    def ranked(self) -> Sequence[int]:
        if self.order is not None:
            return self.order
        probs = self.probs
        return tuple(sorted(range(len(probs)), key=lambda e: (-probs[e], e)))


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
    skipped_approx: int = 0      # confident candidates not copied: predicted to weigh less than min_weight


def h_min(missing_per_layer: float, expert_bytes: int, bandwidth_bytes_per_ms: float, layer_ms: float) -> float:
    """The paper's minimum lookahead depth H_min = P * M_e / (B * T_comp)."""
    if bandwidth_bytes_per_ms <= 0 or layer_ms <= 0:
        return float("inf")
    return missing_per_layer * expert_bytes / (bandwidth_bytes_per_ms * layer_ms)


def plan_pays(host_plan_ms: float, recent_miss_rate: float, top_k: int, copy_ms: float) -> bool:
    """Is a layer's lookahead plan worth its host time? It can hide at most the copies the layer
    would otherwise expose: the recent miss rate x k copies. Free plans (no host cost) always pay."""
    return host_plan_ms <= 0 or host_plan_ms <= recent_miss_rate * top_k * copy_ms


@cache
def _layer_keys(layer: int, n_experts: int) -> tuple[ExpertKey, ...]:
    """ExpertKey(layer, e) for every e, made once: a plan looks up a few hundred keys."""
    return tuple(ExpertKey(layer, e) for e in range(n_experts))


_by_distance = attrgetter("distance")


def _rows_from(on_way) -> Callable[[int, int], Sequence[int]]:
    """A layer's row (1: resident or in flight, per expert) from a container of keys."""
    def row(layer: int, n_experts: int) -> bytes:
        keys = _layer_keys(layer, n_experts)
        return bytes(key in on_way for key in keys)
    return row


class _Contains:
    """A predicate seen as a container (``key in c`` calls it)."""

    __slots__ = ("test",)

    def __init__(self, test: Callable[[ExpertKey], bool]) -> None:
        self.test = test

    def __contains__(self, key: ExpertKey) -> bool:
        return bool(self.test(key))


# A next-layer expert that cannot arrive in time is queued only if at least this likely. On a saturated
# link a late prefetch gains little (the copy would cross the link anyway, as a demand copy) while a
# wasted one costs a full copy plus the cached expert it evicted: measured on spice-mini at 25% cache
# (deepseek-v2-lite shape), 0.8 beat 0.5 by 1.5-8% TPOT on rtx4090-pcie4x16 and h200-pcie5x16.
LATE_MIN_USE_PROB = 0.8


def plan_lookahead(
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
    on_way_rows: Callable[[int, int], Sequence[int]] | None = None,
    miss_ms: float | None = None,
    min_weight: float = 0.0,
) -> PrefetchPlan:
    """See the module docstring. ``predictions`` may come in any order; one per distance, each distance's
    confidences a sequence or a numpy row. ``is_resident_or_inflight``: a predicate, or any container of the
    keys resident or in flight. ``on_way_rows(layer, n_experts)``, when given, answers the same question
    for a whole layer at once (row[e] true when expert e is, e.g. `Residency.on_way_row`): indexing a row
    costs less than hashing a key, and the plan asks a few hundred times a layer.
    ``miss_ms``: what an exact miss costs when it is not copied, where that is cheaper than a copy (the CPU
    lane's run of one expert). A miss then goes to the lane, not the link: the queue carries no expected demand
    copies, and a prefetch that lands later than ``miss_ms`` after its layer starts saves nothing (the lane
    finishes first), so none is queued that late. None: misses are copied (the rules above).
    ``min_weight`` (> 0: the LoRE threshold tau_approx of a policy that approximates): a candidate whose
    predicted router weight (``LayerPrediction.weights``) is below it is not copied, since its miss would be
    approximated, not waited for (policy/miss.py rule 2): the copy would buy no time and, when it lands late,
    not even the exact expert. It still informs eviction. Predictions without weights are not filtered."""
    preds = sorted(predictions, key=_by_distance)
    k = max(top_k, 1)
    queue_end = max(now_ms, copy_free_at_ms)
    next_use: dict[ExpertKey, int] = {}
    cands: dict[int, list[tuple[float, int, ExpertKey, float]]] = {}   # d -> (confidence, expert, key, use prob.)
    covered: dict[int, float] = {}          # d -> expected number of layer l+d's experts already on their way
    not_worth: set[int] = set()              # distances with a confident expert not worth its host cost
    loop_reason, last_d = "bound", 0
    if on_way_rows is None:
        on_way = _Contains(is_resident_or_inflight) if callable(is_resident_or_inflight) else is_resident_or_inflight
        on_way_rows = _rows_from(on_way)
    seen: set[ExpertKey] = set()
    skipped_approx = 0
    collecting = True
    for pred in preds:
        d, probs, layer = pred.distance, pred.probs, pred.layer
        ranked = pred.ranked()
        keys = _layer_keys(layer, len(probs))
        # The 2k most confident at or above tau (ties: lower expert index): a prefix of the ranking. Every
        # prediction informs eviction, also beyond the prefetch horizon.
        top = ranked[:2 * k]
        n_conf = 0
        for e in top:
            if probs[e] < tau_prefetch:
                break
            n_conf += 1
        confident = top[:n_conf]
        setdefault = next_use.setdefault        # distances ascend: the nearest use of a key is kept
        for e in confident:
            setdefault(keys[e], d)
        if not collecting:
            continue
        if d > max_lookahead:
            collecting = False
            continue
        if not confident:
            loop_reason, collecting = "confidence", False
            continue
        last_d = d
        row = on_way_rows(layer, len(probs))      # row[e]: expert e of the layer is resident or in flight
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
            if row[e]:
                u = c * scale
                cov += u if u < 1.0 else 1.0
        covered[d] = cov
        cands[d] = []
        weights = pred.weights if min_weight > 0 else None
        for e in confident:
            key = keys[e]
            if key not in seen and not row[e]:
                if weights is not None and weights[e] < min_weight:
                    skipped_approx += 1
                else:
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

    # d = 1: most confident first; in time, or late but more likely needed than not (and, where misses go to
    # the CPU lane, landing before the lane would have finished the expert).
    for cand in sorted(cands.get(1, ()), key=lambda t: (-t[0], t[1])):
        if not room():
            dropped.setdefault(1, "cache")
            break
        lands = queue_end + copy_ms * (n_items + 1)
        if lands > now_ms + layer_ms + 1e-9 and (cand[3] < LATE_MIN_USE_PROB or
                                                  (miss_ms is not None and lands > now_ms + layer_ms + miss_ms)):
            dropped.setdefault(1, "time")
            continue
        take(1, cand)
        n_items += 1
    demand = miss_ms is None          # expected demand copies load the link only when misses are copied

    def fits_from(d: int) -> bool:
        """Every deadline from layer l+d on holds: everything the queue carries before layer l+upto starts
        arrives by then, for each upto >= d of dists (the prefetches chosen for layers l+1..l+upto and the
        expected demand copies of layers l+1..l+upto-1). One pass over dists: the load of each upto is the
        running sum of the layers before it plus its own prefetches, added in the order of dists, so each is
        the same float a separate sum up to it would give."""
        before = 0       # the load of the layers before the current one
        for j in dists:
            n_j = len(chosen[j])
            if j >= d and queue_end + copy_ms * (before + (n_j + 0.0)) > now_ms + j * layer_ms + 1e-9:
                return False
            before += n_j + (max(0.0, k - covered[j]) if demand else 0.0)
        return True

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
        if fits_from(d):
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
    return PrefetchPlan(tuple(items), depth, reason, h_min_value, next_use, skipped_approx)
