"""Switching model on the chat page keeps what the visitor set (issue 24, defect 11).

    picker change ──► hand_over: the session's settings as a Send would take them (the side bar's pending
                      slider requests applied), kept for this visitor and the picked model's chat page
                      (pages.models.SwitchBook) ──► the browser opens that page (pages.models.go_js)
    page load ──► adopt: the kept settings through `carried`, on the new page's defaults, then the chat's own
                  settings path (SettingsEvents._use / _report): the controls show them, the numbers row says
                  what the next message uses, the side bar's note says what was kept and what was not

Only what the visitor changed travels: a setting left at the old page's default takes the new page's (each
model's default shape is its own). A value the new model cannot take is brought to the nearest it can (a LoRE
rank it lacks: its highest below, else its lowest) or left at the default, each with a note naming the control.
Before, picking a model opened its page with every setting back at its default.

Knows the chat page only through what it hands over (its session, controls, lock and settings handlers), as
pages.chat_auto does.
"""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from spice_core.api import EngineInfo, RunSettings
from pages import models
from pages.chat_settings import with_value
from pages.common import FIELD_CONTROLS, LORE_RANKS, SETTING_FIELDS
from pages.limits import Limits
from pages.owners import esc, owner_of


@dataclass(frozen=True)
class Handoff:
    """What one model's chat page hands to another's: its model, its defaults and the settings in use."""

    model_name: str
    defaults: RunSettings
    settings: RunSettings


def offered_ranks(info: EngineInfo) -> tuple[int, ...]:
    """The LoRE ranks the chat's menu offers for this model (as pages.chat_controls draws it)."""
    return tuple(info.lore_ranks or LORE_RANKS)


def carried(kept: Handoff, info: EngineInfo, defaults: RunSettings,
            limits: Limits) -> tuple[RunSettings, list[str], list[str]]:
    """(``defaults`` with each setting the visitor changed on the other page that this model takes, the names of
    the settings kept, a note per setting changed or not kept), in SETTING_FIELDS order."""
    current, kept_names, notes = defaults, [], []
    for name in SETTING_FIELDS:
        value = getattr(kept.settings, name)
        if value == getattr(kept.defaults, name):
            continue                      # the other page's default: this page's default stands
        if name == "lore_rank" and value not in offered_ranks(info):
            ranks = offered_ranks(info)
            nearest = max((r for r in ranks if r <= value), default=min(ranks))
            notes.append(f"{FIELD_CONTROLS[name]}: {value} is not one of {info.model_name}'s ranks "
                         f"({', '.join(map(str, ranks))}), so {nearest}")
            value = nearest
        settings, refusal = with_value(info, limits, current, name, value)
        if refusal:
            notes.append(f"⚠ Not kept: {refusal} (it stays at {getattr(current, name)})")
            continue
        current = settings
        kept_names.append(name)
    return current, kept_names, notes


class ModelSwitch:
    """The chat page's side of the model picker; ``page`` is the pages.chat.ChatPage."""

    def __init__(self, page) -> None:
        self.page, self.ctx = page, page.ctx

    def wire(self, picker) -> None:
        """Hand the settings over, then open the picked model's chat; at load, take what was handed here."""
        p = self.page
        if picker is None:
            return
        handed = picker.change(self.hand_over, inputs=[picker, p.ctl.requests, p.session], outputs=None,
                               queue=False, api_visibility="private", show_progress="hidden")
        handed.then(None, inputs=[picker], js=models.go_js(self.ctx.models, "chat"), queue=False,
                    api_visibility="private", show_progress="hidden")
        root = gr.context.Context.root_block
        if root is not None:
            adopted = root.load(self.adopt, inputs=[p.session], outputs=[p.ctl.note, p.banner, p.stats, *p.controls],
                                queue=False, api_visibility="private", show_progress="hidden")
            p._keep_settings(adopted)       # the browser keeps them with this page's conversation

    def hand_over(self, model, requests, session, request: gr.Request = None) -> None:
        """Keep this session's settings for this visitor's next visit to ``model``'s chat page."""
        p, owner = self.page, owner_of(request)
        target = next((m for m in self.ctx.models if m.name == model), None)
        if target is None or target.key == self.ctx.key or not owner or not hasattr(session, "requests"):
            return                        # no other page, or no visitor id to find them there: nothing travels
        with p._settings_lock:
            p._take_requests(requests, session)
            settings = session.settings or p.defaults
        self.ctx.switches.keep(owner, target.key, Handoff(self.ctx.info.model_name, p.defaults, settings))

    def adopt(self, session, request: gr.Request = None):
        """Page load: the settings this visitor brought from another model's chat, applied where they apply.
        Outputs: settings note, banner, numbers row, every control's value."""
        p, skip = self.page, gr.skip()
        nothing = (skip,) * (3 + len(p.controls))
        owner = owner_of(request)
        kept = self.ctx.switches.take(owner, self.ctx.key) if owner else None
        if kept is None or not hasattr(session, "requests"):
            return nothing
        with p._settings_lock:
            before = session.requests.shown or p.defaults
            settings, names, notes = carried(kept, p.info, p.defaults, self.ctx.limits)
            if not names and not notes:
                return nothing
            p._use(session, settings)
            _note, banner, stats = p._report(session, before, [])
        shown = ", ".join(f"{FIELD_CONTROLS[n]} {getattr(settings, n)}" for n in names)
        note = " ".join([f"Kept from {esc(kept.model_name)}: {esc(shown)}." if names else
                         f"Nothing kept from {esc(kept.model_name)}."] + [esc(n) + "." for n in notes])
        return (note, banner, stats, *[gr.update(value=getattr(settings, f)) for f in SETTING_FIELDS])
