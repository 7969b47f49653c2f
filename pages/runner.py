"""One generation at a time: a worker thread drives the engine, the UI drains its StepStats.

    UI event (Gradio worker thread)           EngineRunner                 pump thread
    ───────────────────────────────           ────────────                 ───────────
    runner.start(owner, start_fn) ──────────► cancel + join any orphan ──► for step in generation:
    stream.take(timeout)  ◄──── queue.Queue ◄─────────────────────────────     put(step)
    stream.request_settings(s) ─► pending ──────────────────────────────►     update_settings (between tokens)
    stream.cancel() ───────────► flag ──────────────────────────────────►     generation.cancel() (between tokens)

Why a thread: building plotly figures and serialising them takes tens of milliseconds; done on
the thread that pulls tokens, it would slow generation down. The pump keeps the engine busy
while the UI renders, and it is the only thread that touches the running `Generation`, so
settings changes and cancellation always land *between* tokens.

Why the runner cancels orphans: Gradio stops pulling a generator whose browser went away
but does not always close it. A stream whose consumer has not pulled for `orphan_after_s`
cancels itself. `start()` cancels a previous stream only if the same owner started it or its
reader is gone, and otherwise waits for it: the engine (which is not thread-safe) never runs two
generations at once, a closed tab never blocks the queue, and nobody's reply is cut off by
someone else's (e.g. an abandoned sweep's next run).

This module knows nothing of Gradio; it relies only on `spice_core.api`.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from spice_core import api
from spice_core.api import Generation, RunSettings, RunSummary, StepStats
from spice_core.errors import SpiceError

log = logging.getLogger(__name__)

# Thresholds a running generation may take from its next token; any other change waits for the
# next message (see RunStream._apply_settings).
LIVE_FIELDS = tuple(f for f in api.LIVE_FIELDS if f in ("tau_prefetch", "tau_approx", "max_lookahead"))
# the live fields the chat's controls offer (temperature and top_p have no live control in the app)


# Why a stream ended early, in words for the person who was reading it.
CANCEL_REASONS = {
    "superseded": "you started another generation (a new message, sweep or check) before this one ended",
    "orphaned": "nobody read it for a few seconds (the page was closed or lost its connection), "
                "so the engine went to the next visitor",
    "closed": "the page that asked for it was closed or reloaded",
}


@dataclass(frozen=True)
class SettingsChange:
    """How a mid-stream settings request ended: applied from ``from_token`` or deferred."""

    applied: tuple[str, ...]          # field names applied to the running generation
    deferred: tuple[str, ...]         # field names that wait for the next message
    from_token: int                   # first token index generated with the new values
    message: str = ""                 # engine's reason when it refused something
    settings_after: RunSettings | None = None


@dataclass
class RunStream:
    """A generation driven on its own thread; read it with `take()`."""

    owner: str
    generation: Generation
    settings: RunSettings
    orphan_after_s: float = 5.0
    kind: str = "reply"                # what it is, in words shown to waiting visitors
    run_id: str = ""
    error: str = ""                    # SpiceError text (shown verbatim) or an internal-error line
    internal_error: bool = False
    cancel_reason: str = ""            # "stop" | "superseded" | "orphaned" | "closed" | "" (see CANCEL_REASONS)
    changes: list[SettingsChange] = field(default_factory=list)
    started_wall: float = field(default_factory=time.perf_counter)
    _queue: "queue.Queue[StepStats | None]" = field(default_factory=queue.Queue)
    _cancel: threading.Event = field(default_factory=threading.Event)
    _done: threading.Event = field(default_factory=threading.Event)
    _pending: RunSettings | None = None
    _pending_lock: threading.Lock = field(default_factory=threading.Lock)
    _last_pull: float = field(default_factory=time.monotonic)
    _tokens: int = 0
    _engine_cancelled: bool = False
    _summary: RunSummary | None = None
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self.run_id = getattr(self.generation, "run_id", "") or ""

    # --- consumer side -------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def orphaned(self) -> bool:
        """Nobody has pulled a token for ``orphan_after_s``: its reader has gone."""
        return time.monotonic() - self._last_pull > self.orphan_after_s

    def progress_text(self) -> str:
        elapsed = time.perf_counter() - self.started_wall
        own = getattr(self.generation, "progress_words", None)     # a job that is not a generation (a tune)
        done = own() if callable(own) else f"token {self._tokens} of at most {self.settings.max_new_tokens}"
        return f"{done}, running for {elapsed:.0f} s"

    def take(self, timeout_s: float) -> tuple[list[StepStats], bool]:
        """Every step available now (waits up to ``timeout_s`` for the first); and whether the run ended."""
        self._last_pull = time.monotonic()
        steps: list[StepStats] = []
        ended = False
        try:
            item = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return steps, False
        while True:
            if item is None:
                ended = True
                break
            steps.append(item)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
        return steps, ended

    def cancel(self, reason: str = "stop") -> None:
        """Ask the pump to cancel before the next token (returns at once)."""
        if not self._cancel.is_set():
            self.cancel_reason = reason
            self._cancel.set()

    def request_settings(self, settings: RunSettings) -> None:
        """Hand new settings to the pump; it applies them before the next token."""
        with self._pending_lock:
            self._pending = settings

    def join(self, timeout_s: float | None = None) -> bool:
        return self._done.wait(timeout_s)

    def summary(self) -> RunSummary | None:
        """The engine's summary once the run has ended (None if the engine could not give one)."""
        return self._summary if self.done else None

    # --- pump side -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._pump, name=f"spice-pump-{self.run_id}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        iterator = None
        try:
            self._between_tokens()
            iterator = iter(self.generation)
            late = 0                      # steps the engine produced after we cancelled it
            for step in iterator:
                if self._engine_cancelled:
                    late += 1
                    if late > 2:          # the engine ignores cancel(): stop pulling anyway
                        log.warning("run %s kept generating after cancel()", self.run_id)
                        break
                self._tokens += 1
                self._queue.put(step)
                # No break on step.finished: the run's generator ends itself right after (it is recorded by then).
                self._between_tokens()
        except SpiceError as exc:
            self.error = str(exc)
        except Exception as exc:  # the engine failed: keep the app alive, say so, log the traceback
            log.exception("generation %s failed", self.run_id)
            self.error = f"The engine failed ({type(exc).__name__}: {exc}). The error is logged on the server."
            self.internal_error = True
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()
            try:
                self._summary = self.generation.summary()
            except SpiceError as exc:     # a run that failed early may have no summary; the UI copes
                log.info("no summary for run %s: %s", self.run_id, exc)
            except Exception:
                log.warning("no summary for run %s", self.run_id, exc_info=True)
            self._queue.put(None)
            self._done.set()

    def _between_tokens(self) -> None:
        """Apply pending settings and cancellation (the engine acts on both from the next token)."""
        if not self._cancel.is_set() and time.monotonic() - self._last_pull > self.orphan_after_s:
            log.info("run %s: nobody has read it for %.1f s, cancelling", self.run_id, self.orphan_after_s)
            self.cancel("orphaned")
        if self._cancel.is_set():
            if not self._engine_cancelled:
                self._engine_cancelled = True
                self.generation.cancel()
            return
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self._apply_settings(pending)

    def _apply_settings(self, wanted: RunSettings) -> None:
        """Hand the engine only the live thresholds (the contract promises those from the next token);
        every other change is reported as waiting for the next message."""
        changed = [f for f in RunSettings.__dataclass_fields__ if getattr(wanted, f) != getattr(self.settings, f)]
        live = {f: getattr(wanted, f) for f in changed if f in LIVE_FIELDS}
        deferred = tuple(f for f in changed if f not in live)
        refusal = ""
        if live:
            candidate = replace(self.settings, **live)
            try:
                self.generation.update_settings(candidate)
                self.settings = candidate
            except SpiceError as exc:
                refusal, deferred, live = str(exc), tuple(changed), {}
        if live or deferred:
            self.changes.append(SettingsChange(tuple(live), deferred, self._tokens, refusal, self.settings))


