"""The slot-indexed expert step of one token: two Triton kernels, no weight gather.

    x [H] ─► moe_up      grid (K, I/BI): selection k of kind GPU reads its gate and up rows straight from
                         slot plan.slot[k] of the slot buffer; h[k] = bf16(silu(bf16(g))·bf16(u))     [K,I]
    h     ─► moe_down    grid (H/BH): for each selection in ascending expert order
                         y_k = bf16(Σ_i h[k,i]·D_k[j,i])   (GPU: D_k from its slot; EXT: y_ext[k], e.g. LoRE)
                         acc = bf16(acc + bf16(y_k · w[perm[k]]))                                       [H]

Shapes: K selections (the model's top-k), H hidden, I expert width; a slot row is HostStore's flat
layout [gate_up (2I x H) | down (H x I)]. Kinds (plan row KIND): 0 none (dropped: reads nothing),
1 GPU (reads its slot), 2 EXT (its output is given; reads no slot, so an approximated selection
never races a copy into slot 0). The dots accumulate in fp32 and round once to the model dtype, as
F.linear does, then the weighting and the combine follow the stock loop's rounding and order;
every exact policy runs this same kernel, so they stay bitwise equal among themselves (the order
inside a dot differs from cuBLAS, so the bits differ from the gather path's bmm in the last place).

Deliberately knows nothing of plans or policies: it takes device rows. Imports Triton lazily
(`available()`): the CPU keeps its own path.
"""
from __future__ import annotations

import functools

import torch

KIND_NONE, KIND_GPU, KIND_EXT = 0, 1, 2

# Tile sizes (elements), any size works. Measured on the H200 at DeepSeek-V2-Lite shapes (H 2048, I 1408, K 6;
# benchmarks/slot_kernel.py, docs/benchmarks/fast-path/round-2): 4x512 / 2x512 took 43 µs a layer (2.4 TB/s),
# 16x256 / 8x256 59 µs, the gather path 108 µs. Small row tiles give many programs, enough loads in flight.
UP_ROWS, UP_COLS = 4, 512         # moe_up: gate/up rows per program, hidden columns per inner step
DOWN_ROWS, DOWN_COLS = 2, 512     # moe_down: output columns per program, expert-width columns per inner step


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether Triton can compile here (a CUDA device and the package)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        return False
    return True


def is_silu(act) -> bool:
    """The kernels fuse SiLU, the routed experts' activation in all supported families."""
    return (act is torch.nn.functional.silu or isinstance(act, torch.nn.SiLU)
            or type(act).__name__ == "SiLUActivation")     # transformers' own SiLU module


