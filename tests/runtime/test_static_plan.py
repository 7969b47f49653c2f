"""A static cache's plan row, computed on the device from the routing (`static_plan_rows`), is the row the host
writes for the same picks (`plan_rows`): every row, dropped picks (ids outside [0, E)) included; without the slot
order (BY_SLOT, INV: the grouped kernel's), every row the other kernels read; on a GPU, the one Triton kernel the
step captures instead."""
import random

import pytest
import torch

from spice_core.exec import slot_kernels

from spice_core.runtime.graphed_plan import APPROX, BY_SLOT, EXPERT, INV, KIND, PERM, SLOT, VALID, plan_rows
from spice_core.runtime.static_plan import kernel_plan_rows, static_plan_rows


def test_the_device_plan_row_is_the_host_plan_row_for_any_picks():
    rng = random.Random(0)
    n_experts, k, n_slots = 16, 4, 40
    for trial in range(200):
        slot_of = rng.sample(range(n_slots), n_experts)
        ids = rng.sample(range(n_experts), k)
        if trial % 4 == 0:
            ids[rng.randrange(k)] = rng.choice([-1, n_experts, n_experts + 3])
        slots = [slot_of[e] for e in ids if 0 <= e < n_experts]
        host = plan_rows(ids, slots, n_experts, n_slots)
        dev = static_plan_rows(torch.tensor(slot_of), torch.tensor([ids]), n_slots)
        assert dev.dtype == torch.long and dev.tolist() == host, (ids, host, dev.tolist())
        lean = static_plan_rows(torch.tensor(slot_of), torch.tensor([ids]), n_slots, slot_order=False).tolist()
        for row in (SLOT, PERM, VALID, APPROX, EXPERT, KIND):       # what the slots and gather kernels read
            assert lean[row] == host[row], (row, ids)
        assert lean[BY_SLOT] == lean[INV] == [0] * k


@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and slot_kernels.available()), reason="needs CUDA and Triton")
@pytest.mark.parametrize("k", (2, 6, 8))
def test_the_plan_kernel_writes_the_rows_of_its_specification_and_stages_the_routing(k):
    """The one-graph step's kernel (`kernel_plan_rows`) against `static_plan_rows`, every row (slot order included),
    dropped picks included; the picks and the router weights land in the staging rows unchanged."""
    rng = random.Random(k)
    n_experts, n_slots = 64, 200
    dev = torch.device("cuda")
    for trial in range(100):
        slot_of = torch.tensor(rng.sample(range(n_slots), n_experts), device=dev)
        ids = rng.sample(range(n_experts), k)
        if trial % 3 == 0:
            ids[rng.randrange(k)] = rng.choice([-1, n_experts, n_experts + 5])
        idx = torch.tensor([ids], device=dev)
        w = torch.rand(1, k, device=dev).to(torch.bfloat16 if trial % 2 else torch.float32)
        idx_stage = torch.full((k,), -7, dtype=torch.long, device=dev)
        w_stage = torch.zeros(k, dtype=torch.float32, device=dev)
        got = kernel_plan_rows(slot_of, idx, w, n_slots, idx_stage, w_stage)
        want = static_plan_rows(slot_of, idx, n_slots)
        assert got.tolist() == want.tolist(), (ids, got.tolist(), want.tolist())
        assert idx_stage.tolist() == ids and torch.equal(w_stage, w.reshape(-1).float())
