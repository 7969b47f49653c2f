"""What the browser keeps of the chat page across reloads and the app's other pages: per tab, its conversation and
settings, and what a page load brings back of them.

    chat change (never an empty one) ─┐
    settings box change ──────────────┼──► chat_js.keep_js: this tab's own entry in localStorage, the page as it is
    a reply or a clear ends ──────────┘
    page load ──► chat_js.pick_kept_js: this tab's entry, else the newest kept ──► KeptChat.restore: the conversation
              (pages.messages.restore_kept) and its settings, checked as typed ones
              ──then──► the last reply's panels and numbers row (pages.chat_reload)

Why every change and not only a reply's end: a reload mid-reply keeps the message and what came of the reply. Why
never an empty chat at a change: the page's first, empty chat would overwrite the kept one before `restore` reads it
(a clear keeps its empty chat when it ends, `after`).

Knows the chat page only through what it hands over (its chat, settings box, session, outputs and settings
handlers), as pages.chat_switch does.
"""
from __future__ import annotations

import json

import gradio as gr

from pages.chat_js import keep_js, pick_kept_js
from pages.messages import restore_kept


class KeptChat:
    """The chat page's side of the browser's keep; ``page`` is the pages.chat.ChatPage."""

    def __init__(self, page, cursor: str) -> None:
        self.page, self.cursor = page, cursor.strip()
        self.keep, self.keep_non_empty = keep_js(page.ctx.key), keep_js(page.ctx.key, non_empty=True)

    def build(self) -> None:
        # On page load the browser puts what this tab kept here, for `restore` (never shown, never typed into).
        self.box = gr.Textbox("", visible="hidden", show_label=False, container=False, interactive=False,
                              elem_id="spice-kept")

    def wire(self) -> None:
        p = self.page
        p.chatbot.change(None, inputs=[p.chatbot, p.kept_settings], outputs=None, js=self.keep_non_empty,
                         queue=False, api_visibility="private", show_progress="hidden")
        p.kept_settings.change(None, inputs=[p.chatbot, p.kept_settings], outputs=None, js=self.keep, queue=False,
                               api_visibility="private", show_progress="hidden")
        root = gr.context.Context.root_block
        if root is None:
            return
        # The conversation and settings at once, then its last reply's panels (which may wait for a run still
        # stopping).
        kept = root.load(self.restore, inputs=[self.box, p.session],
                         outputs=[p.chatbot, p.ctl.note, p.banner, p.stats, *p.controls, p.kept_settings],
                         js=pick_kept_js(p.ctx.key), queue=False, api_visibility="private", show_progress="hidden")
        kept.then(p.reload.restore, inputs=[p.chatbot, p.session], outputs=[p.stats, p.heatmap, p.prefetch, p.gantt],
                  queue=False, api_visibility="private", show_progress="hidden")

    def after(self, event) -> None:
        """When ``event`` (a reply, a clear) ends, the browser keeps the page's conversation (an empty one after a
        clear)."""
        event.then(None, inputs=[self.page.chatbot, self.page.kept_settings], outputs=None, js=self.keep,
                   queue=False, api_visibility="private", show_progress="hidden")

    def restore(self, picked, session):
        """Page load: the conversation this tab kept (`messages.restore_kept`; nothing to change when it kept none),
        and its settings, checked as typed ones are (`chat_settings.SettingsEvents.restore_settings`). ``picked``:
        JSON text {"h": history, "s": settings} from `chat_js.pick_kept_js` (the browser's: anything may come)."""
        try:
            picked = json.loads(picked) if isinstance(picked, str) else picked
        except ValueError:
            picked = None
        history, kept = (picked.get("h"), picked.get("s")) if isinstance(picked, dict) else (picked, None)
        return (restore_kept(history, self.cursor) or gr.skip(), *self.page.restore_settings(kept, session))
