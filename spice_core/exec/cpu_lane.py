"""The CPU lane: exact experts computed from host weights by a small pool of worker threads.

    driver thread                      workers 0..W-1 (one trace lane "cpu0")
    submit(x) ─ D2H (async, pinned) + event ─► each worker: wait event ─► its rows of gate_up ─► act·mul
         ...GPU runs hits, shared expert...                                  (all W done) ─► its rows of down
    LaneResult.result() ◄───────────────────────────────────────────────────── the last one finishes the job
         └─ H2D of the output (async, on the caller's stream) ─► (output, worker, start_s, end_s)

One expert is split by output rows across the W workers (`split_rows`), each running `F.linear` on its
block of rows with ``threads_per_worker`` intra-op threads: every output element is the same dot product
`F.linear` computes over the whole matrix, in bf16 with fp32 accumulation. Measured on the H200 host
(`benchmarks/cpu_lane_profile.py`): one bf16 `F.linear` over a 17 MB expert reaches ~35 GB/s at 15
threads, however many there are, while W single-threaded blocks in parallel read the DRAM faster; a job's
Python between two matmuls takes the GIL, which the driver's host step holds in stretches, so the lane
uses few, large operations per worker. ``workers=1`` runs `expert_forward` unsplit.

Why the output's copy back is issued by the *caller*: a worker thread's copy would run on the
device's legacy default stream and wait behind every kernel the GPU has queued; issued by the
driver on its own stream, the small [n,H] copy simply queues before the combine that needs it.

Threads: ``workers`` x ``threads_per_worker`` never exceeds the cores this process may use minus
one (left to the driver thread). The intra-op thread count is set in each worker thread; the lane
exists only on CUDA machines, where the driver thread does little CPU math. A machine with one core
gets no lane (ConfigError naming --no-cpu-lane).

Failures: `submit` never raises; a failed or overdue task raises from `result()` (after
``timeout_s``), is counted in ``failures``, and the executor falls back to an exact copy of
that expert. Output is never silently wrong. Knows nothing of policies or timing models.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable

import torch
from torch.nn import functional as F

from spice_core.errors import ConfigError
from spice_core.exec.experts import expert_forward

DEFAULT_TIMEOUT_S = 10.0
SHAPE_ENV = "SPICE_CPU_LANE"     # e.g. "5x3": workers x intra-op threads; overrides the default below
DEFAULT_SHAPE = "1x0"            # 1 worker, every core left after the driver thread (0: the rest)


def available_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # non-Linux
        return os.cpu_count() or 1


class LaneResult:
    """A submitted CPU-lane task. ``result()`` -> (output on the requested device, worker index,
    start and end in `time.perf_counter` seconds); it raises the task's error, or TimeoutError
    after the lane's ``timeout_s``."""

    def __init__(self, lane: "CpuLane", future: Future, out_device: torch.device) -> None:
        self._lane, self._future, self._out_device = lane, future, out_device
        self._value = None

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None):
        if self._value is not None:
            return self._value
        try:
            y, worker, t0, t1 = self._future.result(self._lane.timeout_s if timeout is None else timeout)
        except FutureTimeout as e:
            self._lane._count_failure()
            raise TimeoutError(f"CPU-lane task still running after {self._lane.timeout_s:.1f} s") from e
        except Exception:
            self._lane._count_failure()
            raise
        if y.device != self._out_device:
            y = y.to(self._out_device, non_blocking=y.is_pinned())
        self._value = (y, worker, t0, t1)
        return self._value


