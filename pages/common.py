"""What every page shares: the app context, the engine's concurrency group, settings parsing,
exports into per-run temporary folders, and components whose range checks we do ourselves.

Pages import only `spice_core.api` / `spice_core.errors` from the engine; the engine object
comes in through `AppContext`, so tests can pass a fake.
"""
from __future__ import annotations

import json
import logging
import re
import secrets
import shutil
import tempfile
import threading
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import gradio as gr
from gradio.components.chatbot import ChatbotDataMessages
from gradio.components.plot import PlotData
from pydantic import ValidationError, model_validator

from spice_core.api import (DEFAULT_LORE_RANK, DEFAULT_REPLY_TOKENS, EngineInfo, EngineLike, RunSettings,
                            default_shape, format_bytes, own_shape)
from spice_core.errors import ConfigError, SpiceError
from pages.limits import SLIDER_RANGES, Limits, number_as_typed, quoted, slider_ranges, strict_bool  # noqa: F401 - SLIDER_RANGES: re-exported
from pages.models import SwitchBook
from pages.owners import RunBook, valid_run_id
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
EXPORT_KINDS = ("chrome", "chrome_gz", "tensorboard", "csv")


def policy_choices(info: EngineInfo) -> list[tuple[str, str]]:
    return [(POLICY_LABELS.get(p, p), p) for p in info.policies]


def shape_choices(info: EngineInfo) -> list[tuple[str, str]]:
    """(label, shape) per shape, saying whose routing its modeled times come from: the model's own shape (the
    real model it is a miniature of) times that real model's sizes and layout; any other shape only puts its
    sizes on this model's routing, so it is labelled "sizes only" rather than hidden (it is the only way to see,
    say, Qwen2-sized copies where no Qwen2 miniature is installed). Labels stay short enough to be read whole
    in the menu, in the chat's side bar and on a phone; `shape_info` says the rest under the menu."""
    own = own_shape(info)
    out = []
    for shape in info.shapes:
        if shape == "native":
            label = "native · own sizes"
        elif shape == own:
            label = f"{shape} · full model"
        else:
            label = f"{shape} · sizes only"
        out.append((label, shape))
    return out


def shape_info(info: EngineInfo) -> str:
    """The line under the shape menu: what its labels mean for this model."""
    sizes_only = f"“sizes only”: that model's sizes on {info.model_name}'s routing"
    own = own_shape(info)
    if own not in info.shapes:
        return sizes_only
    return f"“full model”: {own}, which {info.model_name} is a miniature of, routing and all; {sizes_only}"


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


class FreeNumber(gr.Number):
    """A number box that passes any value through, for the handler to bring into range and say so
    (Gradio's own minimum/maximum check raises before the handler runs and blanks its outputs)."""

    is_template = True   # render with Gradio's number box

    def preprocess(self, payload):
        return payload


class _Messages(ChatbotDataMessages):
    """Chat history as Gradio takes it, where a message's content may also be a plain string (API clients
    write it so) or one part: both become the list of parts the browser sends."""

    @classmethod
    def model_validate(cls, obj, *args, **kwargs):
        # Gradio validates the history before any handler runs; pydantic's error about a history that is not
        # a list reached the client as a blank {"error": null}. A gr.Error raised here (outside pydantic, which
        # would wrap it) reaches the client with its text.
        if obj is not None and not isinstance(obj, (list, cls)) and not (isinstance(obj, dict) and "root" in obj):
            raise gr.Error(f"History: a {type(obj).__name__} is not a list of messages: {_MESSAGE_SHAPE}",
                           print_exception=False)
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            # A list whose messages pydantic refuses: the same blank error and a log traceback quoting the visitor's
            # values. Say which message and which of its fields, quoting nothing.
            raise gr.Error(_history_problem(exc), print_exception=False) from None

    @model_validator(mode="before")
    @classmethod
    def _content_as_parts(cls, data):
        if not isinstance(data, list):
            return data
        out = []
        for m in data:
            if isinstance(m, (list, tuple)) and len(m) == 2:        # the older [user, assistant] pairs
                out += [{"role": r, "content": _as_parts(c)} for r, c in zip(("user", "assistant"), m) if c]
            elif isinstance(m, dict) and isinstance(m.get("role"), str):
                out.append({**m, "content": _as_parts(m.get("content"))})
        return out             # anything else is not a message: left out, as the chat leaves it out


