"""What the live panels show, accumulated from StepStats as they stream.

`LiveRun.add(step)` folds one token in; the figure builders read the result. Definitions
follow `spice_core.trace.metrics` so the live numbers equal the run summary once the run
ends: TTFT is the first step; TPOT is the median over decode steps (every step after the
first); hit rate, bytes and stall per token are over decode steps (all steps while only the
first exists; bytes both native and at the timed shape); hit rate = (hit + prefetch_hit) / routed
selections, falling back to the steps' hits / (hits + misses) counters when the engine reports no
per-selection outcomes.

A late prefetch is a stall, not a hit: a ``prefetch_hit`` whose copy (the token's PrefetchRecord for that
layer and expert) arrived after the layer needed it is counted as ``prefetch_late`` here, apart from the hits,
by trace.metrics' definition (`late_keys`), so `hit_rate` and `late_rate` equal the run summary's
``hit_rate`` and ``late_prefetch_rate``.

Only the consumer thread of a run writes a LiveRun, and it is the same thread that renders
it, so no locking is needed. This module knows nothing of Gradio or plotly.
"""
from __future__ import annotations

import statistics
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from spice_core.api import (CPU_INT8_OUTCOME, LATE_OUTCOME, OUTCOMES, EngineInfo, LaneInterval, PrefetchRecord,
                            StepStats, late_keys)

# Heatmap codes: 0 = not selected, then the outcomes in schema order (hit, prefetch_hit, approx, cpu, copy),
# then a prefetched expert that arrived late (the layer waited for it), then a miss run on the CPU lane from the
# experts' int8 copy (lossy; trace.metrics counts it in the miss split and the per-layer accounts, the exports
# in experts_cpu_int8). Appended, so the older codes stay what they were.
NOT_SELECTED = "not selected"
LATE = LATE_OUTCOME
CPU_INT8 = CPU_INT8_OUTCOME
CATEGORIES = (NOT_SELECTED, *OUTCOMES, LATE, CPU_INT8)
CODE = {name: i for i, name in enumerate(CATEGORIES)}
HIT_OUTCOMES = ("hit", "prefetch_hit")

GANTT_TOKENS = 2          # the lane chart shows the last few tokens
PREFETCH_TOKENS = 2       # the prefetch timeline shows the prefetches of the last few tokens


