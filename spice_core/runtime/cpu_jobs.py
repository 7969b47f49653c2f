"""CpuJobs: exact (or int8) expert runs on the host for the planner's CPU misses, shared by both executors.

    submit / submit_int8 ─► the CPU lane (exec/cpu_lane.py) computes the expert from its host weights; with
                            no lane (modeled timing on this machine) it is computed here, timed as the lane
    collect              ─► the job's output, its run timed for the clock; None when the job failed (the
                            executor then copies the expert in instead, exactly)

Mechanism only: which misses go to the CPU is the planner's decision. It also keeps what the lane's jobs cost
(`lane_totals`): for each real lane job of one token (a decode step's), its compute time on the worker and the host's
wait for it, so a run reports the lane's ms and GB/s per expert as measured, not as the profile believes; and for
each layer's jobs together (the executors submit a layer's jobs in one burst and say how many: ``batch``), the
lane's busy wall, from the first job's start to the last one's end. A lane that runs a layer's experts side by side
(the auto shape, exec/cpu_lane.py) takes longer per job and less per layer: the busy wall is what it delivers.
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
        # per kernel ("exact", "int8"): [one-token jobs collected, their compute s on the worker, the host's wait s]
        self._cost = {"exact": [0, 0.0, 0.0], "int8": [0, 0.0, 0.0]}
        # one layer's one-token jobs together: burst id -> [first start s, last end s, jobs not collected yet,
        # jobs that ran (a failed one is no expert of lane_experts either), whether the lane ran them side by side]
        self._bursts: dict[int, list] = {}
        self._burst, self._burst_left = 0, 0
        self._busy = [0, 0.0]                    # bursts whose jobs all came in, their busy wall s summed
        self._side = [0, 0.0, 0]                 # ... of them run side by side: bursts, busy wall s, jobs

    # A burst whose jobs never all come in (a job not collected: a test's stand-in, a run stopped mid-layer) is
    # dropped this many bursts later, adding nothing.
    _STALE_BURSTS = 64

    def _in_burst(self, job, batch: int) -> None:
        """Count a one-token job into its layer's burst (the first of ``batch`` jobs submitted together opens one) and
        tag the job with it. Bookkeeping only: it never raises."""
        if self._burst_left <= 0 or self._burst not in self._bursts:
            self._burst += 1
            self._burst_left = max(1, batch)
            side_from = getattr(self.lane, "side_from", 0)
            self._bursts[self._burst] = [float("inf"), float("-inf"), 0, 0, 0 < side_from <= batch]
            self._bursts.pop(self._burst - self._STALE_BURSTS, None)
        self._burst_left -= 1
        span = self._bursts[self._burst]
        try:
            job.burst = self._burst
        except AttributeError:                  # a job that takes no attribute is not counted
            return
        span[2] += 1

    def _out_of_burst(self, job, t0: float | None = None, t1: float | None = None) -> None:
        """A job was collected (``t0``/``t1``: its run, None when it failed); a burst whose jobs are all in adds its
        busy wall. A job without a burst (a prompt's, or one made elsewhere) changes nothing."""
        span = self._bursts.get(getattr(job, "burst", None))
        if span is None:
            return
        if t0 is not None:
            span[0], span[1] = min(span[0], t0), max(span[1], t1)
            span[3] += 1
        span[2] -= 1
        if span[2] <= 0:
            del self._bursts[job.burst]
            if span[1] >= span[0]:
                self._busy[0] += 1
                self._busy[1] += span[1] - span[0]
                if span[4]:
                    self._side[0] += 1
                    self._side[1] += span[1] - span[0]
                    self._side[2] += span[3]

    def submit(self, key: ExpertKey, xs: torch.Tensor, n: int, act, out_device, stream=None, decode: bool = False,
               batch: int = 1):
        """Start expert ``key`` on the ``n`` token rows ``xs``; its output lands on ``out_device``. ``stream``: the
        CUDA stream ``xs`` was written on (the lane waits for it). ``decode``: a decode step's job (one token), whose
        cost `lane_totals` counts; a prompt's jobs are not counted, even one of a single routed row (they queue
        behind the layer's other prompt jobs). ``batch``: how many jobs the layer submits together (the lane's
        shape may follow it). Returns the job's handle for `collect`."""
        gate_up, down = self.lm.host.weights(key)
        if self.lane is None:   # modeled on this machine: compute here, time it as the CPU lane
            out = expert_forward(xs.to(gate_up.dtype), gate_up, down, act)
            return self.clock.cpu_expert(key, n, batch=batch), out, None
        job = self.lane.submit(xs, gate_up, down, act, out_device, stream=stream, batch=batch)
        if decode:
            self._in_burst(job, batch)
        return self.clock.cpu_expert(key, n, batch=batch), job, "exact" if decode else None

    def submit_int8(self, key: ExpertKey, xs: torch.Tensor, n: int, act, out_device, stream=None, decode: bool = False,
                    batch: int = 1):
        """`submit` with the lossy int8 kernel, from the experts' int8 copy (a cpu_int8 miss)."""
        weights = self.int8.weights(key)
        if self.lane is None:   # modeled on this machine: compute here, time it as the CPU lane
            out = int8_expert_forward(xs.to("cpu"), weights, act).to(xs.device)
            return self.clock.cpu_expert(key, n, int8=True, batch=batch), out, None
        job = self.lane.submit_int8(xs, weights, act, out_device, stream=stream, batch=batch)
        if decode:
            self._in_burst(job, batch)
        return self.clock.cpu_expert(key, n, int8=True, batch=batch), job, "int8" if decode else None

    def collect(self, key: ExpertKey, handle) -> torch.Tensor | None:
        """A job's output, timed for the clock; None (counted as a fallback) when the job failed."""
        op, native, kernel = handle
        if isinstance(native, torch.Tensor):
            self.clock.cpu_collected(op)
            return native
        try:
            w0 = time.perf_counter()
            out, worker, t0, t1 = native.result()
            w1 = time.perf_counter()
            self.clock.cpu_collected(op, (worker, t0, t1, w0, w1))
            if kernel is not None:
                cost = self._cost[kernel]
                cost[0] += 1
                cost[1] += t1 - t0
                cost[2] += w1 - w0
            self._out_of_burst(native, t0, t1)
            return out
        except Exception as err:  # noqa: BLE001 - any worker failure falls back to an exact copy
            self._out_of_burst(native)
            self.recorder.cpu_fallback(key, err)
            return None

    def lane_totals(self) -> dict:
        """What the lane's one-token jobs cost in this run, as sums (so runs and shards add up exactly): per kernel,
        the jobs, their compute µs on the worker and the host's µs waiting for them; the bytes an exact job reads
        (one expert's weights); the layers' bursts of jobs and the lane's busy µs over them (each burst from its first
        job's start to its last one's end), and of those the bursts the lane ran side by side, their jobs and busy µs (the
        rest ran one after another). Empty when no real lane job ran (no lane, or modeled on this machine)."""
        (n, compute_s, wait_s), (n8, compute8_s, wait8_s) = self._cost["exact"], self._cost["int8"]
        if not n and not n8:
            return {}
        return {"lane_experts": n, "lane_compute_us_sum": compute_s * 1e6, "lane_wait_us_sum": wait_s * 1e6,
                "lane_int8_experts": n8, "lane_int8_compute_us_sum": compute8_s * 1e6,
                "lane_int8_wait_us_sum": wait8_s * 1e6, "lane_expert_bytes": self.lm.expert_bytes,
                "lane_bursts": self._busy[0], "lane_busy_us_sum": self._busy[1] * 1e6,
                "lane_side_bursts": self._side[0], "lane_side_experts": self._side[2],
                "lane_side_busy_us_sum": self._side[1] * 1e6}
