"""The CPU lane: exact experts computed from host weights by a small worker pool.

    driver thread                      worker k (trace lane "cpu{k}")
    submit(x on GPU) ─ D2H (async, pinned) + event ─► wait event ─► expert on the CPU ─► pin output
         ...GPU runs hits, shared expert...                                                   │
    LaneResult.result() ◄──────────────────────────────────────────────────────────────────────┘
         └─ H2D of the output (async, on the caller's stream) ─► (output, k, start_s, end_s)

Why the output's copy back is issued by the *caller*: a worker thread's copy would run on the
device's legacy default stream and wait behind every kernel the GPU has queued; issued by the
driver on its own stream, the small [n,H] copy simply queues before the combine that needs it.

Shape: ``workers`` run whole experts in parallel, each with ``threads_per_worker`` intra-op threads
(`lane_from_shape`: "WxT" or "auto", from ``$SPICE_CPU_LANE`` or `DEFAULT_SHAPE`). Measured on the H200 host
(`benchmarks/cpu_lane_profile.py`, docs/benchmarks/cpu-lane/): one expert takes 0.49 ms in bf16 `F.linear`
at 15 threads (35 GB/s, the best of 1-15 threads) and ~0.65 ms through the lane; several workers beat one
only from 3 experts a layer (3: 1.47 ms at 3x5 against 1.83 at 1x15; 4: 1.83 at 4x3 against 2.47), and
splitting one expert's rows across single-threaded workers was 2-7x slower (tried and removed). So the
default, "auto", picks per layer (`batch_shape`): the layer's experts one after another on every core left
when it sends one or two, side by side (whole experts, the cores split between them) from three. The
executors say how many experts a layer sends (``batch``); each job sets its worker's intra-op thread count
(an OpenMP setting of the calling thread) before it runs.

Threads: ``workers`` x ``threads_per_worker`` never exceeds the cores this process may use minus
one (left to the driver thread); an auto lane's jobs of one layer never use more than those either: at
most ``side`` of them compute at once (a gate per side count; the side pool may hold more workers, which
wait at the gate), and a layer's jobs are joined before the next layer's are submitted, unless a job ran
past its timeout (it keeps its worker and its threads while the next layer's jobs run). torch's intra-op thread count is set
per thread, but a thread that has not run a parallel op yet starts from the last count set anywhere,
so creating a lane may change the count of threads started later: the lane exists only on CUDA
machines, where the driver thread does little CPU math. A machine with one core gets no lane (ConfigError naming
--no-cpu-lane).

Failures: `submit` never raises; a failed or overdue task raises from `result()` (after
``timeout_s``), is counted in ``failures``, and the executor falls back to an exact copy of
that expert. Output is never silently wrong. Knows nothing of policies or timing models.

Kernels: `submit` runs the exact one (bf16 ``F.linear``, the eager CPU path's arithmetic); `submit_int8`
the lossy int8 weight-only one (exec/int8.py), only ever for a miss the planner marked ``cpu_int8``.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Callable

import torch

from spice_core.errors import ConfigError
from spice_core.exec.experts import expert_forward
from spice_core.exec.int8 import Int8Expert, int8_expert_forward

DEFAULT_TIMEOUT_S = 10.0
SHAPE_ENV = "SPICE_CPU_LANE"     # e.g. "2x7": workers x intra-op threads; overrides the default below
AUTO_SHAPE = "auto"              # per layer: `batch_shape`
DEFAULT_SHAPE = AUTO_SHAPE       # "1x0" was the default before: 1 worker, every core left after the driver thread
AUTO_PARALLEL_FROM = 3           # experts a layer from which an auto lane runs whole experts side by side
AUTO_MIN_THREADS = 3             # ... each with at least this many intra-op threads (4x3 measured best at 4 experts)
_worker_threads = threading.local()     # the intra-op thread count each worker thread last set


def available_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """Cores this process may run on: its affinity mask where the OS has one, and no more than its cgroup's CPU quota
    allows (a container, e.g. a 2-vCPU Space, may see every core of its host and be given two of them)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # non-Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_cpus(cgroup)
    return max(1, min(cores, quota)) if quota else cores


