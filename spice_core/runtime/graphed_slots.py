"""Slot callbacks for the graphed decoder: all experts resident, or the planner's LRU cache filled on demand.

These are the two reference mechanisms the decoder is checked and measured with; the engine's
policies plug in through the same `on_layer(layer, expert_ids, weights) -> slots` shape.
"""
from __future__ import annotations

import torch

from spice_core.policy.planner import Queues
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
    """on_layer with the engine's own LRU policy (`LayerPlanner` with the ``lru`` spec, no timing): misses are
    copied from host memory on ``copy_stream`` inside the callback (every earlier segment has finished, and
    the decoder waits for the copies: ``wait_for_copies``). One cache and one eviction rule for the engine and
    for the decoder measured standalone."""

    def __init__(self, lm, buffer: torch.Tensor, copy_stream) -> None:
        from spice_core.policy.planner import LayerPlanner
        from spice_core.policy.spec import get_spec
        from spice_core.timing.costs import CostModel
        from spice_core.timing.profiles import get_profile, get_shape

        self.lm, self.buffer, self.copy_stream = lm, buffer, copy_stream
        costs = CostModel(get_profile("h200-pcie5x16"), get_shape("deepseek-v2-lite"))   # LRU reads no cost
        self.planner = LayerPlanner(get_spec("lru"), n_slots=int(buffer.shape[0]), n_experts=lm.n_experts,
                                    top_k=lm.top_k, moe_layers=lm.moe_layers, costs=costs, host_aware=False)
        self.hits = self.misses = 0

    def __call__(self, layer: int, expert_ids: list[int], weights: list[float]) -> list[int]:
        p = self.planner
        plan = p.plan_layer(layer, [expert_ids], [weights], Queues(0.0, 0.0))
        fills = [(o.slot, o.key) for o in plan.copies]
        slot_of = {}
        for r in p.plan_experts(plan, batched=True):
            if r.late_copy is not None:
                fills.append((r.late_copy.slot, r.late_copy.key))
            slot_of[r.expert] = r.slot
        self.misses += len(fills)
        self.hits += len(expert_ids) - len(fills)
        if fills:
            host, buf = self.lm.host, self.buffer
            if self.copy_stream is None:
                for slot, key in fills:
                    buf[slot].copy_(host.flat(key))
            else:
                with torch.cuda.stream(self.copy_stream):
                    for slot, key in fills:
                        buf[slot].copy_(host.flat(key), non_blocking=True)
        return [slot_of[e] for e in expert_ids]

    def prefill(self, layer: int, expert: int) -> int:
        return self(layer, [expert], [1.0])[0]
