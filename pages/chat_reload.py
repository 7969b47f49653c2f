"""After a reload: the last reply's panels and numbers row, rebuilt from its run on the server.

    page load ──► ChatPage.restore: the conversation this tab kept (pages.messages.restore_kept)
              ──then──► ReplyPanels.restore(history, session, request)
                  last_reply_run(history): the run id of the reply after the last user message (the tag of its
                        run note, or of the reply in flight: pages.messages; older kept chats: the note's link)
                  ──► RunBook.may_open: the trace explorer's rule (the visitor's own runs, or one shared with them)
                  ──► engine.get_steps ──► LiveRun.from_steps (`LiveRun.add` per step, as they streamed)
                  ──► the numbers row (with the reply's ReplyView) and the three panels' figures
                  a run that is gone (expired, forgotten at a restart, not this visitor's): the placeholders
                  stay and the numbers row says why, in one line

Why a book of views here: the numbers row also shows what no step holds: the settings the reply ended with
(a τ changed mid-reply), the tokens per second this page received, and the greedy agreement (a second run
measured it). They are a few plain values per run id, kept for more runs than the engine keeps; the steps stay
with the engine, which alone decides when a run expires.

Why a second event after the conversation: a reply that was streaming when the page went away is still being
stopped (between two tokens) when the page comes back; its panels wait for that run to end, the conversation
does not.

Knows nothing of the page's layout beyond the panels' names and placeholders the page hands it.
"""
from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

import gradio as gr

from spice_core.api import RunSettings
from spice_core.errors import SpiceError
from pages import figures
from pages import chat_text as text
from pages.common import AppContext, as_plot
from pages.live import LiveRun
from pages.messages import is_app_note, run_of
from pages.owners import owner_of, valid_run_id

MAX_VIEWS = 256             # replies whose numbers row is kept (the engine keeps far fewer runs)
RUN_END_WAIT_S = 10.0       # how long the panels wait for a reply's run that is still stopping (a reader that
                            # went away gets its stream cancelled after the runner's orphan_after_s, 5 s)
GONE_NOTE = ("The last reply's panels are no longer available: the server keeps only its newest runs (none after "
             "a restart), and shows them only to the browser that made them.")
RUNNING_NOTE = "The last reply's panels are not available: its run had not ended when this page loaded."
# A reply whose exact re-run was under way when the page went away (the re-run ends with it).
LEFT_DURING_CHECK = ("not measured", "the page was left before the exact re-run ended")
_RUN_LINK = re.compile(r"trace\?run=([A-Za-z0-9_-]{1,64})")


@dataclass(frozen=True)
class ReplyView:
    """What the numbers row showed beside a reply's steps. Read by `chat_text.stats_html` as its ``stream``
    (``run_id`` and ``changes``)."""

    run_id: str
    settings: RunSettings       # those the reply ended with
    changes: tuple = ()         # pages.runner.SettingsChange, in order
    wall_tps: float = 0.0       # tokens per second that reached the page
    agreement: tuple[str, str] | None = None


class ReplyViews:
    """Thread-safe, bounded book of ReplyViews by run id (the oldest go first)."""

    def __init__(self, size: int = MAX_VIEWS) -> None:
        self._lock = threading.Lock()
        self._views: OrderedDict[str, ReplyView] = OrderedDict()
        self._size = size

    def remember(self, stream, wall_tps: float = 0.0, agreement: tuple[str, str] | None = None) -> None:
        """Keep (or update) the view of ``stream``'s reply (a pages.runner.RunStream) as it stands now."""
        if not stream.run_id:
            return
        view = ReplyView(stream.run_id, stream.settings, tuple(stream.changes), wall_tps, agreement)
        with self._lock:
            self._views.pop(view.run_id, None)
            self._views[view.run_id] = view
            while len(self._views) > self._size:
                self._views.popitem(last=False)

    def get(self, run_id: str) -> ReplyView | None:
        with self._lock:
            return self._views.get(run_id)


def last_reply_run(history) -> str:
    """The run id of the last reply: the newest tag (its run note's, or the reply's own while it was in flight) after
    the last user message, else (a conversation kept before notes were tagged) the trace link of the run note after
    it; "" when there is none."""
    if not isinstance(history, list):
        return ""
    messages = [m for m in history if isinstance(m, dict)]
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    after = messages[users[-1] + 1:] if users else messages
    for m in reversed(after):
        if run := run_of(m):
            return run
    for m in reversed(after):
        if is_app_note(m) and str(m["metadata"]["title"]).startswith("Run "):
            found = _RUN_LINK.search(m.get("content") if isinstance(m.get("content"), str) else "")
            if found:
                return valid_run_id(found.group(1))
    return ""


class ReplyPanels:
    """Brings the last reply's panels back on page load; keeps the ReplyViews that the chat writes."""

    def __init__(self, ctx: AppContext, defaults: RunSettings, panels: tuple[str, ...], placeholders: dict) -> None:
        self.ctx, self.defaults = ctx, defaults
        self.panels, self.placeholders = panels, placeholders
        self.views = ReplyViews()

    def remember(self, stream, wall_tps: float = 0.0, agreement: tuple[str, str] | None = None) -> None:
        self.views.remember(stream, wall_tps, agreement)

    def restore(self, history, session, request: gr.Request = None) -> tuple:
        """(numbers row, *panels) of the last reply in ``history`` as they were when it ended; all skipped when
        the conversation has no reply with a run, the placeholders and a note where its run is gone."""
        run_id = last_reply_run(history)
        if not run_id or not hasattr(session, "last_view"):
            return (gr.skip(),) * (1 + len(self.panels))
        settings = getattr(session, "settings", None) or self.defaults
        if not self.ctx.runs.may_open(run_id, owner_of(request)):     # the trace explorer's words: nobody
            return self._missing(settings, GONE_NOTE)                  # learns whose run an id is
        active = self.ctx.runner.active
        if active is not None and active.run_id == run_id:
            active.join(RUN_END_WAIT_S)
        view = self.views.get(run_id)
        try:
            steps = self.ctx.engine.get_steps(run_id)
            summary = self.ctx.engine.get_summary(run_id)
        except SpiceError:
            running = self.ctx.runner.active
            return self._missing(settings, RUNNING_NOTE if running is not None and running.run_id == run_id
                                 else GONE_NOTE)
        if view is None or not steps:
            return self._missing(settings, GONE_NOTE)
        live = LiveRun.from_steps(self.ctx.info, steps)
        session.last_run_id = run_id
        session.last_view = {"live": live, "settings": view.settings, "stream": view, "summary": summary,
                             "wall_tps": view.wall_tps, "agreement": view.agreement}
        stats = text.stats_html(live, view.settings, self.ctx.info, stream=view, summary=summary,
                                wall_tps=view.wall_tps, agreement=view.agreement, next_settings=settings)
        return (stats, *(as_plot(figures.panel_figure(name, live)) for name in self.panels))

    def _missing(self, settings: RunSettings, why: str) -> tuple:
        return (text.stats_html(None, settings, self.ctx.info, note=why),
                *(as_plot(figures.empty_figure(self.placeholders[name])) for name in self.panels))
