"""The experts module that replaces each MoE block's ``mlp.experts``, and expert math.

Same call signature as transformers' fused experts: ``(hidden [T,H], top_k_index [T,K],
top_k_weights [T,K]) -> [T,H]``; the router, shared experts, attention and norms stay
the stock modules. The module holds no weights: it hands the call to the engine's
per-generation runtime (`spice_core.runtime.layer.LayerRuntime`), which places and runs
the experts. Expert math mirrors transformers' eager loop operation by operation, so
exact policies reproduce its numbers.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import nn
from torch.nn import functional as F


def expert_forward(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                   act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """One routed expert. x [n,H], gate_up [2I,H], down [H,I] -> [n,H] (unweighted)."""
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(act(gate) * up, down)


@contextmanager
def installed(lm, runtime) -> Iterator[None]:
    """The one way to point every experts module of ``lm`` at ``runtime`` (anything with
    ``run_layer``) for a block; whatever was installed before comes back afterwards."""
    mods = list(lm.experts_modules.values())
    saved = [m.runtime for m in mods]
    for m in mods:
        m.runtime = runtime
    try:
        yield
    finally:
        for m, r in zip(mods, saved):
            m.runtime = r


class OffloadedExperts(nn.Module):
    def __init__(self, layer_idx: int, num_experts: int, act_fn: Callable) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_experts = num_experts
        self.act_fn = act_fn
        self.runtime = None  # set by the engine for the duration of a forward pass

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        if self.runtime is None:
            raise RuntimeError("OffloadedExperts called outside an engine run")
        return self.runtime.run_layer(self.layer_idx, hidden_states, top_k_index, top_k_weights, self.act_fn)
