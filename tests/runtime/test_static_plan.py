"""A static cache's plan row, computed on the device from the routing (`static_plan_rows`), is the row the host
writes for the same picks (`plan_rows`): every row, dropped picks (ids outside [0, E)) included; without the slot order (BY_SLOT, INV: the
grouped kernel's), every row the other kernels read."""
import random

import torch

from spice_core.runtime.graphed_plan import APPROX, BY_SLOT, EXPERT, INV, KIND, PERM, SLOT, VALID, plan_rows
from spice_core.runtime.graphed_step import static_plan_rows


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
