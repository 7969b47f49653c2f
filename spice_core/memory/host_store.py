"""HostStore: every routed expert's weights in host memory, one contiguous buffer each.

Layout of one expert's buffer (dtype of the checkpoint), so a swap is one copy:
    [ gate_up (2I x H) | down (H x I) ]      I expert width, H hidden
On CUDA the buffers are pinned (pageable copies run at a third of the speed).

Knows nothing of caching, policies or timing.
"""
from __future__ import annotations

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


class HostStore:
    """Expert buffers in host memory; ``pinned`` on CUDA machines."""

    def __init__(self, layout: ExpertLayout, pinned: bool) -> None:
        self.layout = layout
        self.pinned = pinned
        self._buffers: dict[ExpertKey, torch.Tensor] = {}

    def put(self, key: ExpertKey, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        """Store one expert from its gate_up [2I,H] and down [H,I] weights (copied)."""
        lay = self.layout
        assert gate_up.shape == (2 * lay.intermediate, lay.hidden), gate_up.shape
        assert down.shape == (lay.hidden, lay.intermediate), down.shape
        flat = torch.empty(lay.numel, dtype=lay.dtype, pin_memory=self.pinned)
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
