"""The one event schema every timing mode writes.

An event is an interval on a *lane* (a hardware resource that executes one thing at a
time): ``gpu`` (the compute stream), ``copy`` (the host-to-device copy stream), ``cpu0``,
``cpu1``, ... (CPU expert workers) and ``host`` (the Python driver: decisions, sampling).
Instant decisions (a hit, an eviction) are zero-length events on the lane they concern.

Times are milliseconds from the start of the run; ``timing`` says whether a clock
measured them ("measured": CUDA events / wall clock) or the timing model computed them
("modeled"). This module knows nothing of torch, CUDA or the UI.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, make_dataclass

# Lanes that always exist; CPU workers are "cpu0", "cpu1", ...
LANES_FIXED = ("gpu", "copy", "host")

# Per (token, layer, expert) outcome of a routed selection, used by heatmaps and stats.
#   hit           expert was resident in the GPU cache (or resident policy)
#   prefetch_hit  expert was resident because a prefetch brought it in for this use
#   approx        miss approximated by shared expert + LoRE surrogate (lossy)
#   cpu           miss computed exactly on the CPU lane
#   copy          miss copied in on demand (the layer waited for it)
OUTCOMES = ("hit", "prefetch_hit", "approx", "cpu", "copy")
# A lossy miss outcome outside the heatmap's five above (the app does not offer it yet): computed on the CPU
# lane from the int8 weight-only copy (tau_int8 > 0, spice only). Its trace instant is a ``miss`` with this
# detail, its interval a CPU_INT8_RUN; trace.metrics counts it in the miss split.
CPU_INT8_OUTCOME = "cpu_int8"
CPU_INT8_RUN = "cpu_int8_run"

# The detail of a ``prefetch_hit`` instant whose copy arrived after its layer needed it (PrefetchRecord.late): the
# layer stalled for it. Accounts (trace.metrics, the exports) count it apart from the hits, as ``prefetch_late``.
LATE_DETAIL = "late"

EVENT_KINDS = (
    # intervals
    "layer",         # gpu: non-expert work of a layer (attention, norms, router, shared expert)
    "expert",        # gpu: one routed expert's matmuls
    "copy",          # copy: on-demand host->device copy of one expert
    "prefetch",      # copy: speculative host->device copy of one expert
    "cpu_run",       # cpuN: exact expert on the CPU (incl. activation round trip)
    CPU_INT8_RUN,    # cpuN: an expert from its int8 copy on the CPU (lossy; incl. activation round trip)
    "approx",        # gpu: LoRE surrogate for one expert
    "stall",         # gpu: compute stream idle, waiting for a copy or the CPU lane
    "draft",         # gpu: predictor heads
    "token",         # host: one whole decoding step (prefill for token 0)
    # instants (start == end)
    "hit", "prefetch_hit", "miss", "evict", "prefetch_wasted", "cpu_fallback",
)


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One decision or interval. ``layer``/``expert`` are -1 when not applicable."""

    token: int
    layer: int
    expert: int
    lane: str
    kind: str
    start_ms: float
    end_ms: float
    bytes: int = 0             # in the timed shape (modeled: the modeled shape's bytes; measured: native)
    timing: str = "modeled"
    detail: str = ""

    @property
    def dur_ms(self) -> float:
        return self.end_ms - self.start_ms

    def as_dict(self) -> dict:
        return {
            "token": self.token, "layer": self.layer, "expert": self.expert, "lane": self.lane,
            "kind": self.kind, "start_ms": self.start_ms, "end_ms": self.end_ms,
            "bytes": self.bytes, "timing": self.timing, "detail": self.detail,
        }


# A mutable twin of TraceEvent: the same slots in the same order, so an object built as one may become the other
# (``__class__`` assignment is allowed between classes of one layout). Storing into its slots is the cheapest way
# Python has to fill ten fields; the frozen dataclass's __init__ goes through object.__setattr__ for each.
_EventFields = make_dataclass(
    "_EventFields",
    [(f.name, f.type) if f.default is MISSING else (f.name, f.type, f.default) for f in fields(TraceEvent)],
    slots=True, eq=False, repr=False)


def events_from_rows(rows) -> list[TraceEvent]:
    """TraceEvents from plain tuples of all ten fields in order, equal to ``[TraceEvent(*r) for r in rows]``.

    A clock appends such tuples as it goes and builds the events once per token, each filled as a mutable twin
    and then made a TraceEvent: 0.6 µs an event on the reference CPU, where ``TraceEvent(*r)`` takes 3.1 (a
    decode token of the shipped model has 360 events with every expert resident, ~700 with lru at 25%)."""
    twin, cls = _EventFields, TraceEvent
    out = []
    append = out.append
    for r in rows:
        ev = twin(*r)
        ev.__class__ = cls
        append(ev)
    return out
