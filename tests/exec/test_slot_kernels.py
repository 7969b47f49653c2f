"""The slot-indexed expert kernels (exec/slot_kernels.py) against their PyTorch specification, on a GPU: the same
kinds and rounding points, no slot read for an approximated or dropped selection (FASTPATH H2)."""
import types

import pytest
import torch

from spice_core.exec import slot_kernels as sk

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not (torch.cuda.is_available() and sk.available()), reason="needs CUDA and Triton")]


def _case(dtype, H=256, I_=176, n_slots=12, K=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    lay = types.SimpleNamespace(hidden=H, intermediate=I_, numel=3 * H * I_)
    buf = (torch.randn(n_slots, lay.numel, generator=g) * 0.05).to(dtype).cuda()
    x = torch.randn(1, H, generator=g).to(dtype).cuda()
    w = torch.rand(K, generator=g).cuda()
    y_ext = torch.randn(K, H, generator=g).to(dtype).cuda()
    return lay, buf, x, w, y_ext


def _run(lay, buf, x, slot, kind, perm, w, y_ext):
    dev = buf.device
    slot, kind, perm = (torch.tensor(v, device=dev) for v in (slot, kind, perm))
    h = torch.empty(len(slot), lay.intermediate, dtype=x.dtype, device=dev)
    out = torch.empty(1, lay.hidden, dtype=x.dtype, device=dev)
    got = sk.slot_experts_forward(x, buf, slot, kind, perm, w, y_ext, lay, h, out)
    ref = sk.slot_experts_reference(x.cpu(), buf.cpu(), slot.cpu(), kind.cpu(), perm.cpu(), w.cpu(),
                                    y_ext.cpu(), lay)
    return got.cpu(), ref


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_slot_kernels_match_their_specification_within_a_rounding_step(dtype):
    lay, buf, x, w, y_ext = _case(dtype)
    got, ref = _run(lay, buf, x, [3, 0, 7, 5, 1, 2], [1, 1, 1, 1, 1, 1], [2, 0, 1, 5, 3, 4], w, y_ext)
    # Dots sum in another order than the specification's matmul: a last-place difference may surface.
    tol = 2 ** -6 if dtype == torch.bfloat16 else 1e-5
    assert torch.allclose(got.float(), ref.float(), rtol=tol, atol=tol * float(ref.abs().max()))


def test_an_approximated_or_dropped_selection_reads_no_slot():
    lay, buf, x, w, y_ext = _case(torch.bfloat16)
    buf[0] = float("nan")                   # slot 0: where plan rows point EXT and NONE selections
    got, ref = _run(lay, buf, x, [3, 0, 7, 5, 1, 0], [1, 2, 1, 1, 1, 0], [2, 0, 1, 5, 3, 4], w, y_ext)
    assert not torch.isnan(got).any()
    assert torch.allclose(got.float(), ref.float(), rtol=2 ** -6, atol=2 ** -6 * float(ref.abs().max()))


def test_the_kernels_are_deterministic_and_independent_of_which_slot_holds_an_expert():
    """The bitwise invariant exact policies rely on: the same experts in other slots give the same bits."""
    lay, buf, x, w, y_ext = _case(torch.bfloat16)
    a, _ = _run(lay, buf, x, [3, 4, 7, 5, 1, 2], [1] * 6, [2, 0, 1, 5, 3, 4], w, y_ext)
    moved = buf.clone()
    moved[[8, 9, 10, 11, 6, 0]] = buf[[3, 4, 7, 5, 1, 2]]
    b, _ = _run(lay, moved, x, [8, 9, 10, 11, 6, 0], [1] * 6, [2, 0, 1, 5, 3, 4], w, y_ext)
    assert torch.equal(a, b)
