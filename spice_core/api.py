"""The small API every front end (CLI, web app, benchmarks) drives the engine through.

    front end ──► SpiceEngine.start_chat(messages, RunSettings) ──► Generation
                    │                                                  │ iterate: StepStats per token
                    │                                                  │ update_settings(): from next token
                    │                                                  │ cancel(): between tokens
                    └─ runs (RunRegistry): finished runs ─► export_* (Chrome trace, TensorBoard zip, CSV)

Everything that crosses this boundary is an immutable plain value (frozen dataclasses,
tuples, str, numbers), so a UI can keep snapshots without locking and a test can pass a
fake engine that implements the `EngineLike` protocol. This module knows nothing of
Gradio or plotting.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol

from spice_core.trace.events import OUTCOMES  # noqa: F401 - re-exported for front ends
from spice_core.errors import ConfigError

# Names a user may pick; the engine refuses anything else with a ConfigError.
BASELINE_POLICIES = ("resident", "on_demand", "lru", "cpu_compute")
SPICE_POLICIES = ("gate_prefetch", "spice_prefetch", "oracle_prefetch", "spice", "spice_no_lore", "spice_no_cpu")
POLICIES = BASELINE_POLICIES + SPICE_POLICIES
EXACT_POLICIES = BASELINE_POLICIES + ("gate_prefetch", "spice_prefetch", "oracle_prefetch", "spice_no_lore")

MAX_NEW_TOKENS_LIMIT = 4096


def _check_range(name: str, value: float, lo: float, hi: float) -> None:
    if not (lo <= value <= hi):
        raise ConfigError(f"{name}={value!r} is out of range: use a value in [{lo}, {hi}]")


DEFAULT_LORE_RANK = 16


@dataclass(frozen=True)
class RunSettings:
    """Per-session, per-generation settings. Validated on construction.

    ``cache_frac`` is the GPU budget for routed experts as a fraction of all routed
    experts' bytes (LoRE factors and draft heads are counted inside it).
    ``profile``/``shape`` only matter in modeled timing: the hardware profile and the
    real-model shape the modeled times stand for.
    """

    policy: str = "spice"
    cache_frac: float = 0.25
    tau_prefetch: float = 0.2
    tau_approx: float = 0.0
    max_lookahead: int = 4
    lore_rank: int = DEFAULT_LORE_RANK   # the default means "up to 16": smaller LoRE factors are used whole
    cpu_lane: bool = True
    profile: str = "rtx4090-pcie4x16"
    shape: str = "deepseek-v2-lite"
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"policy={self.policy!r} is unknown: choose one of {', '.join(POLICIES)}")
        _check_range("cache_frac", self.cache_frac, 0.0, 1.0)
        _check_range("tau_prefetch", self.tau_prefetch, 0.0, 1.0)
        _check_range("tau_approx", self.tau_approx, 0.0, 1.0)
        if not isinstance(self.max_lookahead, int) or not 1 <= self.max_lookahead <= 64:
            raise ConfigError(f"max_lookahead={self.max_lookahead!r} is out of range: use an integer in [1, 64]")
        if not isinstance(self.lore_rank, int) or self.lore_rank < 1:
            raise ConfigError(f"lore_rank={self.lore_rank!r} is out of range: use an integer >= 1")
        if not isinstance(self.max_new_tokens, int) or not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
            raise ConfigError(
                f"max_new_tokens={self.max_new_tokens!r} is out of range: use an integer in [1, {MAX_NEW_TOKENS_LIMIT}]")
        _check_range("temperature", self.temperature, 0.0, 10.0)
        _check_range("top_p", self.top_p, 1e-6, 1.0)

    @property
    def exact(self) -> bool:
        """True when the settings cannot change the output (no approximation)."""
        return self.policy in EXACT_POLICIES or self.tau_approx == 0.0


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


@dataclass(frozen=True)
class LaneInterval:
    """One busy interval of a lane (gpu / copy / cpuN / host), in ms from the run's start."""

    lane: str
    kind: str
    start_ms: float
    end_ms: float
    layer: int = -1
    expert: int = -1


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
    bytes_copied: int
    stall_ms: float
    lookahead_depth: float         # mean adaptive lookahead depth over this step's MoE layers
    outcomes: tuple[ExpertOutcome, ...] = ()
    prefetches: tuple[PrefetchRecord, ...] = ()
    intervals: tuple[LaneInterval, ...] = ()
    finished: bool = False
    finish_reason: str = ""        # "eos" | "stop" | "length" | "cancelled" | ""
    lookahead_stops: tuple[str, ...] = ()   # why each MoE layer's lookahead stopped ("confidence", "time",
                                            # "bound", "cache", "cost"; policy/prefetch.py); () without prefetching


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
    hit_rate: float
    bytes_per_token: float
    stall_ms_per_token: float
    miss_split: dict = field(default_factory=dict)   # outcome -> count, e.g. {"copy": 10, "cpu": 3}
    hit_rate_per_layer: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()    # e.g. "no draft artifacts: fell back to the gate predictor"
    text: str = ""
    finish_reason: str = ""


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


class Generation(Protocol):
    run_id: str

    def __iter__(self) -> Iterator[StepStats]: ...
    def cancel(self) -> None: ...
    def update_settings(self, settings: RunSettings) -> None: ...
    def summary(self) -> RunSummary: ...


class EngineLike(Protocol):
    """What front ends rely on. `spice_core.engine.SpiceEngine` implements it; tests may fake it."""

    def info(self) -> EngineInfo: ...
    def start_chat(self, messages: list[dict], settings: RunSettings) -> Generation: ...
    def start_prompt(self, prompt: str, settings: RunSettings) -> Generation: ...
    def list_runs(self) -> list[RunSummary]: ...
    def get_summary(self, run_id: str) -> RunSummary: ...
    def get_events(self, run_id: str) -> list: ...        # list[trace.events.TraceEvent]
    def export_chrome_trace(self, run_id: str, out_dir: Path) -> Path: ...
    def export_tensorboard_zip(self, run_id: str, out_dir: Path) -> Path: ...
    def export_csv(self, run_id: str, out_dir: Path) -> Path: ...
