"""GpuSlots: a fixed number of expert-sized slots in device memory, and what each holds.

One [n_slots, numel] tensor allocated once; a slot holds one expert or nothing. This
class only moves bytes and keeps the book (which key sits where, which slots are busy);
which key to evict is decided by a policy over `SlotView`s (policy/cache.py).

On CUDA each slot carries two events, so slots can be reused safely without global
syncs: ``ready`` (the copy into it finished; compute waits on it) and ``free`` (the last
compute that read it finished; a new copy into it waits on it).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from spice_core.memory.host_store import ExpertLayout
from spice_core.types import ExpertKey


@dataclass
class SlotState:
    key: ExpertKey | None = None
    last_use_tick: int = -1
    use_count: int = 0
    inserted_tick: int = -1
    prefetched: bool = False       # arrived by prefetch and not used yet
    busy: bool = False             # being read by the layer now: never evict
    ready_event: object = None
    free_event: object = None
    ready_handle: object = None    # timeline handle of the copy that filled it


class GpuSlots:
    def __init__(self, layout: ExpertLayout, n_slots: int, device: torch.device) -> None:
        assert n_slots >= 0
        self.layout = layout
        self.device = device
        self.n_slots = n_slots
        self.buffer = torch.empty((n_slots, layout.numel), dtype=layout.dtype, device=device)
        self.state = [SlotState() for _ in range(n_slots)]
        self.where: dict[ExpertKey, int] = {}
        # Resident keys, least recently used first (kept here so eviction never scans all slots).
        self.lru_order: OrderedDict[ExpertKey, None] = OrderedDict()

    @property
    def capacity_bytes(self) -> int:
        return self.n_slots * self.layout.nbytes

    @property
    def used_bytes(self) -> int:
        return len(self.where) * self.layout.nbytes

    def free_slot(self) -> int | None:
        if len(self.where) >= self.n_slots:
            return None
        for i, s in enumerate(self.state):
            if s.key is None:
                return i
        return None

    def weights(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layout.views(self.buffer[slot])

    def assign(self, slot: int, key: ExpertKey, tick: int, prefetched: bool) -> None:
        s = self.state[slot]
        assert s.key is None, "evict before assigning"
        s.key, s.inserted_tick, s.last_use_tick, s.use_count, s.prefetched = key, tick, tick, 0, prefetched
        self.where[key] = slot
        self.lru_order[key] = None

    def evict(self, key: ExpertKey) -> int:
        slot = self.where.pop(key)
        self.lru_order.pop(key, None)
        s = self.state[slot]
        assert not s.busy, f"evicting busy slot {slot} ({key})"
        s.key, s.prefetched, s.ready_handle = None, False, None
        return slot

    def touch(self, key: ExpertKey, tick: int) -> None:
        s = self.state[self.where[key]]
        s.last_use_tick, s.use_count, s.prefetched = tick, s.use_count + 1, False
        self.lru_order.move_to_end(key)

    def fill_from(self, slot: int, host_flat: torch.Tensor) -> None:
        """Copy one expert's host buffer into a slot (non-blocking on CUDA: call on the copy stream)."""
        self.buffer[slot].copy_(host_flat, non_blocking=self.device.type == "cuda")
