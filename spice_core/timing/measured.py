"""Measured timing on CUDA: the same operations as `ModeledTimeline`, timed by CUDA
events on two streams (compute = the current stream, copies = a dedicated stream) and
by the wall clock for CPU-lane tasks. It observes only: the executor (runtime/eager.py)
issues the work on its streams and brackets it with `stamp` and the operation's method.

Clock alignment: each token starts with a synchronize, a host timestamp and a CUDA
event recorded on the idle compute stream; device times are that event's elapsed time
plus the host timestamp, so GPU, copy and CPU intervals share one axis (error: the
event's launch latency, a few µs).

Events are resolved at `end_token` (one synchronize per token, which batch-1 decoding
needs anyway to read the sampled token). Host cost per event matters (each record and each
resolution costs a few µs, and a token has hundreds): a copy records only its end, since the
copy stream runs its copies in order (a copy starts when the previous one ends, or when the host
issued it if the stream was idle: `_resolve_copy_start`), host instants (`mark`) are one tuple each
with nothing to resolve, every event is kept as a tuple until `drain_events` builds the token's
TraceEvents at once, and CUDA events are recycled from a pool once resolved (creating one costs the
host ~6 µs on the H200 host, recording a pooled one ~3: `benchmarks/host_primitives.py`). A copy's end
event is also the handle the executor waits on, so it is recycled only once it is resolved *and* the
executor has said it holds the handle no more (`copy_done`). A layer's demand copies, which the compute stream
waits for together, share one end event (`copies`): one record for the batch instead of one per copy; each copy's
interval is then the batch's span split evenly (the copies are the same bytes, in issue order on one stream), and
its detail says so. The shared event goes back to the pool once every copy of the batch is handed back.

A graph segment's GPU work (the fast path, runtime/graphed.py) is told by `segment`: the host time it was launched at
and the event recorded right after its replay. Its `layer` interval then runs from the later of that launch and the
GPU's last mark to that event: the GPU idling while the host steps between segments (planning, issuing, joining the
CPU lane) is left out of it, as is the host's wake-up after the segment ends. Without a segment (the eager executor,
and the static-slots step that runs ahead of the host) a layer spans from the last mark to now: the GPU's work and,
where the host launches more slowly than the GPU runs (the eager path at batch 1), the GPU's idle gaps between
launches.

Host cost: every stream is passed explicitly. `torch.cuda.current_stream()` and the
`torch.cuda.stream()` context look the device up through `torch.cuda.is_available()`,
which cost ~25 µs per call on the H200 host: with ~1,200 events and stream switches per
token that alone was ~30 ms per token of driver overhead.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from spice_core.timing.timeline import OpHandle
from spice_core.trace.events import CPU_INT8_RUN, TraceEvent, events_from_rows  # noqa: F401 - TraceEvent: the drained type
from spice_core.types import ExpertKey


@dataclass(slots=True)
class _Pending:
    lane: str
    kind: str
    key: ExpertKey | None
    start: object      # cuda Event or host float (ms)
    end: object
    nbytes: int = 0
    detail: str = ""
    token: int = 0
    e0: object = None          # the token's reference event and its host time
    t0_ms: float = 0.0


@dataclass(slots=True)
class _Batch:
    """Copies queued one after another on the copy stream and timed by one end event (`MeasuredTimeline.copies`):
    the batch's span, resolved once, is split evenly among its ``n`` copies."""
    event: object
    n: int
    span: tuple | None = None        # (start ms, end ms) once resolved


@dataclass(slots=True)
class _Part:
    """The ``i``-th copy of a `_Batch`: a pending copy's end."""
    batch: _Batch
    i: int


def _event_of(x):
    """The CUDA event (or host time) behind a pending interval's start or end."""
    if isinstance(x, _Launched):
        return x.after
    if isinstance(x, _Part):
        return x.batch.event
    return x


@dataclass(slots=True)
class _Launched:
    """A segment's start: its host launch time (ms on the run's axis) or the GPU's last mark, whichever is later."""
    host_ms: float
    after: object


