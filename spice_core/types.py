"""Small value types shared across the engine."""
from __future__ import annotations

from typing import NamedTuple


class ExpertKey(NamedTuple):
    """One routed expert: MoE layer index (the decoder layer's index) and expert index."""

    layer: int
    expert: int

    def __str__(self) -> str:
        return f"L{self.layer}E{self.expert}"
