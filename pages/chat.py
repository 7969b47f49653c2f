"""Main page: chat with the offloaded model, tune SPICE, and watch what it does per token.

    slider done with ──► #spice-setting-req (every request, numbered) ──┐
    menu / checkbox ──change──────────────────────────────────────────┤
                                                                      ▼
                      pages.chat_settings: each field's new requests, in order ──► session.settings
                                                                      └──► running stream (next token)
    Send / Enter ──► chat_browser: the requests it carries, then session.settings (never the boxes)
                 ──► chat (generator, engine group) ──► runner.start ──► pump thread ──► StepStats
                          │ first token: the three panel figures, once (gr.Plot)   (pages.runner)
                          │ every ≤ 0.2 s: chat text; every 1 s: numbers row
                          │ every 1 s: panel *changes* (JSON) ──► browser restyles the drawn figures
                          │            at a rate it adapts to its own drawing time (spice_live.js)
                          └ end: run note in the chat, full panels, exact re-run when lossy
    Stop ──► stream.cancel() (between tokens)      tab closed ──► unload / orphan watchdog ──► cancel
    page load ──► the conversation and settings this tab kept (pages.chat_keep; settings checked as typed ones:
                  pages.chat_settings) ──► its last reply's panels and numbers row (pages.chat_reload)

Everything per user lives in one `ChatSession` inside a gr.State (Gradio gives each page its
own session, so the chat, its controls and its panels share this page). Events that only touch
that object (settings, stop, busy note, new chat) skip the queue, so they act while a reply
streams; the chat event joins the engine's concurrency group.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path

import gradio as gr

from spice_core.api import RunSettings
from spice_core.errors import SpiceError
from pages import chat_check, figures, models
from pages import chat_text as text
from pages import chat_settings
from pages.chat_auto import AutoTune
from pages.chat_controls import SETTINGS_JS, ChatControls
from pages.chat_fit import FittedStart
from pages.chat_reload import LEFT_DURING_CHECK, ReplyPanels
from pages.chat_switch import ModelSwitch
from pages.chat_js import (BUSY_OFF_JS, BUSY_ON_JS, NARROW_JS, SENT_JS, STOPPED_NOTE_JS, STOPPING_NOTE, TYPED_TEXT_JS,
                           started_js)
from pages.chat_keep import KeptChat
from pages.chat_session import (WITHDRAWN_CHAT_NOTE, WITHDRAWN_NOTE, ChatSession, Withdraw,  # noqa: F401 - re-exported
                                 gate_of)
from pages.common import (ENGINE_GROUP, LORE_RANKS, SETTING_FIELDS, AppContext, ChatHistory, as_plot,
                          default_settings, settings_from_values, spice_error_text)
from pages.limits import strict_bool
from pages.live import LiveRun
from pages.messages import (TRANSIENT_TAG, as_shown, as_typed, clean_message, content_text, cut_at_last_user,
                            engine_turns, keep_newest, normalize_history, note, problem_with, reply, run_note,
                            shown_text, transient_note, typed_text, untag_replies, without_transient)
from pages.owners import esc, owner_of
from pages.runner import CANCEL_REASONS
from pages.tuning import TuneBook

log = logging.getLogger(__name__)

# Why these rates: a Plotly redraw costs the browser 90-800 ms on a small machine; re-sending whole
# figures at 2 Hz kept its main thread busy nearly all the time (typing and Stop lagged by 20 s and
# more). Now each panel's figure is sent once per reply, then only its changes, at most once a second;
# the browser drops intermediate changes when drawing takes it long (assets/static/spice_live.js).
DELTA_INTERVAL_S = 1.0      # panel changes at most once a second
BASE_DELAY_S = 0.6          # the panels' figures go out one by one, this far apart, after the first token
STATS_INTERVAL_S = 1.0      # the numbers row at most once a second
TEXT_INTERVAL_S = 0.2       # the reply's text at most 5 times a second (tokens keep their own pace)
PANELS = ("heatmap", "prefetch", "gantt")   # in output order
PLACEHOLDERS = {"heatmap": "send a message to see which experts each token uses",   # before a reply's figures
                "prefetch": "prefetches appear here while a reply streams",
                "gantt": "lane activity appears here while a reply streams"}
WAITING_LIVE = "this reply's panel is drawn from its first tokens"
WAITING_END = "this reply's panel is drawn when it ends (live panel updates are off)"
TAKE_TIMEOUT_S = 0.1        # how long the chat loop waits for the next token before checking notices
STOP_WAIT_S = 120.0         # Stop's note waits this long at most for the stopped reply to end (one token, or a prefill)
CURSOR = " ▍"
# The shipped model writes short stories (it was trained on stories) about an animal and a thing from its
# generator's words; these three get three different plots, each ending by itself in 130-160 tokens
# (tests/app/test_app_examples.py). A keeper, a storm or a key are words it never learned.
EXAMPLES = ["Tell me a story about a cat and a ball.",
            "Tell me a story about a fox and a drum.",
            "Tell me a story about a rabbit and a hat."]
STATIC = Path(__file__).resolve().parents[1] / "assets" / "static"
LIVE_JS = (STATIC / "spice_live.js").read_text()


class ChatPage(chat_settings.SettingsEvents):
    """Builds the main page's components and owns their handlers (the settings' in SettingsEvents)."""

    def __init__(self, ctx: AppContext, tunes: TuneBook | None = None) -> None:
        self.ctx = ctx
        self.auto = AutoTune(self, tunes if tunes is not None else TuneBook())     # shared with the sweep (app.py)
        self.switch = ModelSwitch(self)     # the picker keeps the visitor's settings (pages.chat_switch)
        self.info = ctx.info
        self._heights: dict[str, int] = {}     # each panel's height for this model (`_panel_height`)
        defaults = default_settings(ctx.info)
        ranks = tuple(getattr(ctx.info, "lore_ranks", ()) or LORE_RANKS)
        if defaults.lore_rank not in ranks:       # the row must say what the control shows
            defaults = replace(defaults, lore_rank=ranks[-1])
        self.defaults = defaults
        self.reload = ReplyPanels(ctx, defaults, PANELS, PLACEHOLDERS)    # the last reply's panels after a reload
        self.keep = KeptChat(self, CURSOR)      # the conversation and settings this tab keeps in the browser
        self._settings_lock = threading.Lock()     # a Send and a settings event may apply the same requests

    # --- layout --------------------------------------------------------------------------
    def build(self) -> None:
        info, d = self.info, self.defaults
        self.session = gr.State(ChatSession())   # deep-copied per browser session
        self.keep.build()
        # The settings in use, as the browser keeps them beside the conversation (pages.chat_js); never typed into.
        self.kept_settings = gr.Textbox(chat_settings.settings_json(d), visible="hidden", show_label=False,
                                        container=False, interactive=False, elem_id="spice-kept-settings")
        self.withdraw = Withdraw()      # Stop and New chat take back a message still waiting for the engine
        with gr.Sidebar(label="Settings", open=True, width=330, elem_id="spice-controls"):
            self.model_picker = models.picker(self.ctx.models, info.model_name, "chat", navigate=False)
            self.ctl = ChatControls(info, d, self.ctx.limits)
            self.auto.build()
        self.banner = gr.Markdown(self._banner(d), elem_id="spice-banner", elem_classes=["spice-banner"])
        with gr.Row(equal_height=False):
            with gr.Column(scale=5, min_width=380):
                self.chatbot = ChatHistory(
                    label=f"Chat with {info.model_name}", height=430, elem_id="spice-chat", buttons=["copy"],
                    editable="user",
                    placeholder=f"**{info.model_name} writes short stories.** Ask for one (“Tell me a story "
                                "about …”). Replies stream token by token; the panels show which experts each "
                                "token used and where its time went. Settings are in the side bar.")
                with gr.Row(equal_height=True):
                    self.msg = gr.Textbox(label="Message", placeholder="Type a message and press Enter", show_label=False, lines=1,
                                          max_lines=6, scale=8, autofocus=True, elem_id="spice-msg")
                    # Stop replaces Send while a reply streams (CSS on body.spice-generating).
                    self.send = gr.Button("Send", variant="primary", scale=1, min_width=70, elem_id="spice-send")
                    self.stop = gr.Button("■ Stop", variant="secondary", scale=1, min_width=70, elem_id="spice-stop")
                # What the shared engine does for other visitors (app.py keeps it current), where one looks on Send.
                self.engine_status = gr.Markdown("", elem_id="engine-status", elem_classes=["spice-note"])
                with gr.Row(equal_height=False):
                    gr.Examples(EXAMPLES, inputs=[self.msg], label="Try a story")
                    self.new_chat = gr.Button("New chat", size="sm", scale=0, min_width=100, elem_id="spice-new")
            with gr.Column(scale=6, min_width=420):
                self.stats = gr.HTML(text.stats_html(None, d, self.info), elem_id="spice-stats")
                self.gantt = gr.Plot(as_plot(figures.empty_figure(PLACEHOLDERS["gantt"])),
                                     label="Lanes: GPU, copy stream, CPU workers (last 2 tokens)",
                                     elem_id="spice-gantt")
        self.heatmap = gr.Plot(as_plot(figures.empty_figure(PLACEHOLDERS["heatmap"])),
                               label="Experts per layer: this token, and all tokens so far", elem_id="spice-heatmap")
        self.prefetch = gr.Plot(as_plot(figures.empty_figure(PLACEHOLDERS["prefetch"])),
                                label="Prefetch timeline and lookahead", elem_id="spice-prefetch")
        # Panel changes for the browser (JSON); rendered but hidden: its change event runs spice_live.js.
        self.live_delta = gr.Textbox("", visible="hidden", elem_id="spice-live-delta", show_label=False,
                                     container=False, interactive=False)
        self._wire()

    @property
    def controls(self) -> list:
        return self.ctl.values

    def _wire(self) -> None:
        outputs = [self.msg, self.chatbot, self.stats, self.heatmap, self.prefetch, self.gantt, self.live_delta]
        # The browser's Send uses the settings applied (with the requests it carries); the API names them all.
        chat_inputs = [self.msg, self.chatbot, self.ctl.requests, self.ctl.live_panels, self.ctl.check_exact,
                       self.withdraw.gate_box, self.session]
        api_inputs = [self.msg, self.chatbot, *self.controls, self.ctl.live_panels, self.ctl.check_exact, self.session]
        triggers = [self.msg.submit, self.send.click]
        # Listed first and browser-only: Stop replaces Send at once, before the first token arrives.
        gr.on(triggers, None, js=BUSY_ON_JS, queue=False, api_visibility="private", show_progress="hidden")
        sent = gr.on(triggers, self.chat_browser, inputs=chat_inputs, outputs=outputs, api_visibility="private",
                     js=SENT_JS, concurrency_id=ENGINE_GROUP, concurrency_limit=1, show_progress="minimal",
                     show_progress_on=[self.chatbot])
        self._after_reply(sent)
        chat_events = [sent]
        # The API's endpoints hang on buttons nobody sees (an API call names every setting).
        api_chat, api_settings = gr.Button(visible=False), gr.Button(visible=False)
        api_chat.click(self.chat_event, inputs=api_inputs, outputs=outputs, api_name="chat" + self.ctx.key,
                       concurrency_id=ENGINE_GROUP, concurrency_limit=1, show_progress="hidden")
        api_settings.click(self.settings_event, inputs=[*self.controls, self.session],
                           outputs=[self.ctl.note, self.banner, self.stats], queue=False,
                           api_name="settings" + self.ctx.key, show_progress="hidden")
        # The browser runs a trigger's listeners in order, waiting for each. While a reply streams it skips
        # the chat listener (trigger mode "once") and runs this one at once, which says why nothing happens;
        # on a first send it runs after the reply, finds nothing streaming and does nothing. Listed after
        # the chat so that a first send pays no extra round trip before its first token.
        gr.on(triggers, self.note_if_busy, inputs=[self.session], outputs=None, queue=False,
              api_visibility="private", show_progress="hidden")
        # Retry and edit put the last (or edited) user message back and send it again.
        for event, handler in ((self.chatbot.retry, self.prepare_retry), (self.chatbot.edit, self.prepare_edit)):
            again = event(handler, inputs=[self.chatbot, self.session], outputs=[self.msg, self.chatbot],
                          queue=False, api_visibility="private", show_progress="hidden")
            again = again.success(None, js=BUSY_ON_JS, queue=False, api_visibility="private")
            again = again.then(self.chat_browser, inputs=chat_inputs, outputs=outputs, js=SENT_JS,
                               concurrency_id=ENGINE_GROUP, concurrency_limit=1, show_progress="minimal",
                               show_progress_on=[self.chatbot], api_visibility="private")
            self._after_reply(again)
            chat_events.append(again)
        stopped = self.stop.click(self.stop_reply, inputs=[self.session], outputs=[self.ctl.note], queue=False,
                                  api_name="stop" + self.ctx.key, show_progress="hidden")
        self.withdraw.after(stopped.then(self.gate_now, inputs=[self.session], outputs=self.withdraw.boxes,
                                         queue=False, api_visibility="private", show_progress="hidden"))
        stopped.then(self.after_stop, inputs=[self.session], queue=False, api_visibility="private",
                     show_progress="hidden").then(None, inputs=[self.ctl.note], outputs=[self.ctl.note],
                                                  js=STOPPED_NOTE_JS, queue=False, api_visibility="private")
        self.auto.wire(BUSY_ON_JS, BUSY_OFF_JS)
        self.withdraw.wire([*chat_events, self.auto.ran], BUSY_OFF_JS)
        self.switch.wire(self.model_picker)
        # Each control applies alone: a slider's requests (SETTINGS_JS), a menu or checkbox when it changes.
        sliders = list(self.ctl.sliders.values())
        applied = [self.ctl.requests.change(self.on_requests, inputs=[self.ctl.requests, self.session],
                                            outputs=[self.ctl.note, self.banner, self.stats, *sliders], queue=False,
                                            trigger_mode="multiple", api_visibility="private", show_progress="hidden")]
        for name, control in self.ctl.others.items():
            applied.append(control.change(self._on_control(name), inputs=[control, self.session],
                                          outputs=[self.ctl.note, self.banner, self.stats], queue=False,
                                          api_visibility="private", show_progress="hidden"))
        for event in applied:           # the settings in use, kept by the browser with the conversation
            self._keep_settings(event)
        self.auto.note.change(self.settings_kept, inputs=[self.session], outputs=[self.kept_settings], queue=False,
                              api_visibility="private", show_progress="hidden")      # Auto's pick, once applied
        # "New chat" and the chat's own 🗑 do the same thing: stop the reply, clear chat and panels.
        for event, name in ((self.new_chat.click, "new_chat" + self.ctx.key), (self.chatbot.clear, None)):
            cleared = event(self.clear, inputs=[self.session], outputs=[*outputs, *self.withdraw.boxes], queue=False,
                            show_progress="hidden", **({"api_name": name} if name else {"api_visibility": "private"}))
            self.withdraw.after(cleared)
            self._after_reply(cleared)
        # The sent message leaves the box when its reply starts, what was typed since stays (pages.chat_js).
        self.chatbot.change(None, inputs=[self.chatbot], outputs=None, js=started_js(CURSOR), queue=False,
                            api_visibility="private", show_progress="hidden")
        self.live_delta.change(None, inputs=[self.live_delta], outputs=None, js=LIVE_JS, queue=False,
                               api_visibility="private", show_progress="hidden")
        root = gr.context.Context.root_block
        if root is not None:
            root.load(None, js=NARROW_JS, queue=False, api_visibility="private", show_progress="hidden")
            root.load(None, js=SETTINGS_JS, queue=False, api_visibility="private", show_progress="hidden")
            root.load(None, js=TYPED_TEXT_JS, queue=False, api_visibility="private", show_progress="hidden")
        self.keep.wire()        # what this tab kept comes back; what the page shows is kept (pages.chat_keep)

    def _after_reply(self, event) -> None:
        """When a reply (or a clear) ends: Send comes back, and the browser keeps the conversation (an empty one
        after a clear)."""
        event.then(None, js=BUSY_OFF_JS, queue=False, api_visibility="private", show_progress="hidden")
        self.keep.after(event)
        self._keep_settings(event)      # a Send applies the slider requests it carries
        event.then(None, inputs=[self.ctl.note], outputs=[self.ctl.note], js=STOPPED_NOTE_JS, queue=False,
                   api_visibility="private", show_progress="hidden")

    def _keep_settings(self, event) -> None:
        """After ``event``: the settings in use into the box the browser keeps with the conversation."""
        event.then(self.settings_kept, inputs=[self.session], outputs=[self.kept_settings], queue=False,
                   api_visibility="private", show_progress="hidden")

    # --- handlers ------------------------------------------------------------------------
    def on_unload(self, request: gr.Request) -> None:
        """The tab closed: free the engine if this session's reply is still running."""
        if request is not None and request.session_hash:
            self.ctx.runner.cancel_owner(request.session_hash, "closed")

    def note_if_busy(self, session: ChatSession) -> None:
        busy_id = TRANSIENT_TAG + "busy"
        if session.streaming() and not any(n.get("metadata", {}).get("id") == busy_id for n in session.notices):
            session.notices.append(transient_note("⚠ Still answering your previous message: your new one stays in "
                                                  "the box. Press Stop to end this reply, or send it when the reply "
                                                  "is done.", kind="busy"))

    def after_stop(self, session: ChatSession) -> None:
        """Returns once the reply Stop stopped has ended; the page then swaps a "Stopping…" note still shown for the
        settings hint (STOPPED_NOTE_JS, as `_after_reply` does): on a loaded server Stop's answer could reach the page
        after the reply's end had checked the note, and the note stayed for good."""
        session.wait_until_idle(STOP_WAIT_S)

    def stop_reply(self, session: ChatSession) -> str:
        session.withdrew = False
        if session.streaming():
            session.stream.cancel("stop")
            return STOPPING_NOTE
        if self.auto.stop(session):
            return "Stopping the tune after the setting it is measuring…"
        session.gate += 1           # a message this page sent that still waits for the engine will not run
        session.withdrew = True
        return WITHDRAWN_NOTE

    @staticmethod
    def gate_now(session: ChatSession) -> tuple[str, str]:
        """The gate box and the withdrawn box (`build`) after Stop."""
        return str(session.gate), "1" if session.withdrew else ""

    @staticmethod
    def new_session() -> ChatSession:
        return ChatSession()

    def clear(self, session: ChatSession):
        session.epoch += 1
        session.gate += 1           # a message sent before New chat and still waiting for the engine never runs
        session.cleared_gate = session.gate
        session.withdrew = not session.streaming()
        if session.streaming():
            session.stream.cancel("stop")
        session.notices.clear()
        session.last_view = {}
        return (*self._emptied(session, clear_text=True), str(session.gate), "1" if session.withdrew else "")

    def _emptied(self, session: ChatSession, clear_text: bool = False) -> tuple:
        """The page after New chat: an empty chat, the numbers row for the next message, the panels' placeholders
        (as on a fresh page). A reply that sees New chat ends on it (leaving what was typed since): its outputs
        already under way could reach the browser after New chat's own and bring the old reply back (they did,
        about once in ten New chats mid-reply)."""
        stats = text.stats_html(None, session.settings or self.defaults, self.info)
        return ("" if clear_text else gr.skip(), [], stats,
                *(as_plot(figures.empty_figure(PLACEHOLDERS[name])) for name in PANELS), "")

    def prepare_retry(self, history, session: ChatSession):
        """Retry: drop the last reply and send the last user message again (as it was typed)."""
        cut = None if session.streaming() else cut_at_last_user(history)
        if cut is None:
            raise gr.Error("Nothing to retry yet.", print_exception=False)
        history, at = cut
        return typed_text(history[at]["content"]), history[:at]

    def prepare_edit(self, history, session: ChatSession, edit: gr.EditData):
        """Edit: replace a user message by its edited text and send it again (later turns are dropped). The page's
        edit box holds the text as typed and gives it back escaped, for the chat to show it literally until this
        answers (assets/static/spice_chat_text.js): `typed_text` gives what the visitor typed, backslashes included."""
        index = edit.index if isinstance(edit.index, int) else (edit.index[0] if edit.index else None)
        cut = None if session.streaming() else cut_at_last_user(history, index)
        if cut is None:
            raise gr.Error("Only your own messages can be edited, when no reply is streaming.", print_exception=False)
        history, at = cut
        value = edit.value if isinstance(edit.value, str) else content_text(edit.value)
        return typed_text(value), history[:at]

    def chat_event(self, message, history, policy, cache_frac, tau_prefetch, tau_approx, max_lookahead, lore_rank,
                   cpu_lane, profile, shape, max_new_tokens, temperature, live_panels, check_exact, session,
                   request: gr.Request = None):
        """The /chat event: Gradio passes the request only to positional parameters, so they are spelled out
        here (the visitor's identity comes from it, see pages.owners). An API client sends and gets plain text:
        the history it gives and gets back holds what was typed and generated, never the chat's escaped copy."""
        for out in self.chat(message, as_shown(history), policy, cache_frac, tau_prefetch, tau_approx,
                             max_lookahead, lore_rank, cpu_lane, profile, shape, max_new_tokens, temperature,
                             live_panels, check_exact, session, request=request, whole_panels_at_end=True):
            yield (out[0], as_typed(out[1]), *out[2:]) if isinstance(out[1], list) else out

    def chat_browser(self, message, history, requests, live_panels, check_exact, gate, session,
                     request: gr.Request = None):
        """Send in the browser: the reply uses the settings applied, after the slider requests this Send carries
        (a box finished by the click on Send counts), never what the boxes show."""
        if isinstance(session, ChatSession):
            with self._settings_lock:
                self._take_requests(requests, session)
            applied = session.settings or self.defaults
        else:
            applied = self.defaults
        values = [getattr(applied, f) for f in SETTING_FIELDS]
        yield from self.chat(message, history, *values, live_panels, check_exact, session, request=request,
                             box_in_browser=True, gate=gate_of(gate))

    def chat(self, message, history, *args, request: gr.Request = None, box_in_browser: bool = False,
             gate: int | None = None, whole_panels_at_end: bool = False):
        """Stream one reply. Yields (textbox, chat, stats, heatmap, prefetch timeline, lane chart). The reply's
        first update empties the textbox, except for the browser's Send, whose page takes the sent text off the
        box itself and keeps what was typed since (pages.chat_js). ``gate``: the session gate the page showed when
        it sent the message (`ChatSession.withdrawn`; None: not checked). ``whole_panels_at_end``: the last update
        carries every panel's whole figure, never the changes only the page's script applies (an API client)."""
        *values, live_panels, check_exact, session = args
        if not isinstance(session, ChatSession):           # API callers cannot break the state
            session = ChatSession()
        history = without_transient(normalize_history(history))     # a note about the last action goes now
        history, cut = keep_newest(history, self.ctx.limits.history_max_messages)
        skip = gr.skip()

        def only_chat(h, title):        # the message stays in the box, to be fixed; the note replaces the last one
            return (skip, h + [transient_note(title)], skip, skip, skip, skip, skip)

        def withdrawn_update(h, why):   # New chat since: the page is already empty, write nothing over it
            return (skip,) * 7 if why == "cleared" else only_chat(h, WITHDRAWN_CHAT_NOTE)

        why = session.withdrawn(gate)
        if why:
            yield withdrawn_update(history, why)
            return

        try:
            settings = settings_from_values(self.info, dict(zip(SETTING_FIELDS, values)), self.ctx.limits)
            live_panels = strict_bool(live_panels, "Update the panels while a reply streams (live_panels)")
            check_exact = strict_bool(check_exact, "Measure greedy agreement (check_exact)")
        except SpiceError as exc:
            yield only_chat(history, f"⚠ Settings not applied: {esc(spice_error_text(exc))}")
            return
        session.settings = settings
        raw_len = len(message) if isinstance(message, str) else 0
        cleaned = clean_message(message)
        problem = problem_with(cleaned, raw_len, self.ctx.max_message_chars, self.info.max_context_tokens)
        if problem:
            yield only_chat(history, f"⚠ Message not sent: {problem}")
            return
        if session.streaming():
            yield only_chat(history, "⚠ Still answering your previous message: wait for it to finish or press "
                                     "Stop, then send again.")
            return
        if cut:
            history.append(note(f"ℹ Kept the newest {len(history)} messages of this chat",
                                f"{cut} older messages were dropped: the app keeps at most "
                                f"{self.ctx.limits.history_max_messages}. Press New chat to start afresh."))
        user_at = len(history)
        history.append({"role": "user", "content": shown_text(cleaned.text)})     # shown as typed, never as HTML
        if cleaned.removed:
            history.append(note(f"ℹ Removed {cleaned.removed} control character"
                                f"{'s' if cleaned.removed > 1 else ''} (e.g. {cleaned.example}) before sending"))
        turns = engine_turns(history)
        owner = (request.session_hash if request is not None else None) or f"session-{id(session)}"
        session.owner = owner_of(request) or owner
        epoch = session.epoch
        try:
            fit = FittedStart(self.ctx.engine, turns, settings, self.info.max_context_tokens)
            stream = self.ctx.runner.start(owner, settings, fit, kind="chat reply")
            turns, dropped = fit.turns, fit.dropped
        except SpiceError as exc:     # not sent: the text stays in the box to be fixed
            refused = [m for m in history if m.get("role") != "user" or m is not history[user_at]]
            yield only_chat(refused, f"⚠ The engine refused this message: {esc(spice_error_text(exc))}")
            return
        why = session.withdrawn(gate)
        if why:         # Stop or New chat while the engine was still busy with another visitor's reply
            stream.cancel("stop")
            yield withdrawn_update(history[:user_at], why)
            return
        session.stream = stream
        self.reload.remember(stream)
        session.notices.clear()
        self.ctx.label_run(stream.run_id, "chat: " + text.preview(cleaned.text), session.owner)
        if dropped:
            history.append(note(f"ℹ Left out the {dropped} oldest exchange{'s' if dropped > 1 else ''} to fit the "
                                f"model's context ({self.info.max_context_tokens:,} tokens) with room for the reply"))
        reply_at = len(history)
        history.append(reply(CURSOR, stream.run_id))
        live = LiveRun.for_engine(self.info)
        # The last reply's panels go now: left up, they read as this reply's (review). Live, this reply's own come
        # from its first tokens; otherwise when it ends.
        waiting = WAITING_LIVE if live_panels else WAITING_END
        yield (skip if box_in_browser else "", history, text.stats_html(live, settings, self.info, state="starting"),
               *(as_plot(figures.empty_figure(waiting, self._panel_height(name))) for name in PANELS), "")

        first_wall = None
        # The panels' figures go out once (tagged with `meta`), then only their changes; text at most
        # every TEXT_INTERVAL_S, numbers every STATS_INTERVAL_S, panel changes every DELTA_INTERVAL_S.
        tag = f"{stream.run_id or id(stream)}-{time.monotonic_ns()}"
        base_due: list[float] = []          # when each panel's figure goes out: one at a time, after the text
        seq = 0
        text_due = stats_due = delta_due = 0.0
        text_dirty = panels_dirty = False
        try:
            while True:
                steps, ended = stream.take(TAKE_TIMEOUT_S)
                if session.epoch != epoch:                  # "New chat" was pressed: stop writing here
                    stream.cancel("stop")
                    yield self._emptied(session)
                    return
                for step in steps:
                    live.add(step)
                if steps and first_wall is None:
                    first_wall = time.perf_counter()
                while session.notices:
                    history.append(session.notices.pop(0))
                    text_dirty = True
                text_dirty |= bool(steps)
                panels_dirty |= bool(steps)
                if ended:
                    break
                now = time.monotonic()
                out = [skip] * 7
                if text_dirty and now >= text_due:
                    history[reply_at] = reply(shown_text(live.text) + CURSOR, stream.run_id)
                    out[1], text_due, text_dirty = history, now + TEXT_INTERVAL_S, False
                if live.n_tokens and now >= stats_due:
                    out[2] = text.stats_html(live, stream.settings, self.info, stream=stream,
                                             wall_tps=text.wall_tps(live, first_wall))
                    stats_due = now + STATS_INTERVAL_S
                if live_panels and live.n_tokens and not base_due:
                    base_due = [now + BASE_DELAY_S * (i + 1) for i in range(len(PANELS))]
                    delta_due = base_due[-1] + DELTA_INTERVAL_S
                for i, due in enumerate(base_due):
                    if due and now >= due:      # a drawn figure is what later changes apply to
                        out[3 + i] = as_plot(figures.panel_figure(PANELS[i], live, meta=f"{tag}:{PANELS[i]}", live_view=True))
                        base_due[i] = 0.0
                        break
                if base_due and not any(base_due) and panels_dirty:
                    if now >= delta_due:
                        seq += 1
                        out[6] = figures.panels_delta(live, tag, seq)
                        delta_due, panels_dirty = now + DELTA_INTERVAL_S, False
                if any(o is not skip for o in out):
                    yield tuple(out)
        finally:
            if not stream.done:
                stream.cancel("closed")
            if session.stream is stream:
                session.stream = None
        base_drawn = bool(base_due) and not any(base_due) and not whole_panels_at_end
        yield from self._finish(history, reply_at, live, stream, settings, session, turns, check_exact,
                                first_wall, live_panels, base_drawn, tag, seq, epoch)

    def _finish(self, history, reply_at, live, stream, settings, session, turns, check_exact, first_wall,
                live_panels=False, base_drawn=False, tag="", seq=0, epoch=0):
        skip = gr.skip()
        summary = stream.summary()
        session.last_run_id = stream.run_id
        history[reply_at] = reply(shown_text(live.text), stream.run_id)
        if not live.text.strip():
            history.pop(reply_at)
            if not stream.error and stream.cancel_reason != "stop":
                history.append(note("ℹ The model ended its reply without any text",
                                    f"It produced {live.n_tokens} token{'s' if live.n_tokens != 1 else ''} "
                                    f"(finish: {summary.finish_reason if summary else '?'}). Try rephrasing."))
        if stream.error:
            history.append(note("⚠ The reply stopped early" if live.n_tokens else "⚠ No reply", stream.error))
        elif stream.cancel_reason == "stop":
            history.append(note(f"■ Stopped after {live.n_tokens} token{'s' if live.n_tokens != 1 else ''}"))
        elif stream.cancel_reason in CANCEL_REASONS:
            history.append(note(f"■ This reply was stopped after {live.n_tokens} token"
                                f"{'s' if live.n_tokens != 1 else ''}", f"Why: {CANCEL_REASONS[stream.cancel_reason]}."))
        if stream.changes:
            history.append(note("Settings changed during this reply", text.changes_text(stream)))
        finish = (summary.finish_reason if summary else "") or ""
        if finish == "length" and live.text.strip():       # a token limit ended it: always said, trimmed or not
            shown, said = text.at_limit(live.text, live.n_tokens, stream.settings.max_new_tokens,
                                        self.info.max_context_tokens)
            history[reply_at] = reply(shown_text(shown), stream.run_id)
            history.append(note(said))
        tps = text.wall_tps(live, first_wall)
        # From every setting the reply ran with: a τ_approx raised mid-reply makes it lossy.
        agreement = text.agreement_line(settings, check_exact, stream.changes, device=self.info.device)
        self.reload.remember(stream, tps, agreement or LEFT_DURING_CHECK)     # kept if the page goes meanwhile
        if agreement is None and live.n_tokens:
            checking = text.stats_html(live, stream.settings, self.info, stream=stream, summary=summary, wall_tps=tps,
                                       agreement=("checking…", "re-running with exact settings"))
            yield skip, history, checking, skip, skip, skip, skip
            agreement = chat_check.check_exact(self.ctx, turns, stream.settings, live, session, stream.owner)
            if session.epoch != epoch:      # "New chat" during the check
                yield self._emptied(session)
                return
        if summary is not None and live.n_tokens:
            history.append(run_note(text.run_title(summary, live), text.run_body(summary, stream), stream.run_id))
        untag_replies(history)      # the run note names the run now
        final = text.stats_html(live, stream.settings, self.info, stream=stream, summary=summary, wall_tps=tps,
                                agreement=agreement)
        session.last_view = {"live": live, "settings": stream.settings, "stream": stream, "summary": summary,
                             "wall_tps": tps, "agreement": agreement}
        self.reload.remember(stream, tps, agreement)
        # The textbox was cleared when the message was sent; what the user typed since stays. Panels the
        # browser drew live get their last changes (cheap), but the heatmap comes whole: its per-expert counts
        # (the right grid's hover) are in no change (with live panels on they never arrived); otherwise the
        # whole figures, once.
        if live_panels and base_drawn and live.n_tokens:
            yield (skip, history, final, as_plot(figures.panel_figure("heatmap", live)), skip, skip,
                   figures.panels_delta(live, tag, seq + 1))
        else:
            yield (skip, history, final, *self._panels(live), "")

    def _panel_height(self, name: str) -> int:
        """A panel's height for this model (its figure drawn empty), so a placeholder in its place does not make the
        page jump (review); 260 px where that figure cannot be drawn."""
        if name not in self._heights:
            try:
                self._heights[name] = int(figures.panel_figure(name, LiveRun.for_engine(self.info))["layout"]["height"])
            except Exception:       # noqa: BLE001 - a placeholder's height is cosmetic
                self._heights[name] = 260
        return self._heights[name]

    def _panels(self, live: LiveRun):
        return tuple(as_plot(figures.panel_figure(name, live)) for name in PANELS)

    def _banner(self, settings: RunSettings) -> str:
        i = self.info
        return (f"### SPICE · `{i.model_name}`\n{self.ctx.describe_timing(settings)} · {i.family}, "
                f"{len(i.moe_layers)} MoE layers × {i.n_experts} experts, top-{i.top_k}"
                f"{'' if i.has_draft else ' · no draft heads (gate predictor)'}"
                f"{'' if i.has_lore else ' · no LoRE factors (approximation off)'}")


def build(ctx: AppContext, tunes: TuneBook | None = None) -> ChatPage:
    """The main page's components in the caller's Blocks context; returns the page (for unload)."""
    page = ChatPage(ctx, tunes)
    page.build()
    return page
