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
from pages import tuning
from pages.common import FIELD_CONTROLS, SETTING_FIELDS, settings_from_values, spice_error_text
from pages.runner import LIVE_FIELDS
from pages.limits import Limits, OutOfRange, on_slider, slider_ranges
from pages.owners import esc

MAX_REQUEST_CHARS = 4096     # the hidden box holds one short entry per slider


def with_value(info: EngineInfo, limits: Limits, current: RunSettings, name: str,
               value) -> tuple[RunSettings, str]:
    """`current` with setting `name` at `value`, or `current` and the reason it was refused."""
    values = {f: getattr(current, f) for f in SETTING_FIELDS} | {name: value}
    try:
        return settings_from_values(info, values, limits), ""
    except SpiceError as exc:
        return current, spice_error_text(exc)


def typed_value(info: EngineInfo, limits: Limits, current: RunSettings, name: str,
                raw) -> tuple[RunSettings, str, bool]:
    """A number typed into setting `name`'s slider box, on top of `current`: (the settings, the note that says what
    was applied instead of what was typed and the slider's range, "" when it applied as typed; whether it was
    refused). Beyond the slider's ends, or not a number: refused, the value in use stays. Between two of its steps
    (the slider shows no other): the nearest step applies, so the box, the slider and the numbers row agree."""
    if name not in slider_ranges(info, limits):         # not a slider's: a whole-settings check
        settings, why = with_value(info, limits, current, name, raw)
        return settings, (f"⚠ Not applied: {why}" if why else ""), bool(why)
    low, high, step = slider_ranges(info, limits)[name]
    control, kept = FIELD_CONTROLS[name], getattr(current, name)
    takes = f"it takes {low:g} to {high:g} in steps of {step:g}" if step != 1 else \
        f"it takes whole numbers from {low:g} to {high:g}"
    typed = str(raw).strip()[:20] if isinstance(raw, (str, int, float)) else "that"
    try:
        if typed == "":
            raise OutOfRange("is empty")
        value = on_slider(raw, low, high, step)
    except OutOfRange as exc:
        what = "the box is empty" if typed == "" else f"{typed} {exc}"
        return current, f"⚠ Not applied: {control}: {what}, so it stays at {kept:g} ({takes}).", True
    value = int(value) if isinstance(kept, int) and not isinstance(kept, bool) else value
    settings, why = with_value(info, limits, current, name, value)
    if why:
        return current, f"⚠ Not applied: {why}", True
    if value == float(raw):
        return settings, "", False
    between = "is not a whole number" if step == 1 else "is between two steps"
    return settings, f"ℹ {control}: {typed} {between}, so {value:g} applies ({takes}).", False


def settings_json(settings: RunSettings) -> str:
    """The settings a page shows, as the browser keeps them (pages.chat_js)."""
    return json.dumps({f: getattr(settings, f) for f in SETTING_FIELDS}, separators=(",", ":"))


def restored(info: EngineInfo, limits: Limits, defaults: RunSettings, kept) -> tuple[RunSettings, list[str]]:
    """The settings a tab kept, as each would apply if typed or picked now, on ``defaults``: (settings, a note per
    value not restored). A kept value is the browser's, so anything may come (a stale one from before a range
    changed, a tampered one): a number goes through a slider's checks (`typed_value`), any other through the
    settings' own; nothing out of range applies, and nothing raises."""
    if not isinstance(kept, dict):
        return defaults, []
    current, notes = defaults, []
    for name in SETTING_FIELDS:
        if name not in kept or kept[name] == getattr(defaults, name):
            continue
        settings, note, refused = typed_value(info, limits, current, name, kept[name])
        if refused:
            notes.append(note.replace("⚠ Not applied:", "⚠ Not restored:", 1))
        current = settings
    return current, notes


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
    """One page's requests: the last number applied per field, the notes not yet shown (a value refused, or brought
    to the slider's nearest step), the sliders whose line shows a note, and the settings the page last said were in
    use (None: the defaults it was drawn with)."""

    applied_seq: dict[str, int] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)          # field -> note (the newest per field)
    flagged: set[str] = field(default_factory=set)               # fields whose slider shows a note under its label
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
            settings, note, was_refused = typed_value(info, limits, current, name, value)
            (refused if was_refused else applied).append(name)
            if note:
                self.notes[name] = note
            else:
                self.notes.pop(name, None)
            current = settings
        return current, applied, refused

    def pop_notes(self) -> dict[str, str]:
        """The notes not shown yet (field -> note), now shown."""
        out = dict(self.notes)
        self.notes.clear()
        return out