@functools.lru_cache(maxsize=1)
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def moe_up(x_ptr, buf_ptr, slot_ptr, kind_ptr, h_ptr, numel,
               H: tl.constexpr, I: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
        k = tl.program_id(0)
        rb = tl.program_id(1)
        kind = tl.load(kind_ptr + k)
        if kind == 1:
            slot = tl.load(slot_ptr + k).to(tl.int64)
            base = buf_ptr + slot * numel
            rows = rb * BR + tl.arange(0, BR)
            rmask = rows < I
            g = tl.zeros([BR], dtype=tl.float32)
            u = tl.zeros([BR], dtype=tl.float32)
            for c0 in range(0, H, BC):
                cols = c0 + tl.arange(0, BC)
                cmask = cols < H
                xv = tl.load(x_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
                m = rmask[:, None] & cmask[None, :]
                gw = tl.load(base + rows[:, None] * H + cols[None, :], mask=m, other=0.0).to(tl.float32)
                uw = tl.load(base + (rows[:, None] + I) * H + cols[None, :], mask=m, other=0.0).to(tl.float32)
                g += tl.sum(gw * xv[None, :], axis=1)
                u += tl.sum(uw * xv[None, :], axis=1)
            out_ty = h_ptr.dtype.element_ty
            g = g.to(out_ty).to(tl.float32)
            u = u.to(out_ty).to(tl.float32)
            a = (g / (1.0 + tl.exp(-g))).to(out_ty).to(tl.float32)     # silu, rounded as torch rounds it
            tl.store(h_ptr + k * I + rows, (a * u).to(out_ty), mask=rmask)

    @triton.jit
    def moe_down(h_ptr, buf_ptr, slot_ptr, kind_ptr, perm_ptr, w_ptr, yext_ptr, out_ptr, numel, down_off,
                 H: tl.constexpr, I: tl.constexpr, K: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
        jb = tl.program_id(0)
        cols = jb * BR + tl.arange(0, BR)          # output features j
        jmask = cols < H
        out_ty = out_ptr.dtype.element_ty
        acc = tl.zeros([BR], dtype=tl.float32)
        started = 0
        for k in tl.static_range(K):
            kind = tl.load(kind_ptr + k)
            if kind != 0:
                y = tl.zeros([BR], dtype=tl.float32)
                if kind == 1:
                    slot = tl.load(slot_ptr + k).to(tl.int64)
                    base = buf_ptr + slot * numel + down_off
                    for i0 in range(0, I, BC):
                        ii = i0 + tl.arange(0, BC)
                        imask = ii < I
                        hv = tl.load(h_ptr + k * I + ii, mask=imask, other=0.0).to(tl.float32)
                        dw = tl.load(base + cols[:, None] * I + ii[None, :], mask=jmask[:, None] & imask[None, :],
                                     other=0.0).to(tl.float32)
                        y += tl.sum(dw * hv[None, :], axis=1)
                    y = y.to(out_ty).to(tl.float32)
                else:
                    y = tl.load(yext_ptr + k * H + cols, mask=jmask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + tl.load(perm_ptr + k)).to(tl.float32)
                t = (y * w).to(out_ty).to(tl.float32)
                if started == 0:
                    acc = t
                else:
                    acc = (acc + t).to(out_ty).to(tl.float32)
                started = 1
        tl.store(out_ptr + cols, acc.to(out_ty), mask=jmask)

    return moe_up, moe_down


def slot_experts_forward(x: torch.Tensor, buffer: torch.Tensor, slot: torch.Tensor, kind: torch.Tensor,
                         perm: torch.Tensor, weights: torch.Tensor, y_ext: torch.Tensor | None, layout,
                         h_scratch: torch.Tensor, out: torch.Tensor, tiles: tuple[int, int, int, int] | None = None
                         ) -> torch.Tensor:
    """One token's routed output. x [1,H]; buffer [n_slots, numel]; slot/kind/perm [K] (ascending expert
    order); weights [K] the router's (top-k order); y_ext [K,H] outputs of EXT selections (None: there are
    none); h_scratch [K,I] and out [1,H] in x's dtype, written here. Capturable (two launches). ``tiles``:
    (up rows, up cols, down rows, down cols), for tuning (benchmarks/slot_kernel.py)."""
    moe_up, moe_down = _kernels()
    K, H, I_, numel = slot.shape[0], layout.hidden, layout.intermediate, layout.numel
    ur, uc, dr, dc = tiles or (UP_ROWS, UP_COLS, DOWN_ROWS, DOWN_COLS)
    moe_up[(K, -(-I_ // ur))](x, buffer, slot, kind, h_scratch, numel, H=H, I=I_, BR=ur, BC=uc)
    ext = y_ext if y_ext is not None else out        # never read when no selection is EXT
    moe_down[(-(-H // dr),)](h_scratch, buffer, slot, kind, perm, weights.reshape(-1), ext, out, numel,
                             2 * I_ * H, H=H, I=I_, K=K, BR=dr, BC=dc)
    return out


def slot_experts_reference(x: torch.Tensor, buffer: torch.Tensor, slot: torch.Tensor, kind: torch.Tensor,
                           perm: torch.Tensor, weights: torch.Tensor, y_ext: torch.Tensor | None, layout) -> torch.Tensor:
    """What `slot_experts_forward` computes, in PyTorch (the kernels' specification, for tests): the same
    kinds, the same rounding points and order; dots in fp32 rounded once."""
    H, I_, numel = layout.hidden, layout.intermediate, layout.numel
    dt = x.dtype
    xf = x.reshape(-1).float()
    w = weights.reshape(-1).float()
    acc = None
    for k in range(slot.shape[0]):
        kd = int(kind[k])
        if kd == KIND_NONE:
            continue
        if kd == KIND_GPU:
            row = buffer[int(slot[k])]
            gu = row[: 2 * I_ * H].view(2 * I_, H).float()
            dn = row[2 * I_ * H: numel].view(H, I_).float()
            gv = (gu @ xf).to(dt).float()
            g, u = gv[:I_], gv[I_:]
            a = torch.nn.functional.silu(g).to(dt).float()
            h = (a * u).to(dt).float()
            y = (dn @ h).to(dt).float()
        else:
            y = y_ext[k].float()
        t = (y * w[int(perm[k])]).to(dt).float()
        acc = t if acc is None else (acc + t).to(dt).float()
    if acc is None:
        acc = torch.zeros(H)
    return acc.to(dt).view(1, H)