class EngineRunner:
    """Owns the rule "one generation at a time" for every page of the app."""

    def __init__(self, *, orphan_after_s: float = 5.0, join_timeout_s: float = 30.0) -> None:
        self._lock = threading.Lock()
        self._active: RunStream | None = None
        self._orphan_after_s = orphan_after_s
        self._join_timeout_s = join_timeout_s

    @property
    def active(self) -> RunStream | None:
        stream = self._active
        return stream if stream is not None and not stream.done else None

    def start(self, owner: str, settings: RunSettings, start_fn: Callable[[], Generation], *,
              kind: str = "reply") -> RunStream:
        """Start a new generation with ``start_fn`` and pump it, once the engine is free.

        A running stream is cancelled only when its own owner starts another one or when nobody
        has read it for ``orphan_after_s`` (its visitor left). A stream someone is still reading
        is never pre-empted: this waits for it to end (up to ``join_timeout_s``), then refuses.
        Raises what ``start_fn`` raises (SpiceError for a prompt or setting the engine refuses).
        """
        with self._lock:
            previous = self._active
            if previous is not None and not previous.done:
                if previous.owner == owner:
                    previous.cancel("superseded")
                elif previous.orphaned:
                    previous.cancel("orphaned")
                if not previous.join(self._join_timeout_s):
                    raise SpiceError(f"The engine is busy with another visitor's {previous.kind} "
                                     f"({previous.progress_text()}): try again in a moment.")
            stream = RunStream(owner=owner, generation=start_fn(), settings=settings,
                               orphan_after_s=self._orphan_after_s, kind=kind)
            self._active = stream
            stream.start()
            return stream

    def describe(self, for_owner: str | None = None) -> str:
        """What the engine is doing now, for visitors who wait ("" when idle, or when it works for
        ``for_owner``: a visitor is not told to wait for their own reply)."""
        stream = self.active
        if stream is None or (for_owner is not None and stream.owner == for_owner):
            return ""
        return f"{stream.kind}: {stream.progress_text()}"

    def cancel_owner(self, owner: str, reason: str) -> bool:
        """Cancel the running generation if ``owner`` started it; True if one was cancelled."""
        stream = self.active
        if stream is not None and stream.owner == owner:
            stream.cancel(reason)
            return True
        return False

    def wait_idle(self, timeout_s: float) -> bool:
        stream = self._active
        return True if stream is None else stream.join(timeout_s)
