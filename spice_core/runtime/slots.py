"""SlotBuffer: the GPU expert cache's memory, a fixed number of expert-sized slots.

One [n_slots, numel] tensor allocated once; slot s holds one expert in HostStore's flat
layout ([gate_up (2I x H) | down (H x I)]), so filling a slot is one copy. Which expert sits
in which slot is the planner's book (policy/residency.py); this class only moves bytes.
"""
from __future__ import annotations

import gc

import torch

from spice_core.memory.host_store import ExpertLayout
from spice_core.units import format_bytes


class SlotBuffer:
    def __init__(self, layout: ExpertLayout, n_slots: int, device: torch.device) -> None:
        if n_slots < 0:
            raise ValueError(f"n_slots={n_slots} must be >= 0")
        self.layout = layout
        self.device = device
        self.n_slots = n_slots
        self.buffer = _allocate((n_slots, layout.numel), layout.dtype, device)
        self._rows = self.buffer.unbind(0)     # one view per slot, made once (indexing costs host time per copy)

    @property
    def capacity_bytes(self) -> int:
        return self.n_slots * self.layout.nbytes

    def weights(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [2I,H], down [H,I]) views of one slot."""
        return self.layout.views(self._rows[slot])

    def fill_from(self, slot: int, host_flat: torch.Tensor) -> None:
        """Copy one expert's host buffer into a slot (non-blocking on CUDA: call on the copy stream)."""
        self._rows[slot].copy_(host_flat, non_blocking=self.device.type == "cuda")


def _allocate(shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One large buffer. On a GPU, a previous run's slots can still be held: by a reference cycle the
    garbage collector has not reached yet (its runtime, graphs and observers refer to each other), or as
    blocks PyTorch's allocator keeps cached that need not fit this request (at full scale the buffer is
    ~90 GiB). On out-of-memory, collect that garbage, hand the cache back to the driver, and try once more."""
    try:
        return torch.empty(shape, dtype=dtype, device=device)
    except torch.OutOfMemoryError:
        if device.type != "cuda":
            raise
    gc.collect()
    torch.cuda.empty_cache()
    try:
        return torch.empty(shape, dtype=dtype, device=device)
    except torch.OutOfMemoryError as err:
        nbytes = shape[0] * shape[1] * dtype.itemsize
        raise torch.OutOfMemoryError(f"the GPU cannot hold {shape[0]} expert slots ({format_bytes(nbytes)}) beside "
                                     f"what is resident: lower the expert budget (cache_frac). {err}") from err
