"""The lossy host expert kernel: int8 weight-only experts (per-output-channel symmetric scales).

    host slab row (bf16 / fp32)  ─► quantize_rows ─► q int8 [N,K], s bf16 [N]   (w ≈ q · s, row by row)
    x [n,H] ─► bf16 ─► int8_linear(x, q_gate_up, s_gate_up) ─► SiLU(gate)·up ─► int8_linear(·, q_down, s_down)
          ─► [n,H] in x's dtype

Why int8 weight-only: a batch-1 expert on the CPU is bound by the bytes it streams, and an int8 copy
is half of bf16's (`Int8HostStore.total_bytes`). Activations stay bf16 and accumulate in fp32 inside
torch's ``_weight_int8pack_mm`` (its CPU kernel, in every torch build we pin), which on the dev CPU ran
a DeepSeek-V2-Lite expert 3x faster than bf16 ``F.linear`` (docs/benchmarks/cpu-lane/int8/). Where the
op is missing, or cannot take the shape, the rows are dequantised on the fly in blocks (the scale factors
out of the dot product). The op's AVX-512 kernel (Intel Xeons with AMX, torch 2.13) reads past the codes of
a row whose length K is not a multiple of 16, returning garbage or crashing the process (the miniature's
down projection has K = 24): it is used only where K is (`PACKED_K_MULTIPLE`).

Never exact: the weights are rounded to 8 bits (relative output error ~1% on random weights). The
planner takes it only as its own miss action (`MissAction.CPU_INT8`, outcome ``cpu_int8``) below its
own threshold; exact policies never run it. Knows nothing of policies, lanes or timing.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, NamedTuple

import torch
from torch.nn import functional as F

COMPUTE_DTYPE = torch.bfloat16      # activations and scales: what the int8 kernel takes fast on the CPU
QMAX = 127                          # symmetric: codes in [-127, 127]
DEQUANT_BLOCK_ROWS = 256            # rows dequantised at a time where the packed kernel is missing
PACKED_K_MULTIPLE = 16              # the packed kernel's row length K must be a multiple of this (module docstring)


class Int8Expert(NamedTuple):
    """One expert's int8 weights: gate_up [2I,H] and down [H,I] codes, each with a bf16 scale per output row."""

    q_gate_up: torch.Tensor     # [2I,H] int8
    s_gate_up: torch.Tensor     # [2I] bf16
    q_down: torch.Tensor        # [H,I] int8
    s_down: torch.Tensor        # [H] bf16


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., N, K] (any float dtype) -> (q [..., N, K] int8, s [..., N] bf16), w ≈ q · s per output row.
    The scale is rounded to bf16 first and the codes are taken against the rounded scale, so q · s is the
    nearest the kernel can represent (|w - q·s| <= s/2 up to float rounding)."""
    wf = w.float()
    s = (wf.abs().amax(dim=-1) / QMAX).clamp_min(torch.finfo(COMPUTE_DTYPE).tiny).to(COMPUTE_DTYPE)
    q = torch.round(wf / s.float().unsqueeze(-1)).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, s


@lru_cache(maxsize=1)
def packed_kernel_available() -> bool:
    """Does this torch run ``_weight_int8pack_mm`` on the CPU, right (asked once, on a small problem whose row
    length is a multiple of `PACKED_K_MULTIPLE`, checked against the dequantised product)?"""
    op = getattr(torch.ops.aten, "_weight_int8pack_mm", None)
    if op is None:
        return False
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2 * PACKED_K_MULTIPLE, generator=g).to(COMPUTE_DTYPE)
    q = torch.randint(-QMAX, QMAX + 1, (24, 2 * PACKED_K_MULTIPLE), generator=g, dtype=torch.int8)
    s = torch.rand(24, generator=g).add_(0.5).to(COMPUTE_DTYPE)
    try:
        got = op(x, q, s).float()
    except (RuntimeError, NotImplementedError):
        return False
    want = x.float() @ (q.float() * s.float()[:, None]).T
    return bool(torch.isfinite(got).all()) and float((got - want).abs().max()) <= 0.02 * float(want.abs().max())


def packed_kernel_takes(q: torch.Tensor) -> bool:
    """May ``_weight_int8pack_mm`` run codes ``q`` [N,K] here: the op works, and K is a multiple of 16."""
    return q.shape[-1] % PACKED_K_MULTIPLE == 0 and packed_kernel_available()


def int8_linear_dequant(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x [n,K] bf16 · (q [N,K] int8 · s [N])ᵀ -> [n,N], dequantising DEQUANT_BLOCK_ROWS rows at a time:
    the per-row scale factors out, so each block is F.linear on its codes, then scaled."""
    n_out = q.shape[0]
    if n_out <= DEQUANT_BLOCK_ROWS:
        return F.linear(x, q.to(x.dtype)) * s
    out = torch.empty(x.shape[0], n_out, dtype=x.dtype)
    for a in range(0, n_out, DEQUANT_BLOCK_ROWS):
        b = min(n_out, a + DEQUANT_BLOCK_ROWS)
        torch.mul(F.linear(x, q[a:b].to(x.dtype)), s[a:b], out=out[:, a:b])
    return out


def int8_linear(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x [n,K] bf16 · (q · s)ᵀ -> [n,N] bf16: the packed kernel where it takes the shape, else blockwise dequant."""
    if packed_kernel_takes(q):
        return torch._weight_int8pack_mm(x, q, s)
    return int8_linear_dequant(x, q, s)


def int8_expert_forward(x: torch.Tensor, w: Int8Expert, act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """One routed expert from its int8 copy. x [n,H] (host) -> [n,H] in x's dtype (unweighted), computed in
    bf16 activations: the lossy twin of `experts.expert_forward`, same order of operations."""
    xb = x.to(COMPUTE_DTYPE)
    gate, up = int8_linear(xb, w.q_gate_up, w.s_gate_up).chunk(2, dim=-1)
    return int8_linear(act(gate) * up, w.q_down, w.s_down).to(x.dtype)
