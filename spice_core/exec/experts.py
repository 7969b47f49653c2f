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


def gathered_experts_forward(x: torch.Tensor, buffer: torch.Tensor, slots: torch.Tensor, layout,
                             act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """K experts of one token at once. x [1,H]; buffer [n_slots, numel], one expert per row in HostStore's flat
    layout ([gate_up (2I x H) | down (H x I)]); slots [K] long -> [K,H] (unweighted, in ``slots`` order).
    The K rows are gathered (one copy), then two batched matmuls: a dozen dispatches for all K experts, where
    `expert_forward` takes five per expert plus the views of its weights."""
    K, H = slots.shape[0], x.shape[-1]
    I_, numel = layout.intermediate, layout.numel
    rows = buffer.index_select(0, slots)                                    # [K, numel]
    off = rows.storage_offset()
    gu = rows.as_strided((K, 2 * I_, H), (numel, H, 1), off)               # [K,2I,H]
    dn = rows.as_strided((K, H, I_), (numel, I_, 1), off + 2 * I_ * H)     # [K,H,I]
    gate, up = torch.bmm(x.expand(K, 1, H), gu.transpose(1, 2)).chunk(2, dim=-1)
    return torch.bmm(act(gate) * up, dn.transpose(1, 2)).view(K, H)


def combine_one_token(x: torch.Tensor, needed, routes: dict, outs: dict, batches: list,
                      top_k_weights: torch.Tensor) -> torch.Tensor:
    """One token's routed output [1,H] with the stock experts loop's rounding: y_e · w_e in the router weights'
    dtype, cast to x's dtype, added in ascending expert order. ``needed``: the experts, ascending;
    ``routes[e][1][0]``: e's top-k position; top_k_weights [1,K]. Outputs come from ``outs`` (expert -> [1,H])
    and ``batches`` ((ys [n,H], the expert of each row), from `gathered_experts_forward`). When one batch
    holds all K selections in top-k position order, the weighting is one multiply for all of them."""
    if not needed:
        return torch.zeros_like(x)
    K = top_k_weights.shape[-1]
    if len(batches) == 1 and not outs and len(batches[0][1]) == K:     # row j is top-k position j
        return combine_batch(batches[0][0], top_k_weights, [routes[e][1][0] for e in needed], x.dtype)
    outs = dict(outs)
    for ys, experts in batches:
        outs.update(zip(experts, ys.unbind(0)))
    if len(needed) == K:           # all K selections (some approximated or from the CPU lane): one multiply
        order = [routes[e][1][0] for e in needed]
        by_pos = [None] * K
        for e, p in zip(needed, order):
            by_pos[p] = outs[e].view(-1)
        if len({y.dtype for y in by_pos}) == 1:   # stacking must not promote; the multiply is elementwise
            return combine_batch(torch.stack(by_pos), top_k_weights, order, x.dtype)
    acc = None
    for e in needed:
        p = routes[e][1][0]
        t = (outs[e].view(1, -1) * top_k_weights[:, p:p + 1]).to(x.dtype)
        acc = t if acc is None else acc + t
    return acc


def combine_batch(ys: torch.Tensor, top_k_weights: torch.Tensor, order: list[int], dtype: torch.dtype) -> torch.Tensor:
    """One token's routed output [1,H] from all K selections' outputs ys [K,H] (row j: top-k position j), with
    the stock loop's rounding: one multiply by the router weights [1,K] in their dtype, a cast to ``dtype``,
    then the rows added in ``order`` (the top-k positions in ascending expert order)."""
    terms = ys * top_k_weights.view(-1, 1)
    if terms.dtype != dtype:
        terms = terms.to(dtype)
    rows = terms.unbind(0)
    acc = rows[order[0]]
    for j in order[1:]:
        acc = acc + rows[j]
    return acc.view(1, -1)


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
