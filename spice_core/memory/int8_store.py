"""Int8HostStore: an int8 weight-only copy of every routed expert, beside the exact HostStore.

    HostStore row [gate_up (2I x H) | down (H x I)] (bf16 on a GPU host)
        ─► quantize_rows per output channel ─► codes row [same layout, int8] + scales row [2I | H] (bf16)

Made once per engine, from the host slab, by the first run that may take the lossy ``cpu_int8``
miss action (`SpiceEngine.int8_store`); kept for the engine's life. Cost: one byte per weight plus two
per output row, ~half of bf16 (DeepSeek-V2-Lite: 8.66 MB per expert against 17.30, 14.4 GB for its
1,664 routed experts; `total_bytes`). Two slabs, pageable: only the CPU lane reads them, nothing
copies them to the GPU, so they take no pinned memory.

Knows nothing of policies, lanes or timing; the kernel is exec/int8.py.
"""
from __future__ import annotations

import time

import torch

from spice_core.exec.int8 import COMPUTE_DTYPE, Int8Expert, quantize_rows
from spice_core.memory.host_store import ExpertLayout, HostStore
from spice_core.types import ExpertKey


class Int8HostStore:
    """``weights(key)`` -> `Int8Expert` (views into the two slabs), for every expert of ``host``."""

    def __init__(self, host: HostStore) -> None:
        t0 = time.perf_counter()
        lay: ExpertLayout = host.layout
        self.layout = lay
        keys = host.keys()
        h, i = lay.hidden, lay.intermediate
        self._codes = torch.empty((len(keys), lay.numel), dtype=torch.int8)
        self._scales = torch.empty((len(keys), 2 * i + h), dtype=COMPUTE_DTYPE)
        self._experts: dict[ExpertKey, Int8Expert] = {}
        for row, key in enumerate(keys):
            gate_up, down = host.weights(key)
            q_gu, q_dn = lay.views(self._codes[row])
            s_gu, s_dn = self._scales[row, : 2 * i], self._scales[row, 2 * i:]
            for w, q, s in ((gate_up, q_gu, s_gu), (down, q_dn, s_dn)):
                codes, scales = quantize_rows(w)
                q.copy_(codes)
                s.copy_(scales)
            self._experts[key] = Int8Expert(q_gu, s_gu, q_dn, s_dn)
        self.build_s = time.perf_counter() - t0

    def weights(self, key: ExpertKey) -> Int8Expert:
        return self._experts[key]

    def __len__(self) -> int:
        return len(self._experts)

    @property
    def expert_bytes(self) -> int:
        """One expert's codes and scales."""
        return self._codes.shape[1] * self._codes.element_size() + self._scales.shape[1] * self._scales.element_size()

    @property
    def total_bytes(self) -> int:
        return len(self) * self.expert_bytes
