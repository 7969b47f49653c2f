"""The plain records a run produces: what crossed the engine/front-end boundary per token and per run.

Immutable values only (frozen dataclasses, tuples, str, numbers), so a UI can keep snapshots
without locking. `spice_core.api` re-exports them; the engine, the recorder and the metrics
import them from here (metrics cannot import the API, which re-exports the metrics).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ExpertOutcome:
    """What happened to one routed selection (layer, expert) of one token; see trace.events.OUTCOMES."""

    layer: int
    expert: int
    outcome: str


@dataclass(frozen=True)
class PrefetchRecord:
    """One speculative copy: issued after layer ``issued_at_layer``'s router, needed (or not) at ``layer``."""

    layer: int
    expert: int
    issued_at_layer: int
    issued_ms: float
    arrived_ms: float
    needed_ms: float | None  # None: not used by this token (wasted unless a later token uses it)
    confidence: float

    @property
    def late(self) -> bool:
        """Used, but its copy arrived after its layer needed it: the layer stalled for it (a stall, not a hit)."""
        return self.needed_ms is not None and self.arrived_ms > self.needed_ms + 1e-9


@dataclass(frozen=True)
class LaneInterval:
    """One busy interval of a lane (gpu / copy / cpuN / host), in ms from the run's start."""

    lane: str
    kind: str
    start_ms: float
    end_ms: float
    layer: int = -1
    expert: int = -1


def lane_intervals(events) -> tuple[LaneInterval, ...]:
    """The busy intervals (end after start) among trace events, as LaneIntervals, equal to building each with
    ``LaneInterval(ev.lane, ev.kind, ev.start_ms, ev.end_ms, ev.layer, ev.expert)``: made by filling the new
    objects' ``__dict__`` (the frozen dataclass's ``__init__`` goes through ``object.__setattr__`` per field,
    twice as slow; a decode token makes ~200 of them)."""
    new, cls = object.__new__, LaneInterval
    out = []
    for ev in events:
        start, end = ev.start_ms, ev.end_ms
        if end > start:
            iv = new(cls)
            iv.__dict__.update(lane=ev.lane, kind=ev.kind, start_ms=start, end_ms=end, layer=ev.layer,
                               expert=ev.expert)
            out.append(iv)
    return tuple(out)


@dataclass(frozen=True)
class StepStats:
    """One generated token and what the engine did to produce it (index 0 includes the prefill)."""

    index: int
    token_id: int
    text: str                      # decoded text added by this token
    step_ms: float                 # time of this step (TTFT for index 0), in the run's timing mode
    timing: str                    # "measured" | "modeled"
    hits: int
    misses: int
    bytes_copied: int              # native bytes: what this run really copied to the GPU
    stall_ms: float
    lookahead_depth: float         # mean adaptive lookahead depth over this step's MoE layers
    outcomes: tuple[ExpertOutcome, ...] = ()
    prefetches: tuple[PrefetchRecord, ...] = ()
    intervals: tuple[LaneInterval, ...] = ()
    finished: bool = False
    finish_reason: str = ""        # "eos" | "stop" | "length" | "cancelled" | "error" | ""
    shape_bytes_copied: int = 0    # what the timed shape would copy: the modeled shape's bytes (modeled
                                   # timing), the native bytes (measured); trace events carry these
    lookahead_stops: tuple[str, ...] = ()   # why each MoE layer's lookahead stopped ("confidence", "time",
                                            # "bound", "cache", "cost"; policy/prefetch.py); () without prefetching
    device_ms: float = 0.0         # measured runs: the clock's window of this step (start sync to the last
                                   # segment's end), without the bookkeeping that step_ms includes


@dataclass(frozen=True)
class RunSummary:
    """Aggregates of one finished (or cancelled) run. Times in the run's timing mode."""

    run_id: str
    policy: str
    timing: str
    profile: str
    shape: str
    n_tokens: int
    ttft_ms: float
    tpot_ms_median: float
    tpot_ms_p90: float
    tokens_per_s: float
    hit_rate: float                # served from the GPU in time: resident or prefetched in time (trace.metrics)
    bytes_per_token: float         # native bytes copied per decode token
    stall_ms_per_token: float
    miss_split: dict = field(default_factory=dict)   # outcome -> count, e.g. {"copy": 10, "cpu": 3}
    hit_rate_per_layer: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()    # e.g. "no draft artifacts: fell back to the gate predictor"
    text: str = ""
    finish_reason: str = ""
    shape_bytes_per_token: float = 0.0   # the same in the timed shape's bytes (see StepStats.shape_bytes_copied)
    late_prefetch_rate: float = 0.0      # share of the selections served by a prefetch that came late (not in hit_rate)


@dataclass(frozen=True)
class EngineInfo:
    model_name: str
    family: str
    n_layers: int
    moe_layers: tuple[int, ...]
    n_experts: int
    top_k: int
    expert_bytes: int
    device: str                    # "cuda" | "cpu"
    default_timing: str            # "measured" on CUDA, "modeled" elsewhere
    policies: tuple[str, ...]
    profiles: tuple[str, ...]
    shapes: tuple[str, ...]
    has_draft: bool
    has_lore: bool
    max_context_tokens: int
    lore_ranks: tuple[int, ...] = ()   # LoRE ranks the shipped factors offer (empty without LoRE)
    model_dir: str = ""                # the model's folder (where `tune` saves spice-tuned.json); "": none
    calibration: str = ""              # digest of the calibration its artifacts came from (`calibration_digest`)
