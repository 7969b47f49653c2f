"""The timeline interface the executor reports to, and the modeled implementation.

The executor does the real work (on whatever device) and tells the timeline what it
did, in program order: a layer's non-expert compute, a copy, a wait, an expert on the
GPU, a task on the CPU lane. The timeline turns that into `TraceEvent`s:

- `ModeledTimeline` (this module) replays each operation on lanes with the cost model:
  each lane runs one thing at a time, in submission order (like a CUDA stream); an
  operation starts when its lane is free and its dependencies have ended. A GPU wait
  on an unfinished copy or CPU task shows as a ``stall`` interval. This is list
  scheduling over in-order lanes, which is exactly the semantics of CUDA streams plus
  a CPU worker pool, so no global event heap is needed.
  With a profile that gives host costs (``host_*_us``), the host is a lane too: each launch,
  copy issue and lookahead plan advances the host's clock, a GPU op cannot start before the
  host launches it nor end before the host has finished launching it, and the host waits for
  the GPU at each MoE layer's routing readback and at the end of a token. That is eager batch-1
  decoding, where Python is often the bottleneck (tools/recalibrate.py fits the costs). Without
  host costs the model is the classic one, in which the host is always ahead.
- `MeasuredTimeline` (measured.py) records CUDA events around the same operations.

Neither knows about policies: they only time what they are told.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

from spice_core.timing.costs import CostModel
from spice_core.trace.events import CPU_INT8_RUN, TraceEvent, events_from_rows
from spice_core.types import ExpertKey

# How a run's notes name a decode step that is one CUDA graph (the engine writes it; `recalibrate` looks for it).
ONE_GRAPH_NOTE = "one graph, no host step between layers"


@dataclass
class OpHandle:
    """A submitted copy or CPU task; ``end_ms`` is known at once when modeled."""

    key: ExpertKey
    lane: str
    kind: str
    start_ms: float = 0.0
    end_ms: float = 0.0
    native: object = None      # measured mode: CUDA event / future


class Timeline(Protocol):
    """A clock observes: the executor does the work, then reports it. ``stamp`` marks where an
    operation starts (a CUDA event on the given stream when measured; nothing when modeled) and
    the operation's method closes it."""

    mode: str

    def start_token(self, token: int) -> None: ...
    def stamp(self, stream=None) -> object: ...
    def layer(self, layer: int, n_tokens: int, dense: bool) -> None: ...
    def segment(self, launched_perf_s: float, end_event) -> None: ...
    def copy(self, key: ExpertKey, nbytes: int, kind: str, start: object = None, stream=None) -> OpHandle: ...
    def copies(self, keys, nbytes: int, kind: str, stream, issued_ms: float) -> list[OpHandle]: ...
    def wait(self, handle: OpHandle, start: object = None) -> None: ...
    def copy_done(self, handle: OpHandle) -> None: ...
    def gpu_expert(self, key: ExpertKey, n_tokens: int, start: object = None) -> None: ...
    def approx(self, key: ExpertKey, n_tokens: int, rank: int, start: object = None) -> None: ...
    def draft(self, layer: int, n_heads: int, start: object = None) -> None: ...
    def plan(self, layer: int) -> None: ...
    def cpu_expert(self, key: ExpertKey, n_tokens: int, int8: bool = False, batch: int = 1) -> OpHandle: ...
    def cpu_collected(self, handle: OpHandle, lane_run: tuple | None = None) -> None: ...
    def mark(self, kind: str, key: ExpertKey | None, nbytes: int = 0, detail: str = "", lane: str = "gpu") -> None: ...
    def end_token(self) -> float: ...
    def now_ms(self) -> float: ...
    def copy_free_at_ms(self) -> float: ...
    def drain_events(self) -> list[TraceEvent]: ...


