"""A static cache's plan row, computed on the device from the routing: the one-graph `resident` step's planner.

    slot_of [E] (the layer's expert -> slot table), top_k_index [1,K] ─► plan row [PLAN_ROWS, K] (long):
        the numbers `graphed_plan.plan_rows` writes for the same picks (selections in ascending expert order,
        dropped picks, ids outside [0, E), after them in top-k order; every valid one a GPU slot)

    `static_plan_rows`   the definition, in PyTorch (the CPU's path, and the spec the kernel is tested against):
                         ~20 small ops, each a kernel launch once captured, ~50 µs a layer in the H200's graph
    `StaticPlanner`      on CUDA with Triton, ONE kernel per layer (a stable rank by pairwise comparison over
                         the K picks: K ≤ 16, so a K×K tile) that also stages the layer's routing in a device
                         buffer, so the step reads the routing back in two copies at its end instead of two per
                         layer; elsewhere the PyTorch rows and a per-layer readback

No host value is read: the whole thing is captured into the step's one graph (`GraphedDecoder`, static slots).
Knows nothing of policies or of the graphs; `graphed_io.HostIO` owns the host rows the routing lands in.
"""
from __future__ import annotations

import functools
import logging

import torch

from spice_core.exec import slot_kernels
from spice_core.runtime.graphed_plan import APPROX, BY_SLOT, EXPERT, INV, KIND, PERM, PLAN_ROWS, SLOT, VALID

log = logging.getLogger(__name__)

MAX_KERNEL_TOP_K = 16       # the kernel ranks K picks in one K×K tile


def static_plan_rows(slot_of: torch.Tensor, top_k_index: torch.Tensor, n_slots: int, *,
                     slot_order: bool = True) -> torch.Tensor:
    """`graphed_plan.plan_rows` computed on the device for a cache that never changes (every expert resident):
    ``slot_of`` [E] the slot of each expert of the layer, ``top_k_index`` [1,K] the router's picks -> the plan
    row [PLAN_ROWS, K] (long), the same numbers the host writes for these picks: selections in ascending expert
    order (a stable sort; dropped picks, ids outside [0, E), after them in top-k order), every valid one a GPU
    slot. ``slot_order`` False leaves BY_SLOT and INV zero (only the "grouped" kernel reads them): captured once
    per layer, every op here is a kernel launch in the step's graph, so it does no more than the kernel needs."""
    E, K = slot_of.shape[0], top_k_index.shape[-1]
    idx = top_k_index.reshape(K).to(torch.long)
    clamped = idx.clamp(0, E - 1)
    valid = clamped == idx
    pos = torch.arange(K, device=idx.device)
    order = torch.sort(torch.where(valid, idx, E + pos), stable=True).indices           # PERM
    v_o = valid.index_select(0, order).to(torch.long)                                   # VALID, and KIND (GPU = 1)
    e_o = clamped.index_select(0, order)
    slot = slot_of.index_select(0, e_o) * v_o
    if slot_order:
        sort_key = torch.where(v_o != 0, slot, n_slots)
        by_slot = torch.sort(sort_key, stable=True).indices
        key_by_slot, inv = sort_key.index_select(0, by_slot), torch.empty_like(by_slot).scatter_(0, by_slot, pos)
    else:
        key_by_slot = inv = torch.zeros_like(order)
    rows = [None] * PLAN_ROWS
    rows[SLOT], rows[PERM], rows[VALID], rows[BY_SLOT], rows[INV] = slot, order, v_o, key_by_slot, inv
    rows[APPROX], rows[EXPERT] = torch.zeros_like(order), e_o * v_o
    rows[KIND] = v_o          # KIND_GPU is 1 and KIND_NONE 0: the validity row (tests/runtime/test_static_plan.py)
    return torch.stack(rows)


@functools.lru_cache(maxsize=1)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def static_plan(slot_of_ptr, idx_ptr, w_ptr, plan_ptr, idx_stage_ptr, w_stage_ptr, E, n_slots,
                    K: tl.constexpr, BK: tl.constexpr,
                    R_SLOT: tl.constexpr, R_PERM: tl.constexpr, R_VALID: tl.constexpr, R_BY_SLOT: tl.constexpr,
                    R_INV: tl.constexpr, R_APPROX: tl.constexpr, R_EXPERT: tl.constexpr, R_KIND: tl.constexpr):
        lane = tl.arange(0, BK)
        live = lane < K
        pos = lane.to(tl.int64)
        idx = tl.load(idx_ptr + lane, mask=live, other=0).to(tl.int64)
        tl.store(idx_stage_ptr + lane, idx, mask=live)                       # the routing, for the host
        tl.store(w_stage_ptr + lane, tl.load(w_ptr + lane, mask=live, other=0.0).to(tl.float32), mask=live)
        valid = (idx >= 0) & (idx < E) & live
        clamped = tl.minimum(tl.maximum(idx, 0), E - 1)
        # Stable ascending order of (key, top-k position); padding lanes sort after every live one.
        key = tl.where(valid, idx, E + pos)
        key = tl.where(live, key, E + BK + pos)
        before = (key[None, :] < key[:, None]) | ((key[None, :] == key[:, None]) & (pos[None, :] < pos[:, None]))
        rank = tl.sum(before.to(tl.int64), axis=1)                           # lane i's place in expert order
        v = valid.to(tl.int64)
        slot = tl.load(slot_of_ptr + clamped, mask=live, other=0).to(tl.int64) * v
        # Slot order (the grouped kernel's rows): stable by (slot or n_slots when dropped, expert-order place).
        sk = tl.where(valid, slot, n_slots)
        sk = tl.where(live, sk, n_slots + BK + 1)
        before2 = (sk[None, :] < sk[:, None]) | ((sk[None, :] == sk[:, None]) & (rank[None, :] < rank[:, None]))
        rank2 = tl.sum(before2.to(tl.int64), axis=1)
        tl.store(plan_ptr + R_SLOT * K + rank, slot, mask=live)
        tl.store(plan_ptr + R_PERM * K + rank, pos, mask=live)
        tl.store(plan_ptr + R_VALID * K + rank, v, mask=live)
        tl.store(plan_ptr + R_INV * K + rank, rank2, mask=live)
        tl.store(plan_ptr + R_BY_SLOT * K + rank2, sk, mask=live)
        tl.store(plan_ptr + R_APPROX * K + rank, v * 0, mask=live)
        tl.store(plan_ptr + R_EXPERT * K + rank, clamped * v, mask=live)
        tl.store(plan_ptr + R_KIND * K + rank, v, mask=live)

    return static_plan