_MESSAGE_SHAPE = ('send a list of {"role": "user" or "assistant", "content": text or a list of '
                  '{"type": "text", "text": ...} parts} objects, or [] for none')


_MESSAGE_FIELDS = ("role", "content", "metadata", "options")


def _history_problem(exc: ValidationError) -> str:
    """What a refused history's first error says: the message's number and field (never its value)."""
    loc = next(iter(exc.errors()), {}).get("loc", ())
    at = f"message {loc[0] + 1}" if loc and isinstance(loc[0], int) else "a message"
    part = f"'s {loc[1]}" if len(loc) > 1 and loc[1] in _MESSAGE_FIELDS else ""     # ours, never a key it sent
    return f"History: {at}{part} is not something this chat takes: {_MESSAGE_SHAPE}"


def _as_parts(content) -> list:
    if content is None:
        return []
    if isinstance(content, (str, int, float)):
        return [{"type": "text", "text": str(content)}]
    if isinstance(content, dict):
        return [content]
    if isinstance(content, (list, tuple)):
        return [{"type": "text", "text": c} if isinstance(c, str) else c for c in content]
    return []


class ChatHistory(gr.Chatbot):
    """Gradio's chatbot, whose API also takes a history with plain-string contents."""

    is_template = True   # render with Gradio's chatbot
    data_model = _Messages


class FreeDropdown(gr.Dropdown):
    """A dropdown that passes unknown values through for `RunSettings` to refuse by name."""

    is_template = True

    def preprocess(self, payload):
        return payload


class FreeCheckboxGroup(gr.CheckboxGroup):
    """Checkboxes that pass unknown values through for the page to refuse by name (Gradio's own check answered an
    API call with "Value: ... is not in the list of choices" and logged a traceback holding the value)."""

    is_template = True

    def preprocess(self, payload):
        return payload


# --- page loads ------------------------------------------------------------------------------
def quiet_page_loads(blocks: gr.Blocks) -> list[int]:
    """Every event a page load sets off shows and says no progress; returns their ids.

    Gradio's status tracker reads every event's progress out to screen readers (a live region: "Loading", then
    "Complete"), except an event whose progress is hidden. So every load of every page said both, for work nobody
    asked for. What a load sets off: its listeners, what they chain (``.then``, ``.success``), and the listeners of
    a change of what they fill, in turn. A listener of the latter kind also runs when the visitor changes that
    component, and is silent then too, as Gradio has one progress setting per listener: so a picker whose view
    should show its progress (the trace explorer's runs, About's benchmark) shows it from an ``.input`` listener
    (the visitor's change alone) and the load's from a chained one. What a visitor starts otherwise (a reply, a
    sweep, a tune) keeps its progress, shown and said."""
    fns = list(blocks.fns.values())
    quiet = {fn._id for fn in fns if any(event == "load" for _, event in fn.targets)}
    while True:
        filled = {block._id for fn in fns if fn._id in quiet for block in fn.outputs}
        more = {fn._id for fn in fns if fn._id not in quiet and (
            fn.trigger_after in quiet or any(event == "change" and target in filled for target, event in fn.targets))}
        if not more:
            break
        quiet |= more
    for fn in fns:
        if fn._id in quiet:
            fn.show_progress = "hidden"
    return sorted(quiet)


# --- settings --------------------------------------------------------------------------------
SETTING_FIELDS = ("policy", "cache_frac", "tau_prefetch", "tau_approx", "max_lookahead", "lore_rank",
                  "cpu_lane", "profile", "shape", "max_new_tokens", "temperature")