class SettingsEvents:
    """The chat page's settings handlers (mixed into pages.chat.ChatPage, which supplies info, ctx, defaults,
    ctl, _settings_lock, _banner and new_session)."""

    def on_requests(self, raw, session):
        """The browser's slider requests: each field's new ones, in order. Outputs: note, banner, numbers row,
        and the sliders: a value refused or brought to a step shows the value in use in its box and the note under
        its label, where the visitor is looking (the side bar's note can be out of view); a note from before goes."""
        with self._settings_lock:
            before = session.requests.shown or self.defaults
            self._take_requests(raw, session)
            notes = session.requests.pop_notes()       # also those a Send took first
            note, banner, stats = self._report(session, before, list(notes.values()))
            stale, session.requests.flagged = session.requests.flagged - set(notes), set(notes)
        in_use = session.settings or self.defaults
        put_back = [gr.update(value=getattr(in_use, f), info=notes[f]) if f in notes else
                    gr.update(info=self.ctl.infos[f]) if f in stale else gr.skip() for f in self.ctl.sliders]
        return (note, banner, stats, *put_back)

    def _on_control(self, name: str):
        def on_change(value, session):
            with self._settings_lock:
                before = session.requests.shown or self.defaults
                current = session.settings or self.defaults
                settings, refusal = with_value(self.info, self.ctx.limits, current, name, value)
                self._use(session, settings)
                return self._report(session, before, [f"⚠ Not applied: {refusal}"] if refusal else [])
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
            return f"⚠ Not applied: {esc(spice_error_text(exc))}", gr.skip(), gr.skip()
        with self._settings_lock:
            before = session.requests.shown or self.defaults
            self._use(session, settings)
            return self._report(session, before, [])

    def settings_kept(self, session) -> str:
        """The box the browser keeps: the settings in use (pages.chat_js)."""
        return settings_json(getattr(session, "settings", None) or self.defaults)

    def restore_settings(self, kept, session) -> tuple:
        """Page load: the settings this tab kept (`restored`), for a session that has none yet (a model switch or a
        sweep's pick that reached it first wins). Outputs: note, banner, numbers row, every control's value, the
        kept box."""
        skip = gr.skip()
        nothing = (skip,) * (4 + len(SETTING_FIELDS))
        if not hasattr(session, "requests"):
            return nothing
        with self._settings_lock:
            if session.settings is not None:
                return nothing
            settings, notes = restored(self.info, self.ctx.limits, self.defaults, kept)
            if settings == self.defaults and not notes:
                return nothing
            before = session.requests.shown or self.defaults
            self._use(session, settings)
            note, banner, _stats = self._report(session, before, notes)
        stats = text.stats_html(None, settings, self.info)     # the last reply's comes next (pages.chat_reload)
        return (note, banner, stats, *[gr.update(value=getattr(settings, f)) for f in SETTING_FIELDS],
                settings_json(settings))

    def _take_requests(self, raw, session) -> None:
        """Apply the new requests in `raw` to the session, in order (refusals wait in session.requests)."""
        current = session.settings or self.defaults
        settings, _applied, _refused = session.requests.take(self.info, self.ctx.limits, current, raw)
        self._use(session, settings)

    def _use(self, session, settings: RunSettings) -> None:
        if settings == (session.settings or self.defaults):
            return
        session.settings = settings
        stream = session.stream          # read once (the chat's thread may end the reply meanwhile)
        if stream is not None and session.replying():
            stream.request_settings(settings)

    def _report(self, session, before: RunSettings, notes: list[str]):
        """(note, banner, numbers row) for what changed since the page last said (`before`); ``notes``: what was
        not applied as asked (each a sentence of its own)."""
        settings = session.settings or self.defaults
        session.requests.shown = settings
        refused = " ".join(esc(n) for n in notes)       # they quote what was typed or kept: text, never HTML
        pick = tuning.in_use_caveat(session, settings)   # an Auto pick now used for longer replies than it held for
        refused = " ".join(p for p in (refused, pick) if p)
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
        if not session.replying():      # the reply's exact re-run: its numbers row says "checking…" until it ends
            return " ".join(p for p in (refused, "Applies to your next message: the exact re-run that measures the "
                                        "reply's greedy agreement keeps its exact settings.") if p), banner, gr.skip()
        stream = session.stream
        if stream is None:              # the reply ended since: the change is for the next message
            return " ".join(p for p in (refused, text.settings_hint()) if p), banner, gr.skip()
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

