"""What every page shares: the app context, the engine's concurrency group, settings parsing,
exports into per-run temporary folders, and components whose range checks we do ourselves.

Pages import only `spice_core.api` / `spice_core.errors` from the engine; the engine object
comes in through `AppContext`, so tests can pass a fake.
"""
from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path

import gradio as gr
from gradio.components.plot import PlotData

from spice_core.api import EngineInfo, EngineLike, RunSettings
from spice_core.errors import ConfigError, SpiceError
from pages.runner import EngineRunner

log = logging.getLogger(__name__)

# Every event that drives the engine joins this concurrency group (limit 1): the engine runs
# one generation at a time, whichever page asks.
ENGINE_GROUP = "engine"

POLICY_LABELS = {
    "resident": "resident: every expert on the GPU (reference)",
    "on_demand": "on demand: copy each missing expert",
    "lru": "LRU cache",
    "cpu_compute": "CPU compute for misses",
    "gate_prefetch": "gate prefetch (router of next layer)",
    "spice_prefetch": "SPICE prefetch only",
    "oracle_prefetch": "oracle prefetch (upper bound)",
    "spice": "SPICE: prefetch + LoRE + CPU lane",
    "spice_no_lore": "SPICE without LoRE (exact)",
    "spice_no_cpu": "SPICE without CPU lane",
}
LORE_RANKS = (4, 8, 16, 32, 64)
EXPORT_KINDS = ("chrome", "tensorboard", "csv")


def policy_choices(info: EngineInfo) -> list[tuple[str, str]]:
    return [(POLICY_LABELS.get(p, p), p) for p in info.policies]


def as_plot(figure: dict) -> PlotData:
    """A figure dict for gr.Plot, serialised once here rather than validated by plotly."""
    return PlotData(type="plotly", plot=json.dumps(figure, separators=(",", ":"), allow_nan=False))


# --- components that let out-of-range API values reach our own validation --------------------
class FreeSlider(gr.Slider):
    """A slider that passes any number through, so `RunSettings` names the field and the range.

    Gradio's own check raises before the handler runs and shows a toast; ours puts the message
    in the chat, next to what the user was doing.
    """

    is_template = True   # render with Gradio's slider

    def preprocess(self, payload):
        return payload


class FreeDropdown(gr.Dropdown):
    """A dropdown that passes unknown values through for `RunSettings` to refuse by name."""

    is_template = True

    def preprocess(self, payload):
        return payload


# --- settings --------------------------------------------------------------------------------
SETTING_FIELDS = ("policy", "cache_frac", "tau_prefetch", "tau_approx", "max_lookahead", "lore_rank",
                  "cpu_lane", "profile", "shape", "max_new_tokens", "temperature")
_INT_FIELDS = {"max_lookahead", "lore_rank", "max_new_tokens"}
_FLOAT_FIELDS = {"cache_frac", "tau_prefetch", "tau_approx", "temperature"}


def settings_from_values(info: EngineInfo, values: dict) -> RunSettings:
    """RunSettings from control values (UI or API); raises ConfigError naming the field."""
    kw = {}
    for name in SETTING_FIELDS:
        value = values.get(name)
        if value is None:
            raise ConfigError(f"{name} is missing: set a value")
        if name in _INT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ConfigError(f"{name}={value!r} is not a number: use an integer")
            try:
                number = float(value)
            except ValueError:
                raise ConfigError(f"{name}={value!r} is not a number: use an integer") from None
            value = int(number) if number.is_integer() else number
        elif name in _FLOAT_FIELDS:
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{name}={value!r} is not a number") from None
            if value != value:
                raise ConfigError(f"{name} is NaN: use a number")
        elif name == "cpu_lane":
            if not isinstance(value, bool):
                raise ConfigError(f"cpu_lane={value!r} must be true or false")
        elif not isinstance(value, str):
            raise ConfigError(f"{name}={value!r} must be one of the listed names")
        kw[name] = value
    if kw["profile"] not in info.profiles:
        raise ConfigError(f"profile={kw['profile']!r} is unknown: choose one of {', '.join(info.profiles)}")
    if kw["shape"] not in info.shapes:
        raise ConfigError(f"shape={kw['shape']!r} is unknown: choose one of {', '.join(info.shapes)}")
    if kw["policy"] not in info.policies:
        raise ConfigError(f"policy={kw['policy']!r} is unknown: choose one of {', '.join(info.policies)}")
    return RunSettings(**kw)