_INT_FIELDS = {"max_lookahead", "lore_rank", "max_new_tokens"}
_FLOAT_FIELDS = {"cache_frac", "tau_prefetch", "tau_approx", "temperature"}


FIELD_CONTROLS = {"policy": "Policy", "cache_frac": "GPU cache size", "tau_prefetch": "τ_prefetch",
                  "tau_approx": "τ_approx", "max_lookahead": "Max lookahead", "lore_rank": "LoRE rank",
                  "cpu_lane": "CPU lane", "profile": "Hardware profile", "shape": "Model shape",
                  "max_new_tokens": "Max new tokens", "temperature": "Temperature"}


def settings_from_values(info: EngineInfo, values: dict, limits: Limits | None = None) -> RunSettings:
    """RunSettings from control values (UI or API) within the UI's ranges (the sliders', `slider_ranges`, and the
    app's cap on new tokens); ConfigError naming the control and the range it takes."""
    ranges = slider_ranges(info, limits)
    try:
        return _settings_from_values(info, values, ranges)
    except ConfigError as exc:
        text = str(exc)
        field_name = next((f for f in SETTING_FIELDS if text.startswith(f)), "")
        raise ConfigError(f"{FIELD_CONTROLS[field_name]}: {text}" if field_name else text) from None


def _settings_from_values(info: EngineInfo, values: dict, ranges: dict) -> RunSettings:
    kw = {}
    for name in SETTING_FIELDS:
        value = values.get(name)
        if value is None:
            raise ConfigError(f"{name} is missing: set a value")
        low, high, _step = ranges.get(name, (None, None, None))
        if name in _INT_FIELDS:
            span = f" in [{low}, {high}]" if low is not None else ""
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ConfigError(f"{name}={quoted(value)} is not a number: use an integer{span}")
            try:
                number = float(value)
            except OverflowError:       # an integer like 10**400 sent by an API client
                raise ConfigError(f"{name}={number_as_typed(value)} is out of range: use an integer{span}") from None
            except ValueError:
                raise ConfigError(f"{name}={str(value)[:20]!r} is not a number: use an integer{span}") from None
            if number != number or abs(number) == float("inf"):
                raise ConfigError(f"{name}={number_as_typed(value)} is out of range: use an integer{span}")
            if not number.is_integer():
                raise ConfigError(f"{name}={number:g} is not a whole number: use an integer{span}")
            typed, value = value, int(number)
            if low is not None and not low <= value <= high:
                shown = value if isinstance(typed, float) else number_as_typed(typed)     # 40.0 from a slider: 40
                raise ConfigError(f"{name}={shown} is out of range: use an integer{span}")
        elif name in _FLOAT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ConfigError(f"{name}={quoted(value)} is not a number")
            try:
                value = float(value)
            except OverflowError:       # an integer like 10**400 sent by an API client
                span = f": use a value in [{low:g}, {high:g}]" if low is not None else ""
                raise ConfigError(f"{name}={number_as_typed(value)} is out of range{span}") from None
            except ValueError:
                raise ConfigError(f"{name}={quoted(value)} is not a number") from None
            if value != value:
                raise ConfigError(f"{name} is NaN: use a number")
            if low is not None and not low <= value <= high:
                raise ConfigError(f"{name}={value!r} is out of range: use a value in [{low:g}, {high:g}]")
        elif name == "cpu_lane":
            value = strict_bool(value, "cpu_lane")      # "true"/"false" from an API client, as the other boxes
        elif not isinstance(value, str):
            raise ConfigError(f"{name}={quoted(value)} must be one of the listed names")
        kw[name] = value
    if kw["profile"] not in info.profiles:
        raise ConfigError(f"profile={quoted(kw['profile'], 40)} is unknown: choose one of {', '.join(info.profiles)}")
    if kw["shape"] not in info.shapes:
        raise ConfigError(f"shape={quoted(kw['shape'], 40)} is unknown: choose one of {', '.join(info.shapes)}")
    if kw["policy"] not in info.policies:
        raise ConfigError(f"policy={quoted(kw['policy'], 40)} is unknown: choose one of {', '.join(info.policies)}")
    ranks = tuple(getattr(info, "lore_ranks", ()) or ())
    # The ranks the model's LoRE factors ship (the menu's), or the engine's default, which means "up to" it.
    if ranks and kw["lore_rank"] not in ranks and kw["lore_rank"] != DEFAULT_LORE_RANK:
        raise ConfigError(f"lore_rank={kw['lore_rank']} is not a rank this model's LoRE factors have: choose one of "
                          f"{', '.join(str(r) for r in ranks)}")
    return RunSettings(**kw)