def kernel_plan_rows(slot_of: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, n_slots: int,
                     idx_stage: torch.Tensor, w_stage: torch.Tensor) -> torch.Tensor:
    """`static_plan_rows` (every row, slot order included) in one Triton launch, which also writes the picks to
    ``idx_stage`` [K] (long) and the router weights to ``w_stage`` [K] (float32). Capturable."""
    K = top_k_index.shape[-1]
    plan = torch.empty((PLAN_ROWS, K), dtype=torch.long, device=top_k_index.device)
    block = max(16, 1 << (K - 1).bit_length())
    idx, w = top_k_index.reshape(K).contiguous(), top_k_weights.reshape(K).contiguous()
    _kernel()[(1,)](slot_of, idx, w, plan, idx_stage, w_stage, slot_of.shape[0], n_slots, K=K, BK=block,
                    R_SLOT=SLOT, R_PERM=PERM, R_VALID=VALID, R_BY_SLOT=BY_SLOT, R_INV=INV, R_APPROX=APPROX,
                    R_EXPERT=EXPERT, R_KIND=KIND, num_warps=1)
    return plan


class StaticPlanner:
    """Each layer's plan row for a static cache, and its routing on its way to the host rows of ``io``.

    With the kernel (CUDA, Triton, K ≤ 16) the routing is staged on the device and `flush` copies all layers'
    rows at the step's end; otherwise each layer is read back as it is planned (`HostIO.readback`). The kernel's
    first use is checked against `static_plan_rows` (an eager warm-up, before capture): a mismatch or a failure
    to compile logs a warning and keeps the PyTorch rows for the decoder's life."""

    def __init__(self, slot_of: torch.Tensor, n_slots: int, io, *, slot_order: bool) -> None:
        self.slot_of, self.n_slots, self.io, self.slot_order = slot_of, int(n_slots), io, slot_order
        M, K = io.idx_host.shape
        dev = slot_of.device
        self.use_kernel = dev.type == "cuda" and slot_kernels.available() and K <= MAX_KERNEL_TOP_K
        self._checked = False
        if self.use_kernel:
            self.idx_stage = torch.zeros((M, K), dtype=torch.long, device=dev)
            self.w_stage = torch.zeros((M, K), dtype=torch.float32, device=dev)

    def plan(self, i: int, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        """MoE layer i's plan row [PLAN_ROWS, K] from its routing."""
        if self.use_kernel and not self._checked:
            self._check(i, top_k_index, top_k_weights)
        if self.use_kernel:
            return kernel_plan_rows(self.slot_of[i], top_k_index, top_k_weights, self.n_slots,
                                    self.idx_stage[i], self.w_stage[i])
        self.io.readback(i, top_k_index, top_k_weights)
        return static_plan_rows(self.slot_of[i], top_k_index, self.n_slots, slot_order=self.slot_order)

    def flush(self) -> None:
        """The staged routing of every layer to the host rows (the kernel path; a no-op otherwise)."""
        if self.use_kernel:
            self.io.idx_host.copy_(self.idx_stage, non_blocking=self.io.pin)
            self.io.w_host.copy_(self.w_stage, non_blocking=self.io.pin)

    def _check(self, i: int, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> None:
        self._checked = True
        if torch.cuda.is_current_stream_capturing():
            return      # no warm-up ran eagerly first: trust the kernel's GPU test (tests/runtime/test_static_plan.py)
        want = static_plan_rows(self.slot_of[i], top_k_index, self.n_slots)
        try:
            got = kernel_plan_rows(self.slot_of[i], top_k_index, top_k_weights, self.n_slots,
                                   self.idx_stage[i], self.w_stage[i])
            same = (torch.equal(got, want) and torch.equal(self.idx_stage[i], top_k_index.reshape(-1).long())
                    and torch.equal(self.w_stage[i], top_k_weights.reshape(-1).float()))
        except Exception as err:     # noqa: BLE001 - any compile or launch failure: the PyTorch rows still work
            log.warning("the static plan kernel failed (%s: %s): using the PyTorch plan rows", type(err).__name__, err)
            self.use_kernel = False
            return
        if not same:
            log.warning("the static plan kernel's rows differ from static_plan_rows: using the PyTorch plan rows")
            self.use_kernel = False
