"""Where a decode token's wall time goes: every instant of a token classified by what the decode was doing or waiting
on then.

    trace events ──► intervals per cause: the GPU's work; the decode waiting on a copy (a GPU stall for a copy);
                     waiting on the CPU lane (a GPU stall for a lane job, or the host waiting to join the lane's jobs,
                     the GPU idle meanwhile: the fast path)
                 ──► each decode token's window (its ``token`` interval on the host lane) cut into pieces by cause
                     ──► TimeSplit: ms per token in each of the exclusive STATES, and the link's and the lane's busy
                     time (in the background or not; the link's also where it hid under GPU work)

The STATES, in the order a reader asks "what is the GPU waiting for?":
- ``gpu``: the GPU computes (whatever else runs beside it);
- ``link``: the decode waits for a copy (link-bound);
- ``link + lane``: it waits for a copy and for the CPU lane at once;
- ``lane``: it waits for the CPU lane (lane-bound);
- ``host``: the GPU idles and nothing is waited for: the host is deciding, issuing, recording or launching
  (host-bound), while copies and lane jobs may run in the background.

A busy link is not a wait: a prefetch running while the host plans does not make the token link-bound; the stalls
say what held the decode. The pieces add up to the token's wall time exactly (the windows are the tokens' own
intervals), for measured and modeled runs alike: one schema. Token 0 (its prefill) is left out, as TPOT leaves it
out (trace.metrics). Pure: knows nothing of CUDA, policies or how it is displayed.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Iterable, Sequence

from spice_core.trace.events import CPU_INT8_RUN, TraceEvent

GPU_WORK = ("layer", "expert", "approx", "draft")
COPY_WORK = ("copy", "prefetch")
LANE_WORK = ("cpu_run", CPU_INT8_RUN)
LANE_WAIT = "waits for cpu"          # a stall's detail begins so when it waits for the CPU lane (both clocks)
STATES = ("gpu", "link", "link + lane", "lane", "host")


@dataclass(frozen=True)
class TimeSplit:
    """Means over the decode tokens a trace holds: ``ms`` per state (STATES) per token, adding up to ``wall_ms``."""

    tokens: int
    wall_ms: float
    ms: dict
    link_busy_ms: float          # the copy stream's busy time per token, waited for or not
    link_hidden_ms: float        # of it, under GPU work
    lane_busy_ms: float          # the CPU lane's busy time per token (any of its workers), waited for or not

    def share(self, state: str) -> float:
        return self.ms[state] / self.wall_ms if self.wall_ms > 0 else 0.0

    def bound(self) -> str:
        """The state that takes most of a token, in words (empty for a trace without decode tokens)."""
        if not self.tokens or self.wall_ms <= 0:
            return ""
        top = max(STATES, key=lambda s: self.ms[s])
        return {"gpu": "GPU-bound", "link": "link-bound", "link + lane": "link- and lane-bound",
                "lane": "lane-bound", "host": "host-bound"}[top]


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _causes(events: Sequence[TraceEvent]) -> tuple[list, list, list]:
    """The GPU's work, the waits for a copy and the waits for the CPU lane, each as sorted, disjoint intervals."""
    gpu, link, lane = [], [], []
    for e in events:
        if e.lane == "gpu" and e.kind in GPU_WORK:
            gpu.append((e.start_ms, e.end_ms))
        elif e.kind == "stall" and e.lane in ("gpu", "host"):
            if e.detail.startswith(LANE_WAIT):
                lane.append((e.start_ms, e.end_ms))
            elif e.lane == "gpu":
                link.append((e.start_ms, e.end_ms))
    return _union(gpu), _union(link), _union(lane)


def _background(events: Sequence[TraceEvent]) -> tuple[list, list]:
    """When the copy stream copied and when any CPU lane worker computed, waited for or not."""
    link = _union((e.start_ms, e.end_ms) for e in events if e.lane == "copy" and e.kind in COPY_WORK)
    lane = _union((e.start_ms, e.end_ms) for e in events if e.lane.startswith("cpu") and e.kind in LANE_WORK)
    return link, lane


def _state(g: bool, c: bool, l: bool) -> str:    # noqa: E741 - g: GPU work, c: a copy waited for, l: the lane
    if g:
        return "gpu"
    if c:
        return "link + lane" if l else "link"
    return "lane" if l else "host"


def _split_window(lo: float, hi: float, busy: list) -> dict:
    """ms in each state within [lo, hi]: a sweep over the edges of the three causes' intervals, each already cut to
    the window (``busy``: [GPU work, waits for a copy, waits for the lane], each sorted and disjoint)."""
    edges = {lo, hi}
    for inside in busy:
        for s, e in inside:
            edges.update((s, e))
    cuts = sorted(edges)
    out = dict.fromkeys(STATES, 0.0)
    idx = [0, 0, 0]
    for a, b in zip(cuts, cuts[1:]):
        mid = (a + b) / 2
        flags = []
        for r in range(3):
            ivs = busy[r]
            while idx[r] < len(ivs) and ivs[idx[r]][1] <= mid:
                idx[r] += 1
            flags.append(idx[r] < len(ivs) and ivs[idx[r]][0] <= mid)
        out[_state(*flags)] += b - a
    return out


def _overlap(a, b) -> float:
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            total += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _clip(ivs, ends: list, lo: float, hi: float) -> list:
    """The sorted, disjoint intervals ``ivs`` (``ends``: their ends) cut to [lo, hi]."""
    out = []
    for i in range(bisect_right(ends, lo), len(ivs)):
        s, e = ivs[i]
        if s >= hi:
            break
        out.append((max(s, lo), min(e, hi)))
    return out


def time_split(events: Sequence[TraceEvent]) -> TimeSplit:
    """The decode tokens' time split (see the module docstring); zeros for a trace without decode tokens."""
    windows = sorted((e.start_ms, e.end_ms) for e in events if e.kind == "token" and e.lane == "host"
                     and e.token >= 1 and e.end_ms > e.start_ms)
    causes = [(ivs, [e for _, e in ivs]) for ivs in _causes(events)]
    link_bg, lane_bg = ((ivs, [e for _, e in ivs]) for ivs in _background(events))
    totals = dict.fromkeys(STATES, 0.0)
    wall = link_busy = link_hidden = lane_busy = 0.0
    for lo, hi in windows:
        cut = [_clip(ivs, ends, lo, hi) for ivs, ends in causes]
        for k, v in _split_window(lo, hi, cut).items():
            totals[k] += v
        wall += hi - lo
        copying, computing = _clip(*link_bg, lo, hi), _clip(*lane_bg, lo, hi)
        link_busy += sum(e - s for s, e in copying)
        link_hidden += _overlap(cut[0], copying)
        lane_busy += sum(e - s for s, e in computing)
    n = len(windows)
    if not n:
        return TimeSplit(0, 0.0, dict.fromkeys(STATES, 0.0), 0.0, 0.0, 0.0)
    return TimeSplit(n, wall / n, {k: v / n for k, v in totals.items()}, link_busy / n, link_hidden / n,
                     lane_busy / n)