def split_rows(n_rows: int, parts: int, align: int = 16) -> list[tuple[int, int]]:
    """[0, n_rows) cut into ``parts`` contiguous blocks of near-equal size (multiples of ``align`` but the last);
    fewer blocks when the rows run out. Blocks never overlap and cover every row."""
    step = max(align, -(-n_rows // parts // align) * align)
    return [(a, min(n_rows, a + step)) for a in range(0, n_rows, step)]


class _Job:
    """One expert split across the lane's workers: phase 1 (gate_up rows -> act·mul) on every block, then
    phase 2 (down rows). The last worker to finish phase 2 resolves the future."""

    def __init__(self, x, gate_up, down, act, ready, pin, workers: int) -> None:
        self.x, self.gate_up, self.down, self.act, self.ready, self.pin = x, gate_up, down, act, ready, pin
        self.future: Future = Future()
        inter, hidden = down.shape[1], down.shape[0]
        self.p1 = split_rows(inter, workers)
        self.p2 = split_rows(hidden, workers)
        self.h = self.y = None
        self.error: BaseException | None = None
        self._left1 = self._left2 = workers      # every worker takes the job, with a block or not
        self._lock = threading.Lock()
        self.phase0_done = threading.Event()    # worker 0 has the input in the weights' dtype and the outputs
        self.phase1_done = threading.Event()
        self.t0 = None

    def fail(self, err: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = err
        self.phase0_done.set()
        self.phase1_done.set()

    def run_part(self, w: int) -> None:
        """Worker ``w``'s share (called once per worker per job, in submission order)."""
        try:
            if w < len(self.p1) and self.error is None:
                if self.ready is not None and w == 0:
                    self.ready.synchronize()
                if w == 0:
                    self.t0 = time.perf_counter()
                    xs = self.x.to(self.gate_up.dtype)
                    self.h = torch.empty((xs.shape[0], self.down.shape[1]), dtype=xs.dtype)
                    self.y = torch.empty((xs.shape[0], self.down.shape[0]), dtype=xs.dtype)
                    self.x = xs
                    self.phase0_done.set()
                else:
                    self.phase0_done.wait()
                if self.error is None:
                    a, b = self.p1[w]
                    inter = self.down.shape[1]
                    g = F.linear(self.x, self.gate_up[a:b])
                    u = F.linear(self.x, self.gate_up[inter + a:inter + b])
                    self.h[:, a:b] = self.act(g) * u
        except BaseException as e:  # noqa: BLE001 - the job's error, raised from result()
            self.fail(e)
        with self._lock:
            self._left1 -= 1
            last1 = self._left1 == 0
        if last1:
            self.phase1_done.set()
        else:
            self.phase1_done.wait()
        try:
            if w < len(self.p2) and self.error is None:
                c, d = self.p2[w]
                self.y[:, c:d] = F.linear(self.h, self.down[c:d])
        except BaseException as e:  # noqa: BLE001
            self.fail(e)
        with self._lock:
            self._left2 -= 1
            last2 = self._left2 == 0
        if last2:
            if self.error is not None:
                self.future.set_exception(self.error)
            else:
                y = self.y.pin_memory() if self.pin else self.y
                self.future.set_result((y, 0, self.t0, time.perf_counter()))


class CpuLane:
    def __init__(self, workers: int = 1, threads_per_worker: int | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """``workers`` threads, each running ``threads_per_worker`` intra-op threads; with more than one worker
        each expert is split by rows across all of them (`split_rows`)."""
        cores = available_cores()
        if cores < 2:
            raise ConfigError(f"the CPU lane needs at least 2 cores (one drives the GPU) but this process may use "
                              f"{cores}: run with --no-cpu-lane (or policy spice_no_cpu / lru), or give it more cores")
        if not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"cpu workers={workers!r} is out of range: use an integer in [1, {cores - 1}]")
        if workers > cores - 1:
            raise ConfigError(f"cpu workers={workers} would oversubscribe this machine's {cores} cores (one is left to "
                              f"the driver thread): use at most {cores - 1}")
        tpw = threads_per_worker or max(1, (cores - 1) // workers)
        if tpw < 1 or workers * tpw > cores - 1:
            raise ConfigError(f"{workers} workers x {tpw} threads would oversubscribe {cores} cores (one is left to "
                              f"the driver thread): use workers x threads <= {cores - 1}")
        if not timeout_s > 0:
            raise ConfigError(f"cpu lane timeout_s={timeout_s!r} must be > 0")
        self.workers, self.threads_per_worker, self.timeout_s = workers, tpw, float(timeout_s)
        self._lock = threading.Lock()
        self.failures = 0
        self.tasks = 0
        self._closed = False
        self._queues = [queue.SimpleQueue() for _ in range(workers)]
        self._threads = [threading.Thread(target=self._work, args=(w,), name=f"spice-cpu{w}", daemon=True)
                         for w in range(workers)]
        for t in self._threads:
            t.start()

    @property
    def shape(self) -> str:
        """e.g. "5x3": workers x intra-op threads each."""
        return f"{self.workers}x{self.threads_per_worker}"

    def _work(self, w: int) -> None:
        torch.set_num_threads(self.threads_per_worker)
        q = self._queues[w]
        while True:
            job = q.get()
            if job is None:
                return
            if isinstance(job, _Job):
                job.run_part(w)
            else:                     # workers == 1: one whole expert, unsplit
                job()

    def _count_failure(self) -> None:
        with self._lock:
            self.failures += 1

    def submit(self, x_dev: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, act: Callable,
               out_device: torch.device, stream=None) -> LaneResult:
        """Start copying x [n,H] to the host now and run the expert (gate_up [2I,H], down [H,I],
        host tensors) on the workers; the output comes back on ``out_device``. Never raises.
        ``stream``: the CUDA stream x is produced on (default: the current one, looked up)."""
        out_device = torch.device(out_device)
        self.tasks += 1
        try:
            if self._closed:
                raise RuntimeError("the CPU lane is closed")
            cuda_in = x_dev.device.type == "cuda"
            x_host = x_dev.to("cpu", non_blocking=cuda_in)     # pinned destination when non-blocking
            ready = None
            if cuda_in:
                ready = torch.cuda.Event()
                ready.record(stream if stream is not None else torch.cuda.current_stream(x_dev.device))
            pin = out_device.type == "cuda"
            if self.workers == 1:
                fut = Future()

                def whole():
                    try:
                        if ready is not None:
                            ready.synchronize()
                        t0 = time.perf_counter()
                        y = expert_forward(x_host.to(gate_up.dtype), gate_up, down, act)
                        if pin:
                            y = y.pin_memory()
                        fut.set_result((y, 0, t0, time.perf_counter()))
                    except BaseException as e:  # noqa: BLE001 - the task's error, raised from result()
                        fut.set_exception(e)

                self._queues[0].put(whole)
            else:
                job = _Job(x_host, gate_up, down, act, ready, pin, self.workers)
                for q in self._queues:
                    q.put(job)
                fut = job.future
        except Exception as e:  # noqa: BLE001 - any failure here becomes the task's error
            fut = Future()
            fut.set_exception(e)
        return LaneResult(self, fut, out_device)

    def close(self) -> None:
        """Stop the workers once the jobs already queued are done (a stalled one is left to finish alone)."""
        if self._closed:
            return
        self._closed = True
        for q in self._queues:
            q.put(None)
        for t in self._threads:
            t.join(timeout=self.timeout_s)

    def __enter__(self) -> "CpuLane":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def lane_from_shape(shape: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> CpuLane:
    """A lane of shape "WxT" (W workers x T intra-op threads each; T 0: the cores left after the driver,
    shared out). None: ``$SPICE_CPU_LANE``, else `DEFAULT_SHAPE`. A malformed shape is a ConfigError."""
    text = (shape if shape is not None else os.environ.get(SHAPE_ENV, "") or DEFAULT_SHAPE).strip().lower()
    try:
        w_text, t_text = text.split("x")
        workers, threads = int(w_text), int(t_text)
    except ValueError:
        raise ConfigError(f"CPU lane shape {text!r} is not WxT (workers x threads, e.g. 5x3 or 1x0): "
                          f"fix {SHAPE_ENV} or the shape given") from None
    return CpuLane(workers=workers, threads_per_worker=threads or None, timeout_s=timeout_s)
