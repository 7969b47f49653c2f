"""Eviction policies for the GPU expert cache, over plain `SlotView`s.

- `LruEviction`: least recently used (mixtral-offloading's scheme).
- `LfuEviction`: least frequently used, LRU among ties.
- `FarthestNextUseEviction`: Belady-style with *predicted* next use: evict the expert
  whose predicted next use (in layers from now) is farthest, unpredicted = infinitely
  far; LRU among ties. Used by the prefetching policies so a prefetch never evicts an
  expert needed sooner than the one it brings in.

Policies receive the resident experts as an iterable of `SlotView`s in LRU order (least
recently used first), produced lazily, so LRU and "never predicted again" victims are
found without scanning the whole cache. A policy returns None when no slot may be
evicted (all are busy/protected).
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, NamedTuple, Protocol, Sequence

from spice_core.types import ExpertKey


class SlotView(NamedTuple):
    """One resident expert as an eviction policy sees it (a named tuple: one is made per candidate looked at)."""

    key: ExpertKey
    last_use_tick: int
    use_count: int
    protected: bool = False   # in use by the current layer, or wanted sooner than the incoming expert


class EvictionPolicy(Protocol):
    name: str

    def choose_victim(self, slots: Sequence[SlotView], next_use: Mapping[ExpertKey, float] | None = None) -> ExpertKey | None: ...


class LruEviction:
    name = "lru"

    def choose_victim(self, slots, next_use=None):
        best = None
        for s in slots:
            if s.protected:
                continue
            if best is None or s.last_use_tick < best.last_use_tick:
                best = s
                break   # slots arrive in LRU order: the first unprotected one is the LRU
        return None if best is None else best.key


class LfuEviction:
    name = "lfu"

    def choose_victim(self, slots, next_use=None):
        cands = [s for s in slots if not s.protected]
        if not cands:
            return None
        return min(cands, key=lambda s: (s.use_count, s.last_use_tick, s.key)).key


class FarthestNextUseEviction:
    """Evict the expert predicted to be needed last (never = +inf); LRU among ties.

    ``horizon``: an incoming expert needed at distance ``d`` may only evict experts whose
    predicted next use is farther than ``d`` (callers pass it via `victim_for`).
    """

    name = "farthest_next_use"

    def choose_victim(self, slots, next_use=None):
        return self.victim_for(slots, next_use or {}, incoming_distance=-math.inf)

    def victim_for(self, slots: Iterable[SlotView], next_use: Mapping[ExpertKey, float],
                   incoming_distance: float) -> ExpertKey | None:
        best, best_d = None, -math.inf
        for s in slots:                         # LRU order
            if s.protected:
                continue
            d = next_use.get(s.key, math.inf)
            if d == math.inf:
                return s.key                    # never predicted again, least recently used: done
            if d > incoming_distance and d > best_d:
                best, best_d = s, d
        return None if best is None else best.key


EVICTION_POLICIES = {"lru": LruEviction, "lfu": LfuEviction, "farthest_next_use": FarthestNextUseEviction}


def cache_slots_for_budget(budget_bytes: int, expert_bytes: int, reserved_bytes: int = 0) -> int:
    """How many expert slots fit a byte budget after reserved bytes (LoRE, draft heads)."""
    if expert_bytes <= 0:
        raise ValueError("expert_bytes must be > 0")
    return max(0, (budget_bytes - reserved_bytes) // expert_bytes)
