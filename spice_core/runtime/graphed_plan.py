"""Plan rows and slot bookkeeping for the graphed decoder: pure Python, no torch.

A plan row tells segment l+1 where layer l's experts sit. It is written by the host into
pinned memory after the routing readback and uploaded with one small H2D. Rows (each K
ints, K = the model's top-k):

    0 slot_e   slot of each selection, selections in ascending expert order (invalid: 0)
    1 perm     top-k position of each selection in that order (gathers the router weights)
    2 valid    1 for a routed selection, 0 for a dropped one (an out-of-range expert id)
    3 by_slot  the slots in ascending slot order, invalid ones as n_slots (grouped GEMM rows)
    4 inv      for each selection (expert order) its row in slot order
    5 approx   1 for a selection approximated by its LoRE surrogate (its slot is a dummy 0)
    6 expert   the expert id of each selection (indexes the LoRE factors; invalid: 0)
    7 kind     what the slot kernel does with it: KIND_NONE (dropped), KIND_GPU (reads its slot),
               KIND_EXT (its output is given: LoRE; reads no slot), KIND_CPU (its output is given: the
               CPU lane's, uploaded with the plan row into the layer's CPU rows; reads no slot)

Rows are read by name (SLOT, PERM, … below), never by a bare index.

Ascending expert order is the stock loop's combine order, so every slot assignment of the
same experts combines identically (the bitwise invariant of exact policies).
"""
from __future__ import annotations

SLOT, PERM, VALID, BY_SLOT, INV, APPROX, EXPERT, KIND = range(8)
PLAN_ROWS = 8
APPROX_SLOT = -1        # what on_layer returns for a selection the LoRE branch approximates
CPU_SLOT = -2           # what on_layer returns for a selection the CPU lane computed
KIND_NONE, KIND_GPU, KIND_EXT, KIND_CPU = 0, 1, 2, 3     # the slot kernel's kinds (exec/slot_kernels.py)
GIVEN_SLOTS = (APPROX_SLOT, CPU_SLOT)       # selections whose output is given: they read no slot


def plan_rows(expert_ids: list[int], slots: list[int], n_experts: int, n_slots: int) -> list[list[int]]:
    """expert_ids: the K router picks in top-k order; slots: one per valid pick, in the same order
    (APPROX_SLOT for a pick the LoRE branch approximates, CPU_SLOT for one the CPU lane computed: its
    output goes in the layer's CPU row of the same index as its selection, see `selection_rows`).
    Every pick routed (the decode step's case, once per MoE layer on the host's critical path) takes a
    shorter way to the same rows than `plan_rows_general`."""
    k_all = len(expert_ids)
    if len(slots) != k_all or not all(0 <= e < n_experts for e in expert_ids):
        return plan_rows_general(expert_ids, slots, n_experts, n_slots)
    real = [s for s in slots if s >= 0]
    if (len(set(real)) != len(real) or any(s >= n_slots for s in real)
            or any(s < 0 and s not in GIVEN_SLOTS for s in slots)):
        raise ValueError(f"on_layer returned slots {list(slots)}: they must be distinct and in [0, {n_slots})")
    order = sorted(range(k_all), key=expert_ids.__getitem__)
    s_o = [slots[k] for k in order]
    sort_key = [s if s >= 0 else n_slots for s in s_o]
    by_slot = sorted(range(k_all), key=sort_key.__getitem__)
    inv = [0] * k_all
    for row, j in enumerate(by_slot):
        inv[j] = row
    return [[s if s >= 0 else 0 for s in s_o], order, [1] * k_all, [sort_key[j] for j in by_slot], inv,
            [1 if s == APPROX_SLOT else 0 for s in s_o], [expert_ids[k] for k in order],
            [KIND_GPU if s >= 0 else KIND_EXT if s == APPROX_SLOT else KIND_CPU for s in s_o]]


def plan_rows_general(expert_ids: list[int], slots: list[int], n_experts: int, n_slots: int) -> list[list[int]]:
    """`plan_rows` for any picks, dropped ones (out-of-range ids) included: the rows' definition."""
    k_all = len(expert_ids)
    valid_pos = [k for k, e in enumerate(expert_ids) if 0 <= e < n_experts]
    if len(slots) != len(valid_pos):
        raise ValueError(f"on_layer returned {len(slots)} slots for {len(valid_pos)} routed experts")
    slot_of = dict(zip(valid_pos, slots))
    real = [s for s in slots if s not in GIVEN_SLOTS]
    if len(set(real)) != len(real) or any(not 0 <= s < n_slots for s in real):
        raise ValueError(f"on_layer returned slots {list(slots)}: they must be distinct and in [0, {n_slots})")
    order = sorted(valid_pos, key=lambda k: expert_ids[k]) + [k for k in range(k_all) if k not in slot_of]
    valid = [1 if k in slot_of else 0 for k in order]
    approx = [1 if slot_of.get(k) == APPROX_SLOT else 0 for k in order]
    cpu = [1 if slot_of.get(k) == CPU_SLOT else 0 for k in order]
    slot_e = [0 if a or c else slot_of.get(k, 0) for k, a, c in zip(order, approx, cpu)]
    expert = [expert_ids[k] if v else 0 for k, v in zip(order, valid)]
    sort_key = [s if v and not a and not c else n_slots for s, v, a, c in zip(slot_e, valid, approx, cpu)]
    by_slot = sorted(range(k_all), key=lambda j: sort_key[j])
    inv = [0] * k_all
    for row, j in enumerate(by_slot):
        inv[j] = row
    kind = [KIND_EXT if a else KIND_CPU if c else KIND_GPU if v else KIND_NONE for v, a, c in zip(valid, approx, cpu)]
    return [slot_e, order, valid, [sort_key[j] for j in by_slot], inv, approx, expert, kind]


def selection_rows(expert_ids: list[int], n_experts: int) -> dict[int, int]:
    """Expert -> its selection's row in the plan (ascending expert order, the rows `plan_rows` writes): where
    the CPU lane puts that expert's output."""
    valid = sorted(e for e in expert_ids if 0 <= e < n_experts)
    return {e: j for j, e in enumerate(valid)}
