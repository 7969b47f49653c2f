"""The lossy int8 host expert: per-row quantization within half a step, the kernel within ~2% of the bf16
expert on random weights, the dequantising fallback equal to the packed kernel, the int8 copy at about half
the bf16 bytes, the kernel right for any row length (any x86 CPU), and the CPU lane running it through
`submit_int8`."""
import pytest
import torch
from torch.nn import functional as F

from spice_core.exec import cpu_lane as cpu_lane_mod
from spice_core.exec.cpu_lane import CpuLane
from spice_core.exec.experts import expert_forward
from spice_core.exec.int8 import (DEQUANT_BLOCK_ROWS, Int8Expert, int8_expert_forward, int8_linear, int8_linear_dequant,
                                  packed_kernel_available, quantize_rows)
from spice_core.memory.host_store import ExpertLayout, HostStore
from spice_core.memory.int8_store import Int8HostStore
from spice_core.types import ExpertKey


def _bf16_expert(H, I, seed=0):
    g = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(2 * I, H, generator=g) * H ** -0.5).to(torch.bfloat16)
    down = (torch.randn(H, I, generator=g) * I ** -0.5).to(torch.bfloat16)
    return torch.randn(3, H, generator=g), gate_up, down


def _int8(gate_up, down) -> Int8Expert:
    return Int8Expert(*quantize_rows(gate_up), *quantize_rows(down))


def test_quantized_rows_are_within_half_a_step_of_the_weights():
    w = torch.randn(40, 64) * torch.linspace(0.01, 3, 40)[:, None]        # rows of very different ranges
    q, s = quantize_rows(w)
    assert q.dtype == torch.int8 and s.dtype == torch.bfloat16 and q.abs().max() <= 127
    err = (w - q.float() * s.float()[:, None]).abs()
    assert (err <= s.float()[:, None] * 0.5 * (1 + 1e-3)).all()


@pytest.mark.parametrize("H,I", [(128, 24), (256, 64)])      # the shipped miniature's expert, and a wider one
def test_int8_expert_is_within_two_percent_of_the_bf16_expert_on_random_weights(H, I):
    x, gate_up, down = _bf16_expert(H, I)
    exact = expert_forward(x, gate_up.float(), down.float(), F.silu)       # the bf16 weights, computed in fp32
    got = int8_expert_forward(x, _int8(gate_up, down), F.silu)
    assert got.dtype == x.dtype and got.shape == exact.shape
    rel = float((got - exact).norm() / exact.norm())
    assert 1e-4 < rel < 0.02                                              # lossy, and close


def test_the_dequantising_fallback_agrees_with_the_packed_kernel():
    if not packed_kernel_available():
        pytest.skip("this torch has no CPU _weight_int8pack_mm")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 96, generator=g).to(torch.bfloat16)
    q, s = quantize_rows(torch.randn(DEQUANT_BLOCK_ROWS + 40, 96, generator=g))    # more than one block of rows
    packed = torch._weight_int8pack_mm(x, q, s).float()
    assert torch.allclose(int8_linear_dequant(x, q, s).float(), packed, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("k", [24, 40, 48, 1408])
def test_int8_linear_is_right_for_any_row_length(k):
    """The packed kernel's AVX-512 path reads past rows whose length is not a multiple of 16 (garbage, or a crash,
    on Intel hosts with AMX): `int8_linear` must give the dequantised product for every K, on any x86 CPU."""
    g = torch.Generator().manual_seed(k)
    x = torch.randn(3, k, generator=g).to(torch.bfloat16)
    q, s = quantize_rows(torch.randn(72, k, generator=g))
    want = x.float() @ (q.float() * s.float()[:, None]).T
    got = int8_linear(x, q, s).float()
    assert torch.isfinite(got).all()
    assert float((got - want).abs().max()) <= 0.02 * float(want.abs().max())


def test_the_int8_copy_holds_every_expert_in_about_half_the_bf16_bytes():
    lay = ExpertLayout(hidden=128, intermediate=24, dtype=torch.bfloat16)
    host = HostStore(lay, pinned=False, capacity=3)
    experts = {ExpertKey(1, e): _bf16_expert(128, 24, seed=e)[1:] for e in range(3)}
    for key, (gate_up, down) in experts.items():
        host.put(key, gate_up, down)
    store = Int8HostStore(host)
    assert len(store) == 3 and store.expert_bytes == lay.numel + 2 * (2 * 24 + 128)
    assert 0.5 < store.total_bytes / host.total_bytes < 0.53
    for key, (gate_up, down) in experts.items():
        w = store.weights(key)
        for got, want in zip(w, _int8(gate_up, down)):
            assert torch.equal(got, want)


def test_the_cpu_lane_runs_the_int8_kernel_on_submit_int8(monkeypatch):
    monkeypatch.setattr(cpu_lane_mod, "available_cores", lambda: 2)
    x, gate_up, down = _bf16_expert(128, 24)
    w = _int8(gate_up, down)
    try:
        with CpuLane(workers=1) as lane:
            y, worker, t0, t1 = lane.submit_int8(x, w, F.silu, torch.device("cpu")).result()
    finally:
        torch.set_num_threads(1)          # the lane sets the process-wide intra-op thread count
    assert torch.equal(y, int8_expert_forward(x, w, F.silu)) and lane.failures == 0 and t1 >= t0
