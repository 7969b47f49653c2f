"""The small API every front end (CLI, web app, benchmarks) drives the engine through.

    front end ──► SpiceEngine.start_chat(messages, RunSettings) ──► Generation
                    │                                                  │ iterate: StepStats per token
                    │                                                  │ update_settings(): from next token
                    │                                                  │ cancel(): between tokens
                    ├─ runs (RunRegistry): finished runs ─► export_* (Chrome trace, TensorBoard zip, CSV)
                    └─ tune(engine, RunSettings, Budget, confirm=Confirm) ─► TuneRecord ─► save_tuned / find_tuned
                       (spice-tuned.json beside the model, the file `python -m spice_core tune` writes and
                       `generate --tuned` reads)

Everything that crosses this boundary is an immutable plain value (frozen dataclasses,
tuples, str, numbers), so a UI can keep snapshots without locking and a test can pass a
fake engine that implements the `EngineLike` protocol. This module knows nothing of
Gradio or plotting.

A front end's one door, and only that: it defines the protocols below and re-exports the rest from where it
is defined (settings in `config`, records, metrics, the tuner and its file). The engine, the tuner and what
they import take those from where they live, not from here, so this module may re-export what sits above the
engine (the tuner) without an import cycle (tests/layout/test_import_graph.py checks that there is none, and that
pages import only this module and `spice_core.errors`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Protocol

from spice_core.config import (  # noqa: F401 - re-exported: the settings a front end passes
    BASELINE_POLICIES, COPY_ISSUES, DEFAULT_LORE_RANK, EXACT_POLICIES, LANE_OFFERS, LIVE_FIELDS, MAX_NEW_TOKENS_LIMIT,
    POLICIES, SETTING_RANGES, SPICE_POLICIES, RunSettings, default_shape, own_shape)
from spice_core.records import (  # noqa: F401 - re-exported: the records front ends receive
    EngineInfo, ExpertOutcome, LaneInterval, PrefetchRecord, RunSummary, StepStats)
from spice_core.trace.events import CPU_INT8_OUTCOME, OUTCOMES  # noqa: F401 - re-exported for front ends
from spice_core.trace.metrics import (  # noqa: F401 - re-exported: one definition of every metric
    LATE_OUTCOME, first_divergence, greedy_agreement, identical_prefix_share, late_keys, matching_tokens,
    outcomes_from_events, per_layer_counts, per_layer_table, scope_tokens)
from spice_core.trace.occupancy import (  # noqa: F401 - re-exported: where a decode token's time goes
    STATES as TIME_STATES, TimeSplit, time_split)
from spice_core.tuned import (  # noqa: F401 - re-exported: the tuner's record and its file beside the model
    TUNED_FILE, TUNED_KNOBS, TuneRecord, tuned_path)
from spice_core.tuned import find as find_tuned, load_all as load_tuned, save as save_tuned  # noqa: F401
from spice_core.tuned import stale_reason as stale_tuned  # noqa: F401 - a pick measured with since-rebuilt artifacts
from spice_core.tuner import (  # noqa: F401 - re-exported: the tuner, its quality budget and confirmation sample
    CONFIRM_PROMPTS, DEFAULT_BUDGET_AGREEMENT, DEFAULT_BUDGET_PPL_PCT, DEFAULT_REPLY_TOKENS, Budget, Confirm, Tuner,
    tune)
from spice_core.tuner import (  # noqa: F401 - re-exported: what TuneRecord.verdict says of a measured setting
    EXACT, FAILED, HELD, MISSED, RULED_OUT, UNCONFIRMED, WITHIN)
from spice_core.units import format_bytes  # noqa: F401 - re-exported: how every size a user sees reads


class Generation(Protocol):
    run_id: str

    def __iter__(self) -> Iterator[StepStats]: ...
    def cancel(self) -> None: ...
    def update_settings(self, settings: RunSettings) -> None: ...
    def summary(self) -> RunSummary: ...


class EngineLike(Protocol):
    """What front ends rely on. `spice_core.engine.SpiceEngine` implements it; tests may fake it."""

    def info(self) -> EngineInfo: ...
    def start_chat(self, messages: list[dict], settings: RunSettings, *,
                   min_reply_tokens: int = 1) -> Generation: ...   # ContextError (a PromptError) when less room is left
    def start_prompt(self, prompt: str, settings: RunSettings) -> Generation: ...
    def list_runs(self) -> list[RunSummary]: ...
    def get_summary(self, run_id: str) -> RunSummary: ...
    def get_events(self, run_id: str) -> list: ...        # list[trace.events.TraceEvent]
    def get_steps(self, run_id: str) -> list[StepStats]: ...   # the StepStats the run yielded, in order
    def export_chrome_trace(self, run_id: str, out_dir: Path) -> Path: ...
    def baselines(self, run_id: str) -> dict: ...          # modeled ms/token of resident, on_demand, lru
    def export_chrome_trace_gz(self, run_id: str, out_dir: Path) -> Path: ...
    def export_tensorboard_zip(self, run_id: str, out_dir: Path) -> Path: ...
    def export_csv(self, run_id: str, out_dir: Path) -> Path: ...
