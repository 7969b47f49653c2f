"""CpuJobs: exact (or int8) expert runs on the host for the planner's CPU misses, shared by both executors.

    submit / submit_int8 ─► the CPU lane (exec/cpu_lane.py) computes the expert from its host weights; with
                            no lane (modeled timing on this machine) it is computed here, timed as the lane
    collect              ─► the job's output, its run timed for the clock; None when the job failed (the
                            executor then copies the expert in instead, exactly)

Mechanism only: which misses go to the CPU is the planner's decision.
"""
from __future__ import annotations

import time

import torch

from spice_core.exec.experts import expert_forward
from spice_core.exec.int8 import int8_expert_forward
from spice_core.types import ExpertKey


class CpuJobs:
    def __init__(self, lm, clock, recorder, *, cpu_lane=None, int8=None) -> None:
        """``int8``: the experts' int8 copy (memory/int8_store.py) for the plan's cpu_int8 misses, when offered."""
        self.lm, self.clock, self.recorder = lm, clock, recorder
        self.lane, self.int8 = cpu_lane, int8

    def submit(self, key: ExpertKey, xs: torch.Tensor, n: int, act, out_device, stream=None):
        """Start expert ``key`` on the ``n`` token rows ``xs``; its output lands on ``out_device``. ``stream``: the
        CUDA stream ``xs`` was written on (the lane waits for it). Returns the job's handle for `collect`."""
        gate_up, down = self.lm.host.weights(key)
        if self.lane is None:   # modeled on this machine: compute here, time it as the CPU lane
            out = expert_forward(xs.to(gate_up.dtype), gate_up, down, act)
            return self.clock.cpu_expert(key, n), out
        return self.clock.cpu_expert(key, n), self.lane.submit(xs, gate_up, down, act, out_device, stream=stream)

    def submit_int8(self, key: ExpertKey, xs: torch.Tensor, n: int, act, out_device, stream=None):
        """`submit` with the lossy int8 kernel, from the experts' int8 copy (a cpu_int8 miss)."""
        weights = self.int8.weights(key)
        if self.lane is None:   # modeled on this machine: compute here, time it as the CPU lane
            out = int8_expert_forward(xs.to("cpu"), weights, act).to(xs.device)
            return self.clock.cpu_expert(key, n, int8=True), out
        return self.clock.cpu_expert(key, n, int8=True), self.lane.submit_int8(xs, weights, act, out_device,
                                                                               stream=stream)

    def collect(self, key: ExpertKey, handle) -> torch.Tensor | None:
        """A job's output, timed for the clock; None (counted as a fallback) when the job failed."""
        op, native = handle
        if isinstance(native, torch.Tensor):
            self.clock.cpu_collected(op)
            return native
        try:
            w0 = time.perf_counter()
            out, worker, t0, t1 = native.result()
            self.clock.cpu_collected(op, (worker, t0, t1, w0, time.perf_counter()))
            return out
        except Exception as err:  # noqa: BLE001 - any worker failure falls back to an exact copy
            self.recorder.cpu_fallback(key, err)
            return None