@dataclass
class ModeledTimeline:
    """Discrete-event replay of the executor's operations in modeled time.

    ``shape_scale``: the real work's byte size is ignored; every expert is timed as one
    expert of the cost model's shape (copies of ``nbytes`` native bytes are scaled by
    shape.expert_bytes / native_expert_bytes).
    """

    costs: CostModel
    native_expert_bytes: int
    cpu_workers: int = 1
    mode: str = "modeled"
    _gpu_free: float = 0.0
    _copy_free: float = 0.0
    _cpu_free: list[float] = field(default_factory=list)
    _token: int = 0
    _token_start: float = 0.0
    _rows: list[tuple] = field(default_factory=list)   # the token's events as TraceEvent field tuples
    _host: float = 0.0            # the host's clock, when the profile models it (see `_launch`)
    _run_ahead: bool = False      # the step is one graph, run ahead of the host's booking (`one_graph_step`)
    _routed_ms: float = 0.0       # a MoE layer's routed experts, charged with the layer in a one-graph step

    def __post_init__(self) -> None:
        self._cpu_free = [0.0] * max(1, self.cpu_workers)
        self._host_on = self.costs.profile.models_host
        # Per-call costs, memoised by token count (or bytes): the cost model is fixed for the run, and
        # recomputing them was a tenth of the engine's bookkeeping per expert.
        self._expert_ms: dict[int, float] = {}
        self._layer_ms: dict[tuple[int, bool], float] = {}
        self._copy_cost: dict[int, tuple[int, float]] = {}     # native bytes -> (modeled bytes, copy ms)
        self._host_expert_us = self.costs.profile.host_expert_us

    def one_graph_step(self, top_k: int) -> bool:
        """The run's decode step is one CUDA graph (every expert resident) that the decoder runs ahead of the host's
        booking (greedy decoding): its kernels cost the profile's ``graph_step_kernel_us``, the host launches none of
        them, each MoE layer also reads its ``top_k`` experts' weights, and a token takes the longer of its GPU step
        and the host's per-token step, which overlap. False (and nothing changes) when the profile does not give
        that cost."""
        profile = self.costs.profile
        if profile.graph_step_kernel_us <= 0:
            return False
        self.costs = replace(self.costs, profile=profile.one_graph_step())
        self._host_on, self._run_ahead, self._host_expert_us = False, True, 0.0
        self._routed_ms = self.costs.gpu_routed_read_ms(top_k)
        self._expert_ms.clear()
        self._layer_ms.clear()
        self._copy_cost.clear()
        return True

    def _launch(self, host_us: float, gpu_ms: float) -> tuple[float, float]:
        """Start and end of a GPU op the host launches now. Without host modeling: after the
        previous GPU op. With it: not before the host starts launching, and not done before the
        host has finished launching (launch-bound eager kernels)."""
        if not self._host_on:
            start = self._gpu_free
            return start, start + gpu_ms
        start = max(self._gpu_free, self._host)
        self._host += host_us / 1e3
        return start, max(start + gpu_ms, self._host)

    def _sync(self) -> None:
        """The host waits for the GPU (a readback)."""
        if self._host_on:
            self._host = max(self._host, self._gpu_free)

    # -- helpers
    def _emit(self, lane: str, kind: str, start: float, end: float, key: ExpertKey | None,
              nbytes: int = 0, detail: str = "") -> None:
        """One event, kept as a tuple of TraceEvent's fields until `drain_events` builds the token's events."""
        layer, expert = (key[0], key[1]) if key is not None else (-1, -1)
        self._rows.append((self._token, layer, expert, lane, kind, start, end, nbytes, self.mode, detail))

    def _scaled_bytes(self, nbytes: int) -> int:
        return int(round(nbytes * self.costs.expert_bytes / max(1, self.native_expert_bytes)))

    # -- operations
    def start_token(self, token: int) -> None:
        self._token = token
        self._sync()
        self._token_start = max(self._gpu_free, self._host) if self._host_on else self._gpu_free

    def stamp(self, stream=None) -> None:
        return None

    def segment(self, launched_perf_s: float, end_event) -> None:
        """A measured clock's note of a graph segment's launch and end: the model times the layers itself."""

    def layer(self, layer: int, n_tokens: int, dense: bool) -> None:
        dur = self._layer_ms.get((n_tokens, dense))
        if dur is None:
            dur = self.costs.gpu_layer_ms(n_tokens, dense=dense) + (0.0 if dense else self._routed_ms)
            self._layer_ms[(n_tokens, dense)] = dur
        start, self._gpu_free = self._launch(self.costs.profile.host_layer_us, dur)
        self._emit("gpu", "layer", start, self._gpu_free, ExpertKey(layer, -1), detail="dense" if dense else "")
        if not dense:
            self._sync()          # the MoE layer's routing is read back before its experts are placed

    def copy(self, key: ExpertKey, nbytes: int, kind: str, start: object = None, stream=None) -> OpHandle:
        cached = self._copy_cost.get(nbytes)
        if cached is None:
            modeled = self._scaled_bytes(nbytes)
            cached = self._copy_cost[nbytes] = (modeled, self.costs.copy_ms(modeled))
        modeled_bytes, copy_ms = cached
        if self._host_on:
            self._host += self.costs.profile.host_copy_us / 1e3
            start = max(self._copy_free, self._host)   # issued when the host gets to it
        else:
            start = max(self._copy_free, self._gpu_free)   # issued now, from the driver's point in the stream
        end = start + copy_ms
        self._copy_free = end
        self._emit("copy", kind, start, end, key, modeled_bytes)
        return OpHandle(key, "copy", kind, start, end)

    def copies(self, keys, nbytes: int, kind: str, stream, issued_ms: float) -> list[OpHandle]:
        """Copies queued together on the copy stream: each is modeled as its own (`copy`)."""
        return [self.copy(key, nbytes, kind, None, stream) for key in keys]

    def wait(self, handle: OpHandle, start: object = None) -> None:
        if handle.end_ms > self._gpu_free:
            self._emit("gpu", "stall", self._gpu_free, handle.end_ms, handle.key, detail=f"waits for {handle.kind}")
            self._gpu_free = handle.end_ms

    def copy_done(self, handle: OpHandle) -> None:
        """The executor holds ``handle`` no more: nothing to free in modeled time."""

    def gpu_expert(self, key: ExpertKey, n_tokens: int, start: object = None) -> None:
        dur = self._expert_ms.get(n_tokens)
        if dur is None:
            dur = self._expert_ms[n_tokens] = self.costs.gpu_expert_ms(n_tokens)
        t0, self._gpu_free = self._launch(self._host_expert_us, dur)
        self._emit("gpu", "expert", t0, self._gpu_free, key)

    def approx(self, key: ExpertKey, n_tokens: int, rank: int, start: object = None) -> None:
        t0, self._gpu_free = self._launch(self.costs.profile.host_expert_us, self.costs.approx_ms(rank, n_tokens))
        self._emit("gpu", "approx", t0, self._gpu_free, key, detail=f"rank {rank}")

    def draft(self, layer: int, n_heads: int, start: object = None) -> None:
        """Predictor work on the GPU: ``n_heads`` small matmuls (launch-bound)."""
        t0, self._gpu_free = self._launch(0.0, n_heads * 2 * self.costs.profile.gpu_kernel_us / 1e3)
        self._emit("gpu", "draft", t0, self._gpu_free, ExpertKey(layer, -1), detail=f"{n_heads} heads")

    def plan(self, layer: int) -> None:
        """The host reads a prediction back and plans the lookahead (after the layer's routing sync)."""
        if self._host_on:
            self._host += self.costs.profile.host_plan_us / 1e3

    def cpu_expert(self, key: ExpertKey, n_tokens: int, int8: bool = False, batch: int = 1) -> OpHandle:
        """A CPU-lane task submitted now (modeled: the executor computed it inline). ``int8``: the lossy int8
        kernel (its own cost and event kind, ``cpu_int8_run``). ``batch``: the layer's lane jobs, this one
        included; a lane that runs them side by side charges each its share (`CostModel.lane_batch_factor`), so
        the layer's jobs, booked one after another, end when they would together."""
        w = min(range(len(self._cpu_free)), key=lambda i: self._cpu_free[i])
        start = max(self._cpu_free[w], self._host if self._host_on else self._gpu_free)
        ms = self.costs.cpu_int8_expert_ms(n_tokens) if int8 else self.costs.cpu_expert_ms(n_tokens)
        end = start + ms * self.costs.lane_batch_factor(batch)
        self._cpu_free[w] = end
        kind = CPU_INT8_RUN if int8 else "cpu_run"
        self._emit(f"cpu{w}", kind, start, end, key)
        return OpHandle(key, f"cpu{w}", kind, start, end)

    def cpu_collected(self, handle: OpHandle, lane_run: tuple | None = None) -> None:
        if self._host_on:         # the host collects the result, then hands it to the GPU
            self._host = max(self._host, handle.end_ms)
        self.wait(handle)

    def mark(self, kind: str, key: ExpertKey | None, nbytes: int = 0, detail: str = "", lane: str = "gpu") -> None:
        """An instant. On the copy lane (an eviction, a wasted prefetch) it is the planner's decision, made when the
        host issues the copy that follows (it was stamped at the end of the last copy, which may lie in a past token)."""
        t = (self._host if self._host_on else self._gpu_free) if lane == "copy" else self._gpu_free
        self._emit(lane, kind, t, t, key, nbytes, detail)

    def end_token(self) -> float:
        if self._host_on:
            self._sync()          # the sampled token is read back
            self._host += self.costs.host_step_ms()
            self._gpu_free = max(self._gpu_free, self._host)
            self._emit("host", "token", self._token_start, self._host, None)
            return self._host - self._token_start
        start = self._gpu_free
        if self._run_ahead:       # the host books this step while the next one runs
            self._gpu_free = max(start, self._token_start + self.costs.host_step_ms())
        else:
            self._gpu_free = start + self.costs.host_step_ms()
        self._emit("host", "token", self._token_start, self._gpu_free, None)
        return self._gpu_free - self._token_start

    def now_ms(self) -> float:
        return max(self._host, self._gpu_free) if self._host_on else self._gpu_free

    def copy_free_at_ms(self) -> float:
        return self._copy_free

    def drain_events(self) -> list[TraceEvent]:
        rows, self._rows = self._rows, []
        return events_from_rows(rows)