@dataclass
class MeasuredTimeline:
    """See the module docstring."""

    device: torch.device
    copy_stream: torch.cuda.Stream
    mode: str = "measured"
    _t0_host_ms: float = 0.0
    _e0: object = None
    _token: int = 0
    _token_start_ms: float = 0.0
    _run_t0: float = field(default_factory=time.perf_counter)
    _pending: list[_Pending] = field(default_factory=list)
    _rows: list[tuple] = field(default_factory=list)        # TraceEvent fields in order, built at drain
    _free_events: list = field(default_factory=list)        # resolved timing events, recorded again (no create)
    _held_copies: dict = field(default_factory=dict)        # id of a copy end event -> handles the executor holds
    _resolved_held: dict = field(default_factory=dict)      # id -> copy end event resolved while still held
    _last_mark: object = None
    _copy_free_ms: float = 0.0
    est_copy_ms: float = 0.3              # cost-model estimate, for the predicted copy-queue end
    _copy_pred_ms: float = 0.0
    _segment: tuple | None = None         # (launch perf_counter s, end event) of a segment not yet booked (`segment`)
    _segment_booked: bool = False         # the layers after a booked segment's first, up to the next GPU mark: empty
    _foreign: set = field(default_factory=set)   # ids of events the graphed decoder owns: never pooled here

    def _host_ms(self) -> float:
        return (time.perf_counter() - self._run_t0) * 1e3

    compute_stream: object = None          # the model's stream, looked up once (see the module docstring)

    def __post_init__(self) -> None:
        self.compute_stream = torch.cuda.current_stream(self.device)

    def _event(self, stream=None):
        free = self._free_events
        e = free.pop() if free else torch.cuda.Event(enable_timing=True)
        e.record(stream if stream is not None else self.compute_stream)
        return e

    def start_token(self, token: int) -> None:
        # Only the compute stream is idle here: prefetches may still be in flight on the copy stream.
        self.compute_stream = torch.cuda.current_stream(self.device)
        self.compute_stream.synchronize()
        self._token = token
        self._t0_host_ms = self._host_ms()
        self._token_start_ms = self._t0_host_ms
        self._e0 = self._event()
        self._last_mark = self._e0
        self._segment, self._segment_booked = None, False

    def segment(self, launched_perf_s: float, end_event) -> None:
        """The graphed decoder launched a segment at ``launched_perf_s`` (time.perf_counter) and recorded
        ``end_event`` (a timing event it owns and records again next token) right after its replay: the next
        `layer` interval is that segment's GPU work (see the module docstring)."""
        self._segment = (launched_perf_s, end_event)
        self._foreign.add(id(end_event))

    def stamp(self, stream=None):
        """Where an operation starts: an event on ``stream`` (default: the compute stream)."""
        return self._event(stream)

    def layer(self, layer: int, n_tokens: int, dense: bool) -> None:
        seg = self._segment
        if seg is not None:           # a graph segment: from its launch (or the last mark) to the event after it
            self._segment, self._segment_booked = None, True
            start, end = _Launched((seg[0] - self._run_t0) * 1e3, self._last_mark), seg[1]
        elif self._segment_booked:    # another layer of the segment just booked: its work is in that interval
            start = end = self._last_mark
        else:                         # the eager executor: the layer's work ran from the last mark to now
            start, end = self._last_mark, self._event()
        self._add(_Pending("gpu", "layer", ExpertKey(layer, -1), start, end))
        self._last_mark = end

    def copy(self, key: ExpertKey, nbytes: int, kind: str, start: object = None, stream=None) -> OpHandle:
        """A copy the executor just queued on ``stream`` (the copy stream). ``start`` None: it starts when the
        copy before it on that stream ends, or now if that one has already ended (see the module docstring)."""
        end = self._event(stream)
        self._held_copies[id(end)] = 1
        self._add(_Pending("copy", kind, key, start if start is not None else -self._host_ms(), end, nbytes))
        self._copy_pred_ms = max(self._copy_pred_ms, self._host_ms()) + self.est_copy_ms
        return OpHandle(key, "copy", kind, end_ms=self._copy_pred_ms, native=end)

    def copies(self, keys, nbytes: int, kind: str, stream, issued_ms: float) -> list[OpHandle]:
        """Copies of ``nbytes`` each the executor queued one after another on ``stream`` from ``issued_ms``
        (`now_ms` before the first), which the compute stream waits for together (a layer's demand copies): one
        end event for all of them, every handle refers to it. Each copy's interval is the batch's span split
        evenly (see the module docstring)."""
        if len(keys) == 1:
            return [self.copy(keys[0], nbytes, kind, None, stream)]
        end = self._event(stream)
        batch, issued, n = _Batch(end, len(keys)), -issued_ms, len(keys)
        self._held_copies[id(end)] = n
        detail = f"one of {n} copies timed by one event: the batch's span split evenly"
        handles, pred = [], max(self._copy_pred_ms, -issued)
        for i, key in enumerate(keys):
            self._add(_Pending("copy", kind, key, issued, _Part(batch, i), nbytes, detail))
            pred += self.est_copy_ms
            handles.append(OpHandle(key, "copy", kind, end_ms=pred, native=end))
        self._copy_pred_ms = pred
        return handles

    def wait(self, handle: OpHandle, start: object = None) -> None:
        """The executor made the compute stream wait for ``handle`` after ``start``: a stall interval."""
        after = self._event()
        self._add(_Pending("gpu", "stall", handle.key, start, after, detail=f"waits for {handle.kind}"))
        self._last_mark, self._segment_booked = after, False

    def copy_done(self, handle: OpHandle) -> None:
        """The executor holds ``handle`` (a `copy`'s) no more: its end event may be recorded again once resolved."""
        i = id(handle.native)
        left = self._held_copies.get(i, 0) - 1
        if left > 0:                       # another copy of its batch is still held
            self._held_copies[i] = left
            return
        self._held_copies.pop(i, None)
        ev = self._resolved_held.pop(i, None)
        if ev is not None:
            self._free_events.append(ev)

    def _gpu_op(self, key: ExpertKey, kind: str, start, detail: str = "") -> None:
        end = self._event()
        self._add(_Pending("gpu", kind, key, start, end, detail=detail))
        self._last_mark, self._segment_booked = end, False

    def gpu_expert(self, key: ExpertKey, n_tokens: int, start: object = None) -> None:
        self._gpu_op(key, "expert", start)

    def approx(self, key: ExpertKey, n_tokens: int, rank: int, start: object = None) -> None:
        self._gpu_op(key, "approx", start, detail=f"rank {rank}")

    def draft(self, layer: int, n_heads: int, start: object = None) -> None:
        self._gpu_op(ExpertKey(layer, -1), "draft", start, detail=f"{n_heads} heads")

    def plan(self, layer: int) -> None:
        """Host planning is real time here: nothing to add."""

    def cpu_expert(self, key: ExpertKey, n_tokens: int, int8: bool = False, batch: int = 1) -> OpHandle:
        return OpHandle(key, "cpu", CPU_INT8_RUN if int8 else "cpu_run")

    def cpu_collected(self, handle: OpHandle, lane_run: tuple | None = None) -> None:
        """``lane_run``: (worker, start_perf_s, end_perf_s, wait_start_perf_s, wait_end_perf_s) from the lane."""
        worker, t_start, t_end, w_start, w_end = lane_run
        s = (t_start - self._run_t0) * 1e3
        e = (t_end - self._run_t0) * 1e3
        self._add(_Pending(f"cpu{worker}", handle.kind, handle.key, s, e))
        before_host, after_host = (w_start - self._run_t0) * 1e3, (w_end - self._run_t0) * 1e3
        if after_host - before_host > 0.01:
            self._add(_Pending("host", "stall", handle.key, before_host, after_host, detail="waits for cpu"))

    def mark(self, kind: str, key: ExpertKey | None, nbytes: int = 0, detail: str = "", lane: str = "gpu") -> None:
        t = (time.perf_counter() - self._run_t0) * 1e3
        layer, expert = (key[0], key[1]) if key is not None else (-1, -1)
        self._rows.append((self._token, layer, expert, lane, kind, t, t, nbytes, self.mode, detail))

    def _add(self, p: _Pending) -> None:
        p.token, p.e0, p.t0_ms = self._token, self._e0, self._t0_host_ms
        self._pending.append(p)

    @staticmethod
    def _resolve(p: _Pending, x) -> float:
        if isinstance(x, torch.cuda.Event):
            return p.t0_ms + p.e0.elapsed_time(x)
        if isinstance(x, _Launched):
            return max(x.host_ms, MeasuredTimeline._resolve(p, x.after))
        return float(x)

    @staticmethod
    def _done(x) -> bool:
        return not isinstance(x, torch.cuda.Event) or x.query()

    def _copy_span(self, p: _Pending) -> tuple[float, float]:
        """A resolved copy's (start, end) ms: it starts when the copy before it on the stream ended, or when the
        host issued it (``-p.start``) if the stream was idle; a batch's copies split the batch's span evenly."""
        part = p.end if isinstance(p.end, _Part) else None
        if part is None or part.batch.span is None:
            e = self._resolve(p, part.batch.event if part is not None else p.end)
            s = min(e, max(-p.start, self._copy_free_ms))
            if part is None:
                return s, e
            part.batch.span = (s, e)
        s, e = part.batch.span
        step = (e - s) / part.batch.n
        return s + step * part.i, s + step * (part.i + 1)

    def end_token(self) -> float:
        seg, self._segment = self._segment, None
        if seg is not None:    # the step's last segment, when no layer after the last MoE layer booked it
            self._add(_Pending("gpu", "layer", None, _Launched((seg[0] - self._run_t0) * 1e3, self._last_mark), seg[1],
                               detail="the step's last segment"))
        # Sync the compute stream only; copies still in flight are resolved at a later token.
        self.compute_stream.synchronize()
        end_ms = self._host_ms()
        keep, done = [], []
        batch_done: dict = {}      # a batch's event is queried once: its copies resolve in the same token
        for p in self._pending:
            end = p.end
            if isinstance(end, _Part):
                ok = batch_done.get(id(end.batch))
                if ok is None:
                    ok = batch_done[id(end.batch)] = end.batch.event.query()
            else:
                ok = self._done(end)
            if not ok:
                keep.append(p)
                continue
            done.append(p)
            if p.lane == "copy" and isinstance(p.start, float) and p.start <= 0.0:   # issued at -start, host ms
                s, e = self._copy_span(p)
            else:
                s, e = self._resolve(p, p.start), self._resolve(p, p.end)
            layer, expert = (p.key.layer, p.key.expert) if p.key is not None else (-1, -1)
            self._rows.append((p.token, layer, expert, p.lane, p.kind, s, max(s, e), p.nbytes, self.mode, p.detail))
            if p.lane == "copy":
                self._copy_free_ms = max(self._copy_free_ms, e)
        self._pending = keep
        self._recycle(done)
        self._rows.append((self._token, -1, -1, "host", "token", self._token_start_ms, end_ms, 0, self.mode, ""))
        return end_ms - self._token_start_ms

    def now_ms(self) -> float:
        return self._host_ms()

    def copy_free_at_ms(self) -> float:
        return max(self._copy_pred_ms, self._copy_free_ms)

    def _recycle(self, done: list) -> None:
        """Return the resolved intervals' events to the pool, except those still referred to: by a pending
        interval (its start, end or token reference), the current token's reference and last mark, and a copy's
        end event while the executor holds its handle (it goes back at `copy_done`)."""
        busy = {id(_event_of(x)) for p in self._pending for x in (p.start, p.end, p.e0)}
        busy.update((id(self._e0), id(self._last_mark)))
        busy.update(self._foreign)
        busy.update(id(p.e0) for p in done)
        seen, held = set(), self._held_copies
        for p in done:
            if p.lane == "copy":
                ev = _event_of(p.end)
                if isinstance(ev, torch.cuda.Event) and id(ev) not in seen and id(ev) not in busy:
                    seen.add(id(ev))           # a batch's copies share one event: pooled once
                    if id(ev) in held:
                        self._resolved_held[id(ev)] = ev
                    else:
                        self._free_events.append(ev)
                continue
            for x in (p.start, p.end):
                x = _event_of(x)
                if isinstance(x, torch.cuda.Event) and id(x) not in busy and id(x) not in seen:
                    seen.add(id(x))
                    self._free_events.append(x)

    def drain_events(self) -> list[TraceEvent]:
        rows, self._rows = self._rows, []
        return events_from_rows(rows)


def sleep_cycles_per_ms(device: torch.device) -> float:
    """How many `torch.cuda._sleep` cycles make one millisecond on this GPU (measured)."""
    torch.cuda.synchronize(device)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 2_000_000
    torch.cuda._sleep(cycles // 10)   # warm-up
    s.record()
    torch.cuda._sleep(cycles)
    e.record()
    e.synchronize()
    return cycles / max(1e-6, s.elapsed_time(e))
