"""Applying the chat page's settings one control at a time: the browser's numbered slider requests and a
menu's or checkbox's new value, each checked against the app's ranges on top of the settings in use.

Why numbered requests: the browser writes every slider request so far, each with its sequence number, into
one hidden box (pages.chat_controls.SETTINGS_JS), and both a settings event and a Send read that box. Events
read a box's value some time after they were triggered, and two events may reach the server in either
order; because each read holds every request up to then, applying each field's requests with a number above
the last one applied for that field, in number order, gives the same settings whichever read comes first,
and never applies a value that was not asked for. `Requests` knows nothing of Gradio; `SettingsEvents`
holds the chat page's settings handlers (the page's outputs: note, banner, numbers row, sliders).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import gradio as gr

from spice_core.api import EngineInfo, RunSettings
from spice_core.errors import SpiceError
from pages import chat_text as text
from pages.common import FIELD_CONTROLS, SETTING_FIELDS, settings_from_values, spice_error_text
from pages.runner import LIVE_FIELDS
from pages.limits import Limits

MAX_REQUEST_CHARS = 4096     # the hidden box holds one short entry per slider


def with_value(info: EngineInfo, limits: Limits, current: RunSettings, name: str,
               value) -> tuple[RunSettings, str]:
    """`current` with setting `name` at `value`, or `current` and the reason it was refused."""
    values = {f: getattr(current, f) for f in SETTING_FIELDS} | {name: value}
    try:
        return settings_from_values(info, values, limits), ""
    except SpiceError as exc:
        return current, spice_error_text(exc)


def parse(raw) -> list[tuple[int, str, object]]:
    """(sequence number, field, value) of each well-formed request in the box's text, in number order;
    anything else (not JSON, an unknown field, a number that is not one) is left out."""
    if not isinstance(raw, str) or not raw or len(raw) > MAX_REQUEST_CHARS:
        return []
    try:
        data = json.loads(raw)
    except ValueError:
        return []
    if not isinstance(data, dict):
        return []
    out = []
    for name, entry in data.items():
        if name not in SETTING_FIELDS or not isinstance(entry, dict):
            continue
        seq = entry.get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0:
            out.append((seq, name, entry.get("v")))
    return sorted(out, key=lambda r: r[0])


@dataclass
class Requests:
    """One page's requests: the last number applied per field, the refusals not yet shown, and the
    settings the page last said were in use (None: the defaults it was drawn with)."""

    applied_seq: dict[str, int] = field(default_factory=dict)
    refusals: dict[str, str] = field(default_factory=dict)       # field -> why (the newest per field)
    shown: RunSettings | None = None

    def take(self, info: EngineInfo, limits: Limits, current: RunSettings,
             raw) -> tuple[RunSettings, list[str], list[str]]:
        """Apply the requests in `raw` not applied yet, in order, on top of `current`:
        (settings, fields applied, fields refused)."""
        applied, refused = [], []
        for seq, name, value in parse(raw):
            if seq <= self.applied_seq.get(name, 0):
                continue
            self.applied_seq[name] = seq
            if isinstance(value, str) and value.strip() == "":
                settings, why = current, f"{FIELD_CONTROLS[name]}: the box is empty; type a number"
            else:
                settings, why = with_value(info, limits, current, name, value)
            if why:
                refused.append(name)
                self.refusals[name] = why
            else:
                applied.append(name)
                self.refusals.pop(name, None)
                current = settings
        return current, applied, refused

    def pop_refusals(self) -> dict[str, str]:
        """The refusals not shown yet (field -> why), now shown."""
        out = dict(self.refusals)
        self.refusals.clear()
        return out


class SettingsEvents:
    """The chat page's settings handlers (mixed into pages.chat.ChatPage, which supplies info, ctx, defaults,
    ctl, _settings_lock, _banner and new_session)."""

    def on_requests(self, raw, session):
        """The browser's slider requests: each field's new ones, in order. Outputs: note, banner, numbers row,
        and the sliders (a refused value's box goes back to the value in use; the others are left alone)."""
        with self._settings_lock:
            before = session.requests.shown or self.defaults
            self._take_requests(raw, session)
            refused = session.requests.pop_refusals()       # also those a Send took first
            note, banner, stats = self._report(session, before, list(refused.values()))
        in_use = session.settings or self.defaults
        put_back = [gr.update(value=getattr(in_use, f)) if f in refused else gr.skip() for f in self.ctl.sliders]
        return (note, banner, stats, *put_back)

    def _on_control(self, name: str):
        def on_change(value, session):
            with self._settings_lock:
                before = session.requests.shown or self.defaults
                current = session.settings or self.defaults
                settings, refusal = with_value(self.info, self.ctx.limits, current, name, value)
                self._use(session, settings)
                return self._report(session, before, [refusal] if refusal else [])
        on_change.__name__ = f"on_{name}"
        return on_change

    def settings_event(self, policy, cache_frac, tau_prefetch, tau_approx, max_lookahead, lore_rank, cpu_lane,
                       profile, shape, max_new_tokens, temperature, session):
        """The /settings API: every setting at once (all applied, or none with a note saying why)."""
        values = dict(policy=policy, cache_frac=cache_frac, tau_prefetch=tau_prefetch, tau_approx=tau_approx,
                      max_lookahead=max_lookahead, lore_rank=lore_rank, cpu_lane=cpu_lane, profile=profile,
                      shape=shape, max_new_tokens=max_new_tokens, temperature=temperature)
        if session is None or not hasattr(session, "requests"):
            session = self.new_session()
        try:
            settings = settings_from_values(self.info, values, self.ctx.limits)
        except SpiceError as exc:
            return f"⚠ Not applied: {spice_error_text(exc)}", gr.skip(), gr.skip()
        with self._settings_lock:
            before = session.requests.shown or self.defaults
            self._use(session, settings)
            return self._report(session, before, [])

    def _take_requests(self, raw, session) -> None:
        """Apply the new requests in `raw` to the session, in order (refusals wait in session.requests)."""
        current = session.settings or self.defaults
        settings, _applied, _refused = session.requests.take(self.info, self.ctx.limits, current, raw)
        self._use(session, settings)

    def _use(self, session, settings: RunSettings) -> None:
        if settings == (session.settings or self.defaults):
            return
        session.settings = settings
        if session.streaming():
            session.stream.request_settings(settings)

    def _report(self, session, before: RunSettings, refusals: list[str]):
        """(note, banner, numbers row) for what changed since the page last said (`before`)."""
        settings = session.settings or self.defaults
        session.requests.shown = settings
        refused = " ".join(f"⚠ Not applied: {r}" for r in refusals)
        if settings == before:      # nothing new (e.g. a slider let go where it was): the note stays
            return (refused or gr.skip()), gr.skip(), gr.skip()
        banner = self._banner(settings) if (settings.profile, settings.shape) != (before.profile, before.shape) \
            else gr.skip()
        if not session.streaming():     # the numbers row says what the next message will use
            view = session.last_view
            stats = text.stats_html(view.get("live"), view.get("settings", settings), self.info,
                                    stream=view.get("stream"), summary=view.get("summary"),
                                    wall_tps=view.get("wall_tps", 0.0), agreement=view.get("agreement"),
                                    next_settings=settings)
            return " ".join(p for p in (refused, text.settings_hint()) if p), banner, stats
        stream = session.stream
        changed = [f for f in RunSettings.__dataclass_fields__ if getattr(settings, f) != getattr(stream.settings, f)]
        live = [f for f in changed if f in LIVE_FIELDS]
        later = [f for f in changed if f not in LIVE_FIELDS]
        parts = [refused] if refused else []
        if live:
            parts.append(f"**{', '.join(live)}** sent to the running reply: the engine applies "
                         f"{'it' if len(live) == 1 else 'them'} from the next token.")
        if later:
            parts.append(f"**{', '.join(later)}** applies from your next message (if the engine cannot change "
                         f"it mid-reply).")
        return " ".join(parts) or text.settings_hint(), banner, gr.skip()

