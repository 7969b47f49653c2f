"""The CPU lane: exact experts computed from host weights by a small worker pool.

Activations come device->host, the expert runs with torch on the CPU (threads sized so
workers x threads never exceed the cores we were given), the output goes back
host->device. On CUDA this overlaps the GPU's work on hits and the shared expert; each
worker is one trace lane (cpu0, cpu1, ...). Results are (output, worker, start_s, end_s).
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import torch

from spice_core.errors import ConfigError
from spice_core.exec.experts import expert_forward


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # non-Linux
        return os.cpu_count() or 1


class CpuLane:
    def __init__(self, workers: int = 1, threads_per_worker: int | None = None) -> None:
        cores = available_cores()
        if cores < 2:
            raise ConfigError("the CPU lane needs at least 2 cores (one drives the GPU): use --no-cpu-lane on this machine")
        if workers < 1:
            raise ConfigError(f"cpu workers={workers} must be >= 1")
        self.workers = workers
        # Leave one core to the driver thread.
        self.threads_per_worker = threads_per_worker or max(1, (cores - 1) // workers)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="spice-cpu",
                                        initializer=torch.set_num_threads, initargs=(self.threads_per_worker,))
        self._ids: dict[int, int] = {}
        self._lock = threading.Lock()
        self.failures = 0

    def _worker_index(self) -> int:
        tid = threading.get_ident()
        with self._lock:
            if tid not in self._ids:
                self._ids[tid] = len(self._ids)
            return self._ids[tid]

    def submit(self, x_dev: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, act: Callable,
               out_device: torch.device) -> Future:
        """Start copying x to the host now; compute and return the output on ``out_device``."""
        x_host = x_dev.to("cpu", non_blocking=x_dev.device.type == "cuda")
        ready = None
        if x_dev.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record()

        def job():
            w = self._worker_index()
            if ready is not None:
                ready.synchronize()
            t0 = time.perf_counter()
            y = expert_forward(x_host.to(gate_up.dtype), gate_up, down, act)
            y = y.to(out_device, non_blocking=False)
            t1 = time.perf_counter()
            return y, w, t0, t1

        return self._pool.submit(job)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