def default_settings(info: EngineInfo) -> RunSettings:
    """RunSettings defaults, adjusted to what this engine offers."""
    base = RunSettings()
    policy = base.policy if base.policy in info.policies else info.policies[0]
    profile = base.profile if base.profile in info.profiles else info.profiles[0]
    shape = base.shape if base.shape in info.shapes else info.shapes[0]
    return RunSettings(**{f.name: getattr(base, f.name) for f in fields(base)}
                       | {"policy": policy, "profile": profile, "shape": shape, "max_new_tokens": 96})


# --- exports ---------------------------------------------------------------------------------
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


class ExportStore:
    """Writes a run's exports into its own temporary folder, once, and hands back the paths.

    The folder name is derived from the run id (never from user text), under one temporary root
    that is removed when the app closes.
    """

    def __init__(self, engine: EngineLike, root: Path | None = None) -> None:
        self._engine = engine
        self._root = Path(root) if root else Path(tempfile.mkdtemp(prefix="spice-exports-"))
        self._root.mkdir(parents=True, exist_ok=True)
        self._paths: dict[tuple[str, str], Path] = {}
        self._lock = threading.Lock()

    @property
    def root(self) -> Path:
        return self._root

    def folder(self, run_id: str) -> Path:
        name = _SAFE.sub("_", run_id).strip("._") or "run"
        path = self._root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def get(self, run_id: str, kind: str) -> Path:
        """Path of one export ("chrome" | "tensorboard" | "csv"); raises SpiceError if the engine refuses."""
        if kind not in EXPORT_KINDS:
            raise ConfigError(f"export kind {kind!r} is unknown: use one of {', '.join(EXPORT_KINDS)}")
        with self._lock:
            cached = self._paths.get((run_id, kind))
            if cached is not None and cached.exists():
                return cached
            out = self.folder(run_id)
            method = {"chrome": "export_chrome_trace", "tensorboard": "export_tensorboard_zip", "csv": "export_csv"}
            path = Path(getattr(self._engine, method[kind])(run_id, out))
            self._paths[(run_id, kind)] = path
            return path

    def cleanup(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)


# --- the context every page gets -------------------------------------------------------------
@dataclass
class AppContext:
    engine: EngineLike
    info: EngineInfo
    runner: EngineRunner
    exports: ExportStore
    max_message_chars: int
    run_labels: dict[str, str] = field(default_factory=dict)   # run id -> what produced it (for pickers)
    last_sweep: list[dict] = field(default_factory=list)

    @classmethod
    def create(cls, engine: EngineLike, *, orphan_after_s: float = 5.0, export_root: Path | None = None,
               max_message_chars: int | None = None) -> "AppContext":
        info = engine.info()
        limit = max_message_chars or max(500, min(16_000, 4 * info.max_context_tokens))
        return cls(engine=engine, info=info, runner=EngineRunner(orphan_after_s=orphan_after_s),
                   exports=ExportStore(engine, export_root), max_message_chars=limit)

    def label_run(self, run_id: str, label: str, keep: int = 512) -> None:
        """Remember what started a run (the engine keeps only recent runs; so do we)."""
        self.run_labels[run_id] = label
        while len(self.run_labels) > keep:
            self.run_labels.pop(next(iter(self.run_labels)))

    def describe_timing(self, settings: RunSettings) -> str:
        """One line for banners: which clock produced the numbers, and what modeled ones stand for."""
        if self.info.default_timing == "measured":
            return (f"**Timing: measured on {self.info.device.upper()}** (CUDA events); the hardware profile and "
                    f"shape only matter for modeled timing.")
        return (f"**Timing: modeled on {self.info.device.upper()}**: times stand for a **{settings.shape}**-shaped "
                f"model on **{settings.profile}**; the tokens come from the real (small) model.")


def fmt_bytes(n: float) -> str:
    """1536 -> '1.5 kB', 17.3e6 -> '17.3 MB' (decimal units, as bandwidths are quoted)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def spice_error_text(exc: BaseException) -> str:
    """The one line shown to a user for an error they can fix."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
