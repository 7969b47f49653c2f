"""HostStore: every routed expert's weights in host memory, one contiguous buffer each.

Layout of one expert's buffer (dtype of the checkpoint), so a swap is one copy:
    [ gate_up (2I x H) | down (H x I) ]      I expert width, H hidden
On CUDA the buffers are pinned (pageable copies run at a third of the speed). Given the number of
experts up front (``capacity``) they are rows of ONE slab: PyTorch's caching host allocator rounds
every pinned block up to a power of two, so 1,664 separately pinned 17.3 MB experts would pin
55.8 GB for 28.8 GB of weights. The slab is allocated pageable and registered with the driver
(cudaHostRegister: exactly its bytes, no rounding); where registering fails it is one pinned
allocation instead. ``pinned_bytes`` says what is pinned.

Knows nothing of caching, policies or timing.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from spice_core.types import ExpertKey


@dataclass(frozen=True)
class ExpertLayout:
    hidden: int
    intermediate: int
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return 3 * self.hidden * self.intermediate

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    def views(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [2I,H], down [H,I]) views into one expert's flat buffer."""
        h, i = self.hidden, self.intermediate
        gate_up = flat[: 2 * i * h].view(2 * i, h)
        down = flat[2 * i * h:].view(h, i)
        return gate_up, down


def _pinned_slab(rows: int, numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    """(slab [rows, numel] in page-locked host memory, bytes pinned for it)."""
    slab = torch.empty((rows, numel), dtype=dtype)
    nbytes = slab.numel() * slab.element_size()
    try:
        err = torch.cuda.cudart().cudaHostRegister(slab.data_ptr(), nbytes, 0)
        if int(err) == 0 and slab.is_pinned():
            weakref.finalize(slab, _unregister, slab.data_ptr())
            return slab, nbytes
    except (RuntimeError, AttributeError):
        pass
    slab = torch.empty((rows, numel), dtype=dtype, pin_memory=True)
    size = 1 << max(0, (nbytes - 1).bit_length())           # what the caching host allocator reserves
    return slab, size


def _unregister(ptr: int) -> None:
    try:
        torch.cuda.cudart().cudaHostUnregister(ptr)
    except (RuntimeError, AttributeError):
        pass


class HostStore:
    """Expert buffers in host memory; ``pinned`` on CUDA machines. ``capacity``: how many experts
    will be put (then they share one slab)."""

    def __init__(self, layout: ExpertLayout, pinned: bool, capacity: int | None = None) -> None:
        self.layout = layout
        self.pinned = pinned
        self._buffers: dict[ExpertKey, torch.Tensor] = {}
        self._slab = None
        self.pinned_bytes = 0
        if capacity:
            if pinned:
                self._slab, self.pinned_bytes = _pinned_slab(capacity, layout.numel, layout.dtype)
            else:
                self._slab = torch.empty((capacity, layout.numel), dtype=layout.dtype)

    def put(self, key: ExpertKey, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        """Store one expert from its gate_up [2I,H] and down [H,I] weights (copied)."""
        lay = self.layout
        assert gate_up.shape == (2 * lay.intermediate, lay.hidden), gate_up.shape
        assert down.shape == (lay.hidden, lay.intermediate), down.shape
        if self._slab is not None and len(self._buffers) < self._slab.shape[0]:
            flat = self._slab[len(self._buffers)]
        else:
            flat = torch.empty(lay.numel, dtype=lay.dtype, pin_memory=self.pinned)
            if self.pinned:
                self.pinned_bytes += 1 << max(0, (lay.nbytes - 1).bit_length())
        g, d = lay.views(flat)
        g.copy_(gate_up)
        d.copy_(down)
        self._buffers[key] = flat

    def flat(self, key: ExpertKey) -> torch.Tensor:
        return self._buffers[key]

    def weights(self, key: ExpertKey) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layout.views(self._buffers[key])

    def keys(self) -> list[ExpertKey]:
        return list(self._buffers)

    def __contains__(self, key: ExpertKey) -> bool:
        return key in self._buffers

    def __len__(self) -> int:
        return len(self._buffers)

    @property
    def total_bytes(self) -> int:
        return len(self._buffers) * self.layout.nbytes
