"""The cost model: how long each operation takes on a profile, for a shape.

Used twice: by the modeled timeline to *time* decisions, and by policies (lookahead,
miss orchestration) to *make* them in either timing mode. Batch-1 decoding is memory
bound, so a kernel's time is max(bytes / bandwidth, flops / peak) plus launch overhead.
"""
from __future__ import annotations

from dataclasses import dataclass

from spice_core.timing.profiles import HardwareProfile, ModelShape

_GB = 1e9


def _ms(nbytes: float, gbps: float) -> float:
    return nbytes / (gbps * _GB) * 1e3


@dataclass(frozen=True)
class CostModel:
    profile: HardwareProfile
    shape: ModelShape
    # From how many experts a layer the run's CPU lane runs them side by side (the auto lane: 3; 0: never, a fixed
    # shape). The lane's shape is the machine's, so the engine sets it beside the profile.
    lane_side_from: int = 0

    @property
    def expert_bytes(self) -> int:
        return self.shape.expert_bytes

    def copy_ms(self, nbytes: int | None = None, pinned: bool = True) -> float:
        """Host-to-device copy of ``nbytes`` (default: one expert of the shape)."""
        nbytes = self.expert_bytes if nbytes is None else nbytes
        bw = self.profile.h2d_pinned_gbps if pinned else self.profile.h2d_pageable_gbps
        return self.profile.copy_latency_us / 1e3 + _ms(nbytes, bw)

    def gpu_expert_ms(self, n_tokens: int = 1) -> float:
        flops = 2.0 * self.expert_bytes / self.shape.dtype_bytes * n_tokens
        t = max(_ms(self.expert_bytes, self.profile.gpu_mem_gbps), flops / (self.profile.gpu_tflops * 1e12) * 1e3)
        return t + self.profile.gpu_kernels_per_expert * self.profile.gpu_kernel_us / 1e3

    def gpu_routed_read_ms(self, n_experts: int) -> float:
        """Reading ``n_experts`` routed experts' weights at the GPU's memory rate, with no launch cost: the experts of
        a one-graph step's MoE layer (`ModeledTimeline.one_graph_step`), the top-k of every token."""
        return _ms(n_experts * self.expert_bytes, self.profile.gpu_mem_gbps)

    def gpu_layer_ms(self, n_tokens: int = 1, dense: bool = False) -> float:
        """Non-routed work of one decoder layer: attention, norms, router, shared expert (or the dense MLP)."""
        s = self.shape
        nbytes = s.attention_params * s.dtype_bytes
        nbytes += 3 * s.hidden * (s.dense_intermediate if dense else s.shared_intermediate) * s.dtype_bytes
        flops = 2.0 * nbytes / s.dtype_bytes * n_tokens
        t = max(_ms(nbytes, self.profile.gpu_mem_gbps), flops / (self.profile.gpu_tflops * 1e12) * 1e3)
        return t + self.profile.gpu_kernels_per_layer * self.profile.gpu_kernel_us / 1e3

    @property
    def int8_expert_bytes(self) -> int:
        """One expert of the shape as the lossy int8 copy holds it (memory/int8_store.py): a byte per weight and a
        bf16 scale per output row of gate_up and down."""
        s = self.shape
        return self.expert_bytes // s.dtype_bytes + 2 * (2 * s.expert_intermediate + s.hidden)

    def cpu_expert_ms(self, n_tokens: int = 1, link_busy: bool = False) -> float:
        """One exact expert on the CPU lane, including the activation round trip over the link. ``link_busy``: while
        host-to-device copies stream from the same DRAM, the lane gets what they leave of ``host_dram_gbps``
        (when the profile knows it; FASTPATH §2.6: 81 GB/s on the H200 host, 54 of them the link's)."""
        return self._cpu_lane_ms(self.expert_bytes, n_tokens, link_busy)

    def cpu_int8_expert_ms(self, n_tokens: int = 1, link_busy: bool = False) -> float:
        """One expert on the CPU lane from its int8 copy (lossy): `cpu_expert_ms` with the int8 copy's bytes (about
        half) streamed at the lane's ``cpu_mem_gbps``, and the same task overhead and round trip; no constant of its
        own. Conservative: measured, the int8 kernel ran 2.5x faster than bf16 on the H200 host (0.19 against
        0.48 ms, issue 22) and 3x on the dev CPU (docs/benchmarks/cpu-lane/int8/)."""
        return self._cpu_lane_ms(self.int8_expert_bytes, n_tokens, link_busy)

    def lane_batch_factor(self, n_experts: int) -> float:
        """The CPU lane's wall for a layer's ``n_experts`` jobs as a fraction of their one-after-another times: 1
        below ``lane_side_from`` (one at a time on every core), 1 / the profile's ``cpu_side_speedup`` from it (whole
        experts side by side; its median over 3-6 experts measured 1.30-1.38 on the H200 and H100 hosts, one size
        alone anywhere from 0.95 to 1.58)."""
        if self.lane_side_from <= 0 or n_experts < self.lane_side_from:
            return 1.0
        return 1.0 / self.profile.cpu_side_speedup

    def _cpu_lane_ms(self, weight_bytes: int, n_tokens: int, link_busy: bool) -> float:
        flops = 2.0 * self.expert_bytes / self.shape.dtype_bytes * n_tokens
        mem_gbps = self.profile.cpu_mem_gbps
        if link_busy and self.profile.host_dram_gbps > 0:
            mem_gbps = max(1.0, min(mem_gbps, self.profile.host_dram_gbps - self.profile.h2d_pinned_gbps))
        compute = max(_ms(weight_bytes, mem_gbps), flops / (self.profile.cpu_gflops * 1e9) * 1e3)
        compute += self.profile.cpu_job_compute_us / 1e3
        act_bytes = 2 * n_tokens * self.shape.hidden * self.shape.dtype_bytes
        round_trip = 2 * self.profile.copy_latency_us / 1e3 + _ms(act_bytes, self.profile.d2h_gbps)
        return compute + round_trip + self.profile.cpu_task_us / 1e3

    def approx_ms(self, rank: int, n_tokens: int = 1) -> float:
        """A LoRE surrogate (two rank-r matmuls) on the GPU: launch-bound at batch 1."""
        nbytes = 2 * rank * self.shape.hidden * self.shape.dtype_bytes
        return _ms(nbytes, self.profile.gpu_mem_gbps) + 3 * self.profile.gpu_kernel_us / 1e3

    def host_step_ms(self) -> float:
        return self.profile.host_step_us / 1e3
