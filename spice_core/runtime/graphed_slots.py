"""Slot callbacks for the graphed decoder: all experts resident, or an LRU cache filled on demand.

These are the two reference mechanisms the decoder is checked and measured with; the engine's
policies plug in through the same `on_layer(layer, expert_ids, weights) -> slots` shape.
"""
from __future__ import annotations

import torch

from spice_core.runtime.graphed_plan import LruSlotMap
from spice_core.types import ExpertKey


def resident_buffer(lm) -> torch.Tensor:
    """Every routed expert on the device, slot = moe position · n_experts + expert."""
    keys = [ExpertKey(layer, e) for layer in lm.moe_layers for e in range(lm.n_experts)]
    buf = torch.empty((len(keys), lm.layout.numel), dtype=lm.layout.dtype, device=lm.device)
    for slot, key in enumerate(keys):
        buf[slot].copy_(lm.host.flat(key), non_blocking=lm.device.type == "cuda")
    if lm.device.type == "cuda":
        torch.cuda.synchronize(lm.device)
    return buf


class ResidentSlots:
    """on_layer for `resident_buffer`: no copies."""

    def __init__(self, lm) -> None:
        self.base = {layer: i * lm.n_experts for i, layer in enumerate(lm.moe_layers)}

    def __call__(self, layer: int, expert_ids: list[int], weights: list[float]) -> list[int]:
        b = self.base[layer]
        return [b + e for e in expert_ids]

    def prefill(self, layer: int, expert: int) -> int:
        return self.base[layer] + expert


class LruSlots:
    """on_layer with least-recently-used eviction: misses are copied from host memory on ``copy_stream``
    (inside the callback, so every slot is free to overwrite)."""

    def __init__(self, lm, buffer: torch.Tensor, copy_stream) -> None:
        self.lm, self.buffer, self.copy_stream = lm, buffer, copy_stream
        self.map = LruSlotMap(int(buffer.shape[0]))
        self.hits = self.misses = 0

    def __call__(self, layer: int, expert_ids: list[int], weights: list[float]) -> list[int]:
        slots, fills = self.map.place(layer, expert_ids)
        self.misses += len(fills)
        self.hits += len(slots) - len(fills)
        if fills:
            host, buf = self.lm.host, self.buffer
            if self.copy_stream is None:
                for slot, key in fills:
                    buf[slot].copy_(host.flat(key))
            else:
                with torch.cuda.stream(self.copy_stream):
                    for slot, key in fills:
                        buf[slot].copy_(host.flat(key), non_blocking=True)
        return slots

    def prefill(self, layer: int, expert: int) -> int:
        return self(layer, [expert], [1.0])[0]