def check_profile_and_shape(info: EngineInfo, profile, shape) -> None:
    """ConfigError naming which of the two a page's Hardware profile and Model shape is unknown, and the choices."""
    if profile not in info.profiles:
        raise ConfigError(f"Hardware profile: {str(profile)[:40]!r} is unknown; choose one of {', '.join(info.profiles)}")
    if shape not in info.shapes:
        raise ConfigError(f"Model shape: {str(shape)[:40]!r} is unknown; choose one of {', '.join(info.shapes)}")


# The shipped model's stories end by themselves after 130-160 tokens: the default lets them (96 cut every one). The
# tuner confirms a lossy pick on replies this long by default, so the chat's default reply is within its budget.
DEFAULT_CHAT_TOKENS = DEFAULT_REPLY_TOKENS


def default_settings(info: EngineInfo) -> RunSettings:
    """RunSettings defaults, adjusted to what this engine offers."""
    base = RunSettings()
    policy = base.policy if base.policy in info.policies else info.policies[0]
    profile = base.profile if base.profile in info.profiles else info.profiles[0]
    own = default_shape(info)
    shape = own if own in info.shapes else base.shape if base.shape in info.shapes else info.shapes[0]
    cache = max(base.cache_frac, slider_ranges(info)["cache_frac"][0])     # a model too large for the default
    return RunSettings(**{f.name: getattr(base, f.name) for f in fields(base)}
                       | {"policy": policy, "profile": profile, "shape": shape, "max_new_tokens": DEFAULT_CHAT_TOKENS,
                          "cache_frac": cache})


# --- exports ---------------------------------------------------------------------------------
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
EXPORT_BUDGET_BYTES = 256 * 2**20     # all kept export files together; the oldest go first
EXPORT_METHODS = {"chrome": "export_chrome_trace", "chrome_gz": "export_chrome_trace_gz",
                  "tensorboard": "export_tensorboard_zip", "csv": "export_csv"}


