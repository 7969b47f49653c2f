"""Residency: the planner's book of which expert sits in which GPU cache slot.

Pure bookkeeping over slot numbers (no tensors): the executor owns the slot memory and
moves bytes into the slot numbers the planner gives it. Kept apart from the planner so
the book's invariants (a key in at most one slot, busy slots never evicted) are checked
in one place, and apart from the executor so eviction can be tested without a device.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator

from spice_core.policy.cache import SlotView
from spice_core.types import ExpertKey


@dataclass
class SlotBook:
    key: ExpertKey | None = None
    last_use_tick: int = -1
    use_count: int = 0
    prefetched: bool = False       # arrived by prefetch and not used yet
    busy: bool = False             # being read by the layer now: never evict


class Residency:
    def __init__(self, n_slots: int) -> None:
        if n_slots < 0:
            raise ValueError(f"n_slots={n_slots} must be >= 0")
        self.n_slots = n_slots
        self.state = [SlotBook() for _ in range(n_slots)]
        self.where: dict[ExpertKey, int] = {}
        # Resident keys, least recently used first (kept here so eviction never scans all slots).
        self.lru_order: OrderedDict[ExpertKey, None] = OrderedDict()
        self._free = list(range(n_slots - 1, -1, -1))   # a stack: the lowest free slot is taken first
        self._rows: dict[int, bytearray] = {}              # layer -> row[e] = 1 while (layer, e) is in `where`

    def __contains__(self, key: ExpertKey) -> bool:
        return key in self.where

    def __len__(self) -> int:
        return len(self.where)

    def on_way_row(self, layer: int, n_experts: int) -> bytearray:
        """row[e] is 1 while expert e of ``layer`` holds a slot (resident or in flight), kept in step with
        `where` (read-only for callers): the lookahead tests a few hundred experts a layer, and indexing a
        row costs less than hashing a key."""
        row = self._rows.get(layer)
        if row is None or len(row) < n_experts:
            row = bytearray(n_experts)
            for key in self.where:
                if key.layer == layer and key.expert < n_experts:
                    row[key.expert] = 1
            self._rows[layer] = row
        return row

    def free_slot(self) -> int | None:
        return self._free[-1] if self._free else None

    def book(self, key: ExpertKey) -> SlotBook:
        return self.state[self.where[key]]

    def assign(self, slot: int, key: ExpertKey, tick: int, prefetched: bool) -> None:
        s = self.state[slot]
        assert s.key is None, "evict before assigning"
        assert key not in self.where, f"{key} is already resident"
        if self._free and self._free[-1] == slot:     # the usual case: the slot free_slot() offered
            self._free.pop()
        else:
            self._free.remove(slot)
        s.key, s.last_use_tick, s.use_count, s.prefetched, s.busy = key, tick, 0, prefetched, False
        self.where[key] = slot
        self.lru_order[key] = None
        row = self._rows.get(key.layer)
        if row is not None:
            row[key.expert] = 1

    def evict(self, key: ExpertKey) -> int:
        slot = self.where.pop(key)
        self.lru_order.pop(key, None)
        row = self._rows.get(key.layer)
        if row is not None:
            row[key.expert] = 0
        s = self.state[slot]
        assert not s.busy, f"evicting busy slot {slot} ({key})"
        s.key, s.prefetched = None, False
        self._free.append(slot)
        self._free.sort(reverse=True)
        return slot

    def touch(self, key: ExpertKey, tick: int) -> None:
        s = self.state[self.where[key]]
        s.last_use_tick, s.use_count, s.prefetched = tick, s.use_count + 1, False
        self.lru_order.move_to_end(key)

    def use(self, key: ExpertKey, tick: int) -> int:
        """The layer reads ``key`` now: `touch` it and clear its busy mark. Returns its slot."""
        slot = self.where[key]
        s = self.state[slot]
        s.last_use_tick, s.use_count, s.prefetched, s.busy = tick, s.use_count + 1, False, False
        self.lru_order.move_to_end(key)
        return slot

    def views(self, protected: set[ExpertKey]) -> Iterator[SlotView]:
        """Resident experts as SlotViews, least recently used first, produced lazily."""
        where, state = self.where, self.state
        for key in self.lru_order:
            s = state[where[key]]
            yield SlotView(key, s.last_use_tick, s.use_count, protected=s.busy or key in protected)