def _cgroup_cpus(root: Path) -> int | None:
    """The CPUs a cgroup quota gives (cgroup v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us``/``cfs_period_us``),
    rounded up; None without a quota (or without cgroups)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
    except (OSError, ValueError):
        try:
            quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return -(-q // p) if q > 0 and p > 0 else None


def most_side_by_side(cores_left: int, min_threads: int = AUTO_MIN_THREADS) -> int:
    """How many experts an auto lane of ``cores_left`` cores runs side by side at most (``min_threads`` each)."""
    return max(1, cores_left // max(1, min_threads))


def batch_shape(batch: int, cores_left: int, parallel_from: int = AUTO_PARALLEL_FROM,
                min_threads: int = AUTO_MIN_THREADS) -> tuple[int, int]:
    """(experts run side by side, intra-op threads each) for a layer that sends ``batch`` experts to an auto lane
    of ``cores_left`` cores: one at a time on every core below ``parallel_from``; else at most one per
    ``min_threads`` cores side by side, in as few rounds as that allows, the batch split evenly between the rounds
    (6 experts on 15 cores: two rounds of 3x5; the fixed 3x5 lane measured 1.42 ms for 6 on an H100 host, against
    1.76 for 5x3 and a sixth alone), the cores shared out. `CpuLane` holds a layer's jobs to those rounds."""
    if cores_left < 1:
        raise ValueError(f"cores_left={cores_left} must be >= 1")
    most = most_side_by_side(cores_left, min_threads)
    if batch < parallel_from or most == 1:
        return 1, cores_left
    rounds = -(-batch // most)
    side = -(-batch // rounds)
    return side, cores_left // side


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


class CpuLane:
    def __init__(self, workers: int = 1, threads_per_worker: int | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, *, adaptive: bool = False) -> None:
        """``adaptive``: the "auto" shape (`batch_shape` per layer); ``workers`` and ``threads_per_worker`` are then
        what one expert at a time gets (1 and every core left), and up to `side_workers` run side by side."""
        cores = available_cores()
        if cores < 2:
            raise ConfigError(f"the CPU lane needs at least 2 cores (one drives the GPU) but this process may use "
                              f"{cores}: run with --no-cpu-lane (or policy spice_no_cpu / lru), or give it more cores")
        if adaptive and (workers, threads_per_worker) != (1, None):
            raise ConfigError("an auto CPU lane picks its workers and threads per layer: give no workers or threads")
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
        self.adaptive = adaptive
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="spice-cpu",
                                        initializer=_set_threads, initargs=(tpw,))
        # auto: the pool for experts side by side (each job sets its threads), when the cores allow two at once
        self.side_workers = most_side_by_side(tpw) if adaptive else 1
        self._side_pool = ThreadPoolExecutor(max_workers=self.side_workers, thread_name_prefix="spice-cpu-side") \
            if self.side_workers > 1 else None
        self._side_gates: dict[int, threading.BoundedSemaphore] = {}   # side count -> at most that many compute
        self._ids: dict[int, int] = {}
        self._lock = threading.Lock()
        self.failures = 0
        self.tasks = 0

    @property
    def side_from(self) -> int:
        """From how many experts a layer this auto lane runs them side by side; 0 for any other lane, which the
        planner prices one expert after another (a fixed shape of W >= 2 workers does run up to W side by side, but
        its jobs queue on the workers as they come, priced as one queue as before)."""
        return AUTO_PARALLEL_FROM if self.adaptive and self._side_pool is not None else 0

    @property
    def shape(self) -> str:
        """e.g. "1x15": workers x intra-op threads each; an auto lane says what it runs at each batch size."""
        if not self.adaptive:
            return f"{self.workers}x{self.threads_per_worker}"
        if self._side_pool is None:
            return f"auto (1x{self.threads_per_worker}: too few cores to run experts side by side)"
        side = self.side_workers
        return (f"auto (1x{self.threads_per_worker} below {AUTO_PARALLEL_FROM} experts a layer, "
                f"up to {side}x{self.threads_per_worker // side} from {AUTO_PARALLEL_FROM})")

    def pool_for(self, batch: int) -> tuple[ThreadPoolExecutor, int | None, threading.BoundedSemaphore | None]:
        """The pool a job of a ``batch``-expert layer runs on, the intra-op threads it sets (None: the pool's) and the
        gate it computes behind (None: none; side by side, at most `batch_shape`'s side count compute at once, so a
        layer of 6 experts on 15 cores runs two rounds of 3 x 5 threads, not 5 jobs x 5 threads)."""
        if not self.adaptive or self._side_pool is None:
            return self._pool, None, None
        side, threads = batch_shape(batch, self.threads_per_worker)
        if side == 1:
            return self._pool, None, None
        gate = self._side_gates.get(side)
        if gate is None:                        # made once per side count, not per job
            with self._lock:
                gate = self._side_gates.setdefault(side, threading.BoundedSemaphore(side))
        return self._side_pool, threads, gate

    def _worker_index(self) -> int:
        tid = threading.get_ident()
        with self._lock:
            if tid not in self._ids:
                self._ids[tid] = len(self._ids)
            return self._ids[tid]

    def _count_failure(self) -> None:
        with self._lock:
            self.failures += 1

    def submit(self, x_dev: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, act: Callable,
               out_device: torch.device, stream=None, batch: int = 1) -> LaneResult:
        """Start copying x [n,H] to the host now and run the expert (gate_up [2I,H], down [H,I],
        host tensors) on a worker; the output comes back on ``out_device``. Never raises.
        ``stream``: the CUDA stream x is produced on (default: the current one, looked up).
        ``batch``: how many experts the layer sends the lane together (an auto lane's shape follows it)."""
        return self._submit(x_dev, lambda x: expert_forward(x.to(gate_up.dtype), gate_up, down, act), out_device,
                            stream, batch)

    def submit_int8(self, x_dev: torch.Tensor, weights: Int8Expert, act: Callable, out_device: torch.device,
                    stream=None, batch: int = 1) -> LaneResult:
        """`submit` for the lossy int8 kernel (exec/int8.py): the expert from its int8 copy ``weights``. The
        worker, the round trip and the failure handling are the exact task's; only the arithmetic differs."""
        return self._submit(x_dev, lambda x: int8_expert_forward(x, weights, act), out_device, stream, batch)

    def _submit(self, x_dev: torch.Tensor, compute: Callable[[torch.Tensor], torch.Tensor], out_device,
                stream, batch: int = 1) -> LaneResult:
        """``compute``: host x [n,H] -> host y [n,H], run on a worker once x has landed."""
        out_device = torch.device(out_device)
        self.tasks += 1
        try:
            pool, threads, gate = self.pool_for(batch)
            cuda_in = x_dev.device.type == "cuda"
            x_host = x_dev.to("cpu", non_blocking=cuda_in)     # pinned destination when non-blocking
            ready = None
            if cuda_in:
                ready = torch.cuda.Event()
                ready.record(stream if stream is not None else torch.cuda.current_stream(x_dev.device))
            pin = out_device.type == "cuda"

            def run():
                t0 = time.perf_counter()
                y = compute(x_host)
                if pin:
                    y = y.pin_memory()
                return y, t0, time.perf_counter()

            def job():
                w = self._worker_index()
                if threads is not None:
                    _set_threads(threads)
                if ready is not None:
                    ready.synchronize()
                if gate is None:
                    y, t0, t1 = run()
                else:
                    with gate:          # its round: the start is when it computes, not when it queued at the gate
                        y, t0, t1 = run()
                return y, w, t0, t1

            fut = pool.submit(job)
        except Exception as e:  # noqa: BLE001 - any failure here becomes the task's error
            fut = Future()
            fut.set_exception(e)
        return LaneResult(self, fut, out_device)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._side_pool is not None:
            self._side_pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "CpuLane":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _set_threads(threads: int) -> None:
    """This worker thread's intra-op thread count, set only when it changes. A thread's first parallel op sets its
    count from the last one set in the process (another worker's, maybe): `torch.get_num_threads` runs that one-time
    set-up first, so the count set after it is the one that stays."""
    if getattr(_worker_threads, "n", None) != threads:
        torch.get_num_threads()
        torch.set_num_threads(threads)
        _worker_threads.n = threads


def _shape_text(shape: str | None) -> str:
    return (shape if shape is not None else os.environ.get(SHAPE_ENV, "") or DEFAULT_SHAPE).strip().lower()


def shape_side_from(shape: str | None = None) -> int:
    """`CpuLane.side_from` of the lane ``shape`` names (None: ``$SPICE_CPU_LANE``, else `DEFAULT_SHAPE`), without
    making it: what a modeled run prices, on a machine that may have no lane."""
    return AUTO_PARALLEL_FROM if _shape_text(shape) == AUTO_SHAPE else 0


def lane_side_from(lane: CpuLane | None) -> int:
    """`CostModel.lane_side_from` for a run: ``lane``'s, or (None: modeled, no lane made) that of the lane this
    machine's shape setting names, whether or not the machine could run it."""
    return lane.side_from if lane is not None else shape_side_from()


def lane_from_shape(shape: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> CpuLane:
    """A lane of shape "WxT" (W workers x T intra-op threads each; T 0: the cores left after the driver,
    shared out) or "auto" (`batch_shape` per layer). None: ``$SPICE_CPU_LANE``, else `DEFAULT_SHAPE`. A malformed
    shape is a ConfigError."""
    text = _shape_text(shape)
    if text == AUTO_SHAPE:
        return CpuLane(timeout_s=timeout_s, adaptive=True)
    try:
        w_text, t_text = text.split("x")
        workers, threads = int(w_text), int(t_text)
    except ValueError:
        raise ConfigError(f"CPU lane shape {text!r} is not WxT (workers x threads, e.g. 1x0 or 2x7) or auto: "
                          f"fix {SHAPE_ENV} or the shape given") from None
    return CpuLane(workers=workers, threads_per_worker=threads or None, timeout_s=timeout_s)