class ExportStore:
    """Writes one export of one run when it is asked for, into the run's own temporary folder.

    - Only the kind asked for is written (a TensorBoard zip costs seconds and megabytes).
    - The folder name comes from a validated run id (never from user text); callers check
      ownership before calling, and nothing touches the disk for a malformed id.
    - Files are kept up to ``budget_bytes`` in total (oldest removed first); folders of runs the
      engine no longer keeps are removed on every call; `cleanup()` removes the root (at exit
      and on SIGTERM).
    - One lock per (run, kind): two visitors exporting different runs never wait for each other;
      the store's own lock is held only for bookkeeping, never during an export.
    """

    def __init__(self, engine: EngineLike, root: Path | None = None, *,
                 budget_bytes: int = EXPORT_BUDGET_BYTES) -> None:
        self._engine = engine
        self._root = Path(root) if root else Path(tempfile.mkdtemp(prefix="spice-exports-"))
        self._root.mkdir(parents=True, exist_ok=True)
        self._budget = budget_bytes
        self._paths: dict[tuple[str, str], Path] = {}     # insertion order = age
        self._lock = threading.Lock()
        self._key_locks: dict[tuple[str, str], threading.Lock] = {}

    @property
    def root(self) -> Path:
        return self._root

    def folder_name(self, run_id: str) -> str:
        return _SAFE.sub("_", run_id).strip("._") or "run"

    def get(self, run_id: str, kind: str) -> Path:
        """Path of one export ("chrome" | "tensorboard" | "csv"); raises SpiceError if the engine refuses."""
        if kind not in EXPORT_KINDS:
            raise ConfigError(f"export kind {quoted(kind)} is unknown: use one of {', '.join(EXPORT_KINDS)}")
        if not valid_run_id(run_id):
            raise ConfigError("Run: that is not a run id; pick a run from the list")
        kept = {s.run_id for s in self._engine.list_runs()}
        self._evict(kept)
        if run_id not in kept:
            raise SpiceError(f"run {quoted(run_id, 40)} is unknown or expired: pick one from the run list")
        key = (run_id, kind)
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                cached = self._paths.get(key)
            if cached is not None and cached.exists():
                return cached
            # A new unguessable folder per export: a link handed out while a run was shared stays dead once it is
            # private again, though its owner exports the same kind again (review: the path was fixed per run and
            # kind, so the owner's next export brought an old link back to life).
            out = self._root / self.folder_name(run_id) / f"{kind}-{secrets.token_hex(8)}"
            try:
                out.mkdir(parents=True, exist_ok=True)
                path = Path(getattr(self._engine, EXPORT_METHODS[kind])(run_id, out))
            except BaseException as exc:
                shutil.rmtree(out, ignore_errors=True)
                self._remove_empty(out.parent)
                if isinstance(exc, (OSError, MemoryError)):      # the server's disk or memory, not the visitor's input
                    log.warning("export %s of run %s failed: %r", kind, run_id, exc)
                    why = "out of memory" if isinstance(exc, MemoryError) else (exc.strerror or str(exc)).lower()
                    raise SpiceError(f"the server could not write this export ({why}); nothing was kept: try again "
                                     "later, or a smaller export (the .json.gz trace, or a shorter run)") from exc
                raise
            with self._lock:
                self._paths[key] = path
            self._evict(kept)
            return path

    def used_bytes(self) -> int:
        return sum(p.stat().st_size for p in self._root.rglob("*") if p.is_file())

    def _evict(self, kept: set[str]) -> None:
        """Drop exports of runs the engine forgot, then the oldest until the budget holds."""
        with self._lock:
            for key in [k for k in self._paths if k[0] not in kept]:
                self._drop(key)
            for folder in list(self._root.iterdir()) if self._root.exists() else []:
                if folder.is_dir() and folder.name not in {self.folder_name(r) for r in kept}:
                    shutil.rmtree(folder, ignore_errors=True)
            sizes = {k: _size(p) for k, p in self._paths.items()}
            total = sum(sizes.values())
            for key in list(self._paths):
                if total <= self._budget or len(self._paths) <= 1:
                    break
                total -= sizes[key]
                self._drop(key)

    def _drop(self, key: tuple[str, str]) -> None:
        path = self._paths.pop(key, None)
        self._key_locks.pop(key, None)
        run_folder = self._root / self.folder_name(key[0])
        for folder in run_folder.glob(f"{key[1]}-*"):      # this kind's exports of the run, whatever their token
            shutil.rmtree(folder, ignore_errors=True)
        if path is not None and path.exists() and path.is_file():
            path.unlink(missing_ok=True)
        self._remove_empty(run_folder)

    @staticmethod
    def _remove_empty(folder: Path) -> None:
        try:
            folder.rmdir()            # only when empty
        except OSError:
            pass

    def drop_run(self, run_id: str) -> None:
        """Remove every export of one run (its download links stop working; the next request writes it again)."""
        with self._lock:
            for key in [k for k in self._paths if k[0] == run_id]:
                self._drop(key)
        if valid_run_id(run_id):
            shutil.rmtree(self._root / self.folder_name(run_id), ignore_errors=True)

    def cleanup(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# --- the context every page gets -------------------------------------------------------------
OWNER_SHARE_DIVISOR = 4     # one visitor's kept runs: at most a quarter of the engine's run budget ...
OWNER_MIN_RUNS = 2          # ... but always their newest two (the reply on screen and the one before)


@dataclass
class AppContext:
    engine: EngineLike
    info: EngineInfo
    runner: EngineRunner
    exports: ExportStore
    max_message_chars: int
    runs: RunBook = field(default_factory=RunBook)           # run id -> owner, label, shared
    sweeps: dict = field(default_factory=dict)               # owner -> rows of their last sweep
    sweeps_lock: threading.Lock = field(default_factory=threading.Lock)
    limits: "Limits" = None
    # With several models (pages.models): every model's page (for the picker and About) and this context's
    # key ("" for the default model), which keeps its pages' API names, browser storage and sweeps apart.
    models: tuple = ()
    key: str = ""
    switches: SwitchBook = field(default_factory=SwitchBook)   # settings on their way to another model's chat

    @classmethod
    def create(cls, engine: EngineLike, *, orphan_after_s: float = 5.0, export_root: Path | None = None,
               max_message_chars: int | None = None, limits: "Limits | None" = None) -> "AppContext":
        info = engine.info()
        limit = max_message_chars or message_limit(info)
        return cls(engine=engine, info=info, runner=EngineRunner(orphan_after_s=orphan_after_s),
                   exports=ExportStore(engine, export_root), max_message_chars=limit, limits=limits or Limits())

    def for_model(self, engine: EngineLike, page, models: tuple) -> "AppContext":
        """This context for one model's pages (``page``: its pages.models.ModelPage): its engine, info and key;
        the runner, run book, sweeps and exports stay shared with every other model's pages."""
        return replace(self, engine=engine, info=page.info, key=page.key, models=models,
                       max_message_chars=message_limit(page.info))

    def label_run(self, run_id: str, label: str, owner: str = "") -> None:
        """Remember who started a run and with what (labels are user text: escape where shown); with several
        models the label starts with the model's name."""
        self.runs.add(run_id, owner, f"{self.info.model_name} · {label}" if len(self.models) > 1 else label)
        self.bound_owner(owner)

    def bound_owner(self, owner: str) -> list[str]:
        """Keep one visitor's finished runs within a share of what the engine keeps (1/OWNER_SHARE_DIVISOR of its
        bytes and of its count of runs, never fewer than their newest OWNER_MIN_RUNS), so that one visitor's long
        replies, or a sweep's many small runs, cannot expire everyone else's: their oldest go first. Returns the run
        ids dropped."""
        budget = getattr(self.engine, "max_retained_bytes", None)
        size, forget = getattr(self.engine, "run_bytes", None), getattr(self.engine, "forget_run", None)
        if not owner or budget is None or size is None or forget is None:
            return []
        mine = [e.run_id for e in self.runs.list_for(owner)]          # newest first
        share, held, dropped = budget // OWNER_SHARE_DIVISOR, 0, []
        kept_max = getattr(self.engine, "max_runs_kept", None)
        count_share = max(OWNER_MIN_RUNS, kept_max // OWNER_SHARE_DIVISOR) if kept_max else len(mine)
        for i, run_id in enumerate(mine):
            held += size(run_id)
            if i >= OWNER_MIN_RUNS and (held > share or i >= count_share):
                forget(run_id)
                self.runs.drop(run_id)
                dropped.append(run_id)
        return dropped

    def remember_sweep(self, owner: str, rows: list[dict], keep: int = 64) -> None:
        with self.sweeps_lock:
            self.sweeps.pop(owner + self.key, None)
            self.sweeps[owner + self.key] = list(rows)
            while len(self.sweeps) > keep:
                self.sweeps.pop(next(iter(self.sweeps)))

    def last_sweep(self, owner: str) -> list[dict]:
        with self.sweeps_lock:
            return list(self.sweeps.get(owner + self.key, [])) if owner else []

    def describe_timing(self, settings: RunSettings) -> str:
        """One line for banners: which clock produced the numbers, and what modeled ones stand for."""
        if self.info.default_timing == "measured":
            return (f"**Timing: measured on {self.info.device.upper()}** (CUDA events); the hardware profile and "
                    f"shape only matter for modeled timing.")
        own = own_shape(self.info)
        whose = "" if settings.shape in (own, "native") else \
            f" (its sizes only: the routing is {self.info.model_name}'s, not {settings.shape}'s own)"
        return (f"**Timing: modeled on {self.info.device.upper()}**: times stand for a **{settings.shape}**-shaped "
                f"model on **{settings.profile}**{whose}; the tokens come from the real (small) model.")


def message_limit(info: EngineInfo) -> int:
    """Characters a chat message may have: about four per token of the model's context, within [500, 16000]."""
    return max(500, min(16_000, 4 * info.max_context_tokens))


def timed_bytes(shape_bytes: float, native_bytes: float) -> tuple[float, float | None]:
    """Bytes copied per token as the app shows them: (bytes at the shape the times are for, the native bytes
    when they differ, else None).

    The TPOT beside a byte count is timed at one shape (modeled timing: the chosen shape, e.g. DeepSeek-V2-Lite's
    experts; measured: this model's own), so its bytes are shown at that shape and the model's own as secondary
    ("1.8 MB own sizes" beside a TPOT modeled for 1.6 GB of copies read as a mistake). ``shape_bytes`` 0 means
    the engine did not report them: the native bytes are then all there is.
    """
    if not shape_bytes or shape_bytes == native_bytes:
        return float(native_bytes), None
    return float(shape_bytes), float(native_bytes)


# The engine's messages name command-line flags; in the app the same knobs are controls.
UI_NAMES = {"--cache-frac": "GPU cache size", "--cache-gb": "GPU cache size", "--max-new-tokens": "Max new tokens",
            "--tau-prefetch": "τ_prefetch", "--tau-approx": "τ_approx", "--policy": "Policy",
            "--profile": "Hardware profile", "--shape": "Model shape", "--lore-rank": "LoRE rank",
            "--max-lookahead": "Max lookahead", "--temperature": "Temperature"}
_CACHE_GB = re.compile(r" or GPU cache size to >= [0-9.]+")
# The engine's refusal of a cache below one layer's experts, in GB to 4 decimals ("cache budget 0.0000 GB is smaller
# than one layer's top-6 experts (0.0001 GB): raise --cache-frac to >= 0.0036 ..."): said again in the slider's terms.
# The engine's refusal (`SpiceEngine._validate`): sizes in any unit (units.format_bytes), the bound rounded up.
_CACHE_TOO_SMALL = re.compile(r"cache budget [0-9.]+ [kMGT]?B is smaller than one layer's top-(\d+) experts "
                              r"\([0-9.]+ [kMGT]?B\): raise --cache-frac to >= ([0-9.]+)")
_GB = re.compile(r"\b([0-9]+\.[0-9]+) GB\b")


def spice_error_text(exc: BaseException) -> str:
    """The one line shown to a user for an error they can fix, in the app's words (control names, not flags; sizes
    in readable units)."""
    line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    small = _CACHE_TOO_SMALL.search(line)
    if small:
        need = float(small.group(2))
        return (f"GPU cache size is too small for this model: one layer's top-{small.group(1)} experts need {need:.2%} "
                f"of all experts, so raise GPU cache size to at least {need:g}")
    for flag, control in UI_NAMES.items():
        line = line.replace(flag, control)
    return _GB.sub(lambda m: format_bytes(float(m.group(1)) * 1e9), _CACHE_GB.sub("", line))