@dataclass
class LiveRun:
    """Running view of one generation. ``layers`` are the MoE layers (heatmap rows)."""

    layers: tuple[int, ...]
    n_experts: int
    timing: str = ""
    steps_ms: list[float] = field(default_factory=list)
    lookahead: list[float] = field(default_factory=list)
    hit_rate_per_step: list[float] = field(default_factory=list)
    n_tokens: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    current: np.ndarray | None = None          # [L, E] category codes of the latest token
    counts: np.ndarray | None = None           # [L, E, len(CATEGORIES) - 1] selections per category, all tokens
    recent_intervals: deque = field(default_factory=lambda: deque(maxlen=GANTT_TOKENS))
    recent_prefetches: deque = field(default_factory=lambda: deque(maxlen=PREFETCH_TOKENS))
    prefetch_copies: int = 0                   # prefetch copies issued, all tokens (the steps' copy intervals)
    prefetches_resolved: int = 0               # of them, used by a layer or evicted unused (PrefetchRecords)
    prefetches_used: int = 0                   # used by a layer, in time or late
    prefetches_late: int = 0
    stop_reasons: Counter = field(default_factory=Counter)   # why the lookahead stopped, per MoE layer planned
    _decode_late: int = 0
    _first_late: int = 0
    _decode_hits: int = 0
    _decode_sel: int = 0
    _first_hits: int = 0
    _first_sel: int = 0
    _decode_bytes: int = 0
    _decode_stall_ms: float = 0.0
    _first_bytes: int = 0
    _decode_shape_bytes: int = 0               # at the timed shape (StepStats.shape_bytes_copied)
    _first_shape_bytes: int = 0
    _first_stall_ms: float = 0.0
    _row: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._row = {layer: i for i, layer in enumerate(self.layers)}
        shape = (len(self.layers), self.n_experts)
        self.current = np.zeros(shape, dtype=np.int8)
        self.counts = np.zeros((*shape, len(CATEGORIES) - 1), dtype=np.int32)

    @classmethod
    def for_engine(cls, info: EngineInfo) -> "LiveRun":
        return cls(layers=tuple(info.moe_layers), n_experts=info.n_experts, timing=info.default_timing)

    @classmethod
    def from_steps(cls, info: EngineInfo, steps) -> "LiveRun":
        """A finished run's view, folded from its stored StepStats by `add`, one by one as they streamed, so
        that every number and array equals the one the chat showed live (a reload brings the panels back)."""
        live = cls.for_engine(info)
        for step in steps:
            live.add(step)
        return live

    # --- folding ------------------------------------------------------------------------
    def add(self, step: StepStats) -> None:
        self.n_tokens += 1
        self.text += step.text
        self.token_ids.append(step.token_id)
        self.timing = step.timing or self.timing
        self.steps_ms.append(step.step_ms)
        self.lookahead.append(step.lookahead_depth)
        self.current[:] = 0
        hits = sel = late_n = 0
        late = late_keys(step.prefetches)
        for o in step.outcomes:
            row = self._row.get(o.layer)
            outcome = LATE if o.outcome == "prefetch_hit" and (o.layer, o.expert) in late else o.outcome
            code = CODE.get(outcome)
            if row is None or code is None or not 0 <= o.expert < self.n_experts:
                continue                      # an outcome for a layer/expert the engine did not announce
            self.current[row, o.expert] = code
            self.counts[row, o.expert, code - 1] += 1
            sel += 1
            hits += outcome in HIT_OUTCOMES
            late_n += outcome == LATE
        if sel == 0:                          # engine without per-selection outcomes: use its counters
            hits, sel = step.hits, step.hits + step.misses
        self.hit_rate_per_step.append(hits / sel if sel else float("nan"))
        if self.n_tokens == 1:
            self._first_hits, self._first_sel, self._first_late = hits, sel, late_n
            self._first_bytes, self._first_stall_ms = step.bytes_copied, step.stall_ms
            self._first_shape_bytes = step.shape_bytes_copied
        else:
            self._decode_hits += hits
            self._decode_late += late_n
            self._decode_sel += sel
            self._decode_bytes += step.bytes_copied
            self._decode_shape_bytes += step.shape_bytes_copied
            self._decode_stall_ms += step.stall_ms
        self.recent_intervals.append((step.index, step.intervals))
        self.recent_prefetches.append((step.index, step.prefetches))
        self.prefetch_copies += sum(iv.kind == "prefetch" for iv in step.intervals)
        self.prefetches_resolved += len(step.prefetches)
        for p in step.prefetches:
            if p.needed_ms is not None:
                self.prefetches_used += 1
                self.prefetches_late += p.late
        self.stop_reasons.update(getattr(step, "lookahead_stops", ()) or ())

    # --- numbers ------------------------------------------------------------------------
    @property
    def prefetches_issued(self) -> int:
        """Prefetch copies issued this reply: counted from the copies themselves, since a prefetch is recorded only
        once used or evicted (a review found 31 of 620 missing: still cached, unused, when the reply ended); the
        records where an engine reports no copy intervals."""
        return max(self.prefetch_copies, self.prefetches_resolved)

    @property
    def prefetches_wasted(self) -> int:
        """Issued prefetches no layer of this reply has used (so far, while it streams)."""
        return self.prefetches_issued - self.prefetches_used

    @property
    def ttft_ms(self) -> float:
        return self.steps_ms[0] if self.steps_ms else 0.0

    @property
    def tpot_ms(self) -> float:
        return statistics.median(self.steps_ms[1:]) if len(self.steps_ms) > 1 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return 1000.0 / self.tpot_ms if self.tpot_ms > 0 else 0.0

    @property
    def hit_rate(self) -> float:
        hits, sel = (self._decode_hits, self._decode_sel) if self.n_tokens > 1 else (self._first_hits, self._first_sel)
        return hits / sel if sel else 0.0

    @property
    def late_rate(self) -> float:
        """Share of the routed selections served by a prefetch that arrived late (the layer stalled for it)."""
        late, sel = (self._decode_late, self._decode_sel) if self.n_tokens > 1 else (self._first_late, self._first_sel)
        return late / sel if sel else 0.0

    @property
    def bytes_per_token(self) -> float:
        if self.n_tokens > 1:
            return self._decode_bytes / (self.n_tokens - 1)
        return float(self._first_bytes) if self.n_tokens else 0.0

    @property
    def shape_bytes_per_token(self) -> float:
        """The same at the shape the times are for (the summary's shape_bytes_per_token); 0 when not reported."""
        if self.n_tokens > 1:
            return self._decode_shape_bytes / (self.n_tokens - 1)
        return float(self._first_shape_bytes) if self.n_tokens else 0.0

    @property
    def stall_ms_per_token(self) -> float:
        if self.n_tokens > 1:
            return self._decode_stall_ms / (self.n_tokens - 1)
        return self._first_stall_ms if self.n_tokens else 0.0

    @property
    def stall_share(self) -> float | None:
        """The decode steps' stalled share of their time (sums over sums, the CSV export's Σstall / Σstep), or None
        before a decode step (the first token's step is the prefill's, which TPOT leaves out too)."""
        decode_ms = sum(self.steps_ms[1:])
        return self._decode_stall_ms / decode_ms if self.n_tokens > 1 and decode_ms > 0 else None

    @property
    def mean_lookahead(self) -> float:
        return sum(self.lookahead) / len(self.lookahead) if self.lookahead else 0.0

    def main_stop_reason(self) -> tuple[str, float]:
        """The most common reason the lookahead stopped and its share ("", 0.0 when the engine gives none)."""
        total = sum(self.stop_reasons.values())
        if not total:
            return "", 0.0
        reason, n = self.stop_reasons.most_common(1)[0]
        return reason, n / total

    def totals_mode(self) -> np.ndarray:
        """[L, E] code of each expert's most frequent outcome so far (0 = never selected)."""
        selected = self.counts.sum(axis=-1) > 0
        return np.where(selected, self.counts.argmax(axis=-1) + 1, 0).astype(np.int8)

    def tokens_used(self) -> np.ndarray:
        """[L, E] how many tokens selected each expert so far (a token counts once, whatever the outcome)."""
        return self.counts.sum(axis=-1)

    def intervals(self) -> list[LaneInterval]:
        return [iv for _, ivs in self.recent_intervals for iv in ivs]

    def prefetches(self) -> list[tuple[int, PrefetchRecord]]:
        return [(index, p) for index, ps in self.recent_prefetches for p in ps]
