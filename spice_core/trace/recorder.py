"""Recorder: the one channel through which a run says what happened.

    runtime ─► recorder.outcome / copied / prefetch / lookahead / fallback ─┐
    executor ─► clock intervals (gpu, copy, cpuN, host) ────────────────────┴─► TraceEvents of the token
                                                          └─► TokenRecord ─► StepStats (engine.py)

Every routed selection's outcome is written once, here, as both an ``ExpertOutcome`` (what
`StepStats.outcomes` carries) and an instant trace event on the gpu lane (``hit``,
``prefetch_hit`` or ``miss`` with the miss's outcome in ``detail``), in the same call, so the
summary, the trace explorer's per-layer table, the Chrome trace's counters and the CSV count
the same things (`trace.metrics` defines how). At the token's end, a ``prefetch_hit`` instant
whose prefetch came late (its PrefetchRecord is ``late``) gets ``LATE_DETAIL``, so that a trace
alone tells a late prefetch from a hit. Intervals come from the clock, which appends them to the
same token's events.

Knows nothing of policies, devices or the UI.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from spice_core.records import ExpertOutcome, PrefetchRecord
from spice_core.trace.events import LATE_DETAIL
from spice_core.trace.metrics import late_keys
from spice_core.types import ExpertKey

HIT_INSTANTS = ("hit", "prefetch_hit")
# ExpertOutcomes and ExpertKeys are immutable, so one pair per (layer, expert, outcome) serves every token of every
# run (a model has layers x experts x 5 of them at most); making them per selection was a tenth of the recording.
_OUTCOMES: dict[tuple[int, int, str], tuple[ExpertOutcome, ExpertKey]] = {}


def instant_kind(outcome: str) -> str:
    """The trace instant of an outcome: hits keep their name, every miss is ``miss`` (detail = outcome)."""
    return outcome if outcome in HIT_INSTANTS else "miss"


@dataclass
class TokenRecord:
    """What one token did, accumulated by the recorder."""

    hits: int = 0
    misses: int = 0
    bytes_copied: int = 0          # native bytes
    shape_bytes_copied: int = 0    # the timed shape's bytes (trace events carry these)
    outcomes: list = field(default_factory=list)
    prefetches: list = field(default_factory=list)
    depths: list = field(default_factory=list)
    stop_reasons: list = field(default_factory=list)
    h_mins: list = field(default_factory=list)
    cpu_fallbacks: int = 0
    events: list = field(default_factory=list)


class Recorder:
    """Per-run: the current token's record plus run totals. ``clock``: the run's timeline."""

    def __init__(self, clock, expert_bytes: int, shape_expert_bytes: int | None = None) -> None:
        """``expert_bytes``: one expert as loaded (native); ``shape_expert_bytes``: one expert of the shape the
        clock times (modeled timing of another model's shape), default the native bytes."""
        self.clock = clock
        self.expert_bytes = expert_bytes
        self.shape_expert_bytes = expert_bytes if shape_expert_bytes is None else shape_expert_bytes
        self.token = TokenRecord()
        self.totals = {"wasted_prefetch_bytes": 0, "prefetch_bytes": 0, "cpu_fallbacks": 0}

    def begin_token(self) -> None:
        self.token = TokenRecord()

    # -- what the planner decided and the executor carried out
    def layer_counts(self, hits: int, misses: int) -> None:
        self.token.hits += hits
        self.token.misses += misses

    def outcome(self, layer: int, expert: int, outcome: str) -> None:
        self.token.outcomes.append(ExpertOutcome(layer, expert, outcome))
        kind = instant_kind(outcome)
        self.clock.mark(kind, ExpertKey(layer, expert), detail="" if kind != "miss" else outcome)

    def layer_outcomes(self, layer: int, experts, outcomes: dict) -> None:
        """`outcome` for each of a layer's ``experts`` in order (``outcomes``: expert -> outcome), in one call."""
        out, mark, interned = self.token.outcomes, self.clock.mark, _OUTCOMES
        for e in experts:
            o = outcomes[e]
            made = interned.get((layer, e, o))
            if made is None:
                made = interned[(layer, e, o)] = (ExpertOutcome(layer, e, o), ExpertKey(layer, e))
            out.append(made[0])
            if o in HIT_INSTANTS:
                mark(o, made[1])
            else:
                mark("miss", made[1], detail=o)

    def layer_hits(self, layer: int, experts) -> None:
        """`layer_counts` and `layer_outcomes` of a layer whose ``experts`` (ascending) were all plain hits."""
        self.token.hits += len(experts)
        out, mark, interned = self.token.outcomes, self.clock.mark, _OUTCOMES
        for e in experts:
            made = interned.get((layer, e, "hit"))
            if made is None:
                made = interned[(layer, e, "hit")] = (ExpertOutcome(layer, e, "hit"), ExpertKey(layer, e))
            out.append(made[0])
            mark("hit", made[1])

    def copied(self, kind: str) -> None:
        self.token.bytes_copied += self.expert_bytes
        self.token.shape_bytes_copied += self.shape_expert_bytes
        if kind == "prefetch":
            self.totals["prefetch_bytes"] += self.expert_bytes

    def evicted(self, key: ExpertKey) -> None:
        self.clock.mark("evict", key, self.shape_expert_bytes, lane="copy")

    def wasted(self, key: ExpertKey, inflight) -> None:
        """A prefetched expert left the cache unused; ``inflight`` its in-flight entry, if any."""
        self.totals["wasted_prefetch_bytes"] += self.expert_bytes
        if inflight is not None:
            self.token.prefetches.append(PrefetchRecord(key.layer, key.expert, inflight.issued_at_layer,
                                                        inflight.issued_ms, inflight.arrival_ms, None,
                                                        inflight.confidence))
        self.clock.mark("prefetch_wasted", key, self.shape_expert_bytes, lane="copy")

    def prefetch_used(self, key: ExpertKey, inflight, needed_ms: float) -> None:
        self.token.prefetches.append(PrefetchRecord(key.layer, key.expert, inflight.issued_at_layer, inflight.issued_ms,
                                                    inflight.arrival_ms, needed_ms, inflight.confidence))

    def lookahead(self, depth: int, stop_reason: str, h_min: float, skipped_approx: int = 0) -> None:
        """``skipped_approx``: predicted experts the plan did not copy because their misses would be approximated."""
        if skipped_approx:
            self.totals["prefetch_skipped_approx"] = self.totals.get("prefetch_skipped_approx", 0) + skipped_approx
        self.token.depths.append(depth)
        self.token.stop_reasons.append(stop_reason)
        self.token.h_mins.append(h_min)

    def cpu_fallback(self, key: ExpertKey, err: BaseException) -> None:
        self.token.cpu_fallbacks += 1
        self.totals["cpu_fallbacks"] += 1
        self.clock.mark("cpu_fallback", key, detail=f"{type(err).__name__}: {err}")

    # -- the end of a token
    def end_token(self) -> TokenRecord:
        """The token's record, with every event the clock resolved for it (intervals and instants)."""
        rec = self.token
        events = self.clock.drain_events()
        late = late_keys(rec.prefetches)
        if late:
            events = [replace(ev, detail=LATE_DETAIL) if ev.kind == "prefetch_hit" and (ev.layer, ev.expert) in late
                      else ev for ev in events]
        rec.events = events
        return rec
