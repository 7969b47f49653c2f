"""The chat side bar's "Auto (within budget)", and the sweep's "use this setting in chat" arriving here.

    Auto ──► the side bar's slider requests, then session.settings (as a Send takes them) ──► base
         ──► pages.tuning.run (a pick already made for this model, cache, profile, shape and budget is reused;
             else a tune, a job of the runner in the engine group; the chat's Stop ends it between settings)
         ──► the pick ──► apply: the chat's own settings path (SettingsEvents._use / _report): the numbers row
             says what the next message uses, the controls show it, and the side bar says which setting was
             picked and why (the record's reason)
    page load ──► TuneBook.take_for_chat(visitor) (a pick the sweep page handed over) ──► apply, the same way
              └─ else a pick saved beside the model for this cache, profile and shape (TuneBook.saved_for) ──►
                 the side bar offers it: Auto with its budget and reply length finds it in the book and applies it,
                 without a tune; one whose quality was never confirmed on replies as long as this session's is
                 offered with that caveat, and Auto tunes again instead of applying it (pages.tuning)

Whatever is applied, the side bar says what its quality stands on, and warns when the pick is not known to be
within its budget for this session's replies (a max new tokens above the length it was confirmed for).

Knows the chat page only through what it hands over (its session, controls, lock and settings handlers).
"""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from spice_core.errors import SpiceError
from pages import tuning
from pages.common import ENGINE_GROUP, SETTING_FIELDS, FreeNumber, settings_from_values, spice_error_text
from pages.owners import esc, owner_of


@dataclass
class AutoState:
    """One chat session's tune: running, and whether Stop was pressed."""

    running: bool = False
    stop: bool = False
    applied: object = None      # the TuneRecord last applied to the chat (Auto, or the sweep's hand-off), while its
                                # knobs are the chat's: a later setting change is checked against it (tuning.in_use_caveat)


class AutoTune:
    """Built inside the chat's side bar, under its controls; ``page`` is the pages.chat.ChatPage."""

    def __init__(self, page, tunes: tuning.TuneBook) -> None:
        self.page, self.ctx, self.book = page, page.ctx, tunes
        tunes.offer_saved(self.ctx.key, self.ctx.info)

    def build(self) -> None:
        with gr.Group(elem_id="ctl-auto-group"):
            gr.Markdown("**Auto (within budget)**: the fastest spice setting for this model, cache, profile and "
                        "shape whose measured quality keeps the budget on replies as long as your max new tokens "
                        f"(a tune takes {tuning.APP_TUNE_WORDS} here, once per cache, profile, shape, budget and reply "
                        "length).",
                        elem_classes=["spice-note"], padding=True)
            with gr.Row():
                self.ppl = FreeNumber(tuning.DEFAULT_PPL_PCT, label="Perplexity +% at most", minimum=0,
                                      maximum=tuning.MAX_PPL_PCT, step=0.1, min_width=100, elem_id="ctl-budget-ppl")
                self.agreement = FreeNumber(tuning.DEFAULT_AGREEMENT, label="Agreement at least", minimum=0,
                                            maximum=1, step=0.01, min_width=100, elem_id="ctl-budget-agreement")
            self.button = gr.Button("Auto (within budget)", size="sm", elem_id="ctl-auto")
        self.note = gr.Markdown("", elem_id="ctl-auto-note", elem_classes=["spice-note"])

    def wire(self, busy_on_js: str, busy_off_js: str) -> None:
        p = self.page
        outputs = [self.note, p.ctl.note, p.banner, p.stats, *p.controls]
        # Stop replaces Send while the tune runs (a message sent now would wait for it in the engine's queue).
        self.button.click(None, js=busy_on_js, queue=False, api_visibility="private", show_progress="hidden")
        ran = self.button.click(self.auto, inputs=[self.ppl, self.agreement, p.ctl.requests, p.session],
                                outputs=outputs, api_name="auto" + self.ctx.key, concurrency_id=ENGINE_GROUP,
                                concurrency_limit=1, show_progress="minimal", show_progress_on=[self.note])
        ran.then(None, js=busy_off_js, queue=False, api_visibility="private", show_progress="hidden")
        self.ran = ran          # the chat's withdraw cancels a tune still waiting in the engine's queue
        root = gr.context.Context.root_block
        if root is not None:
            root.load(self.adopt, inputs=[p.session], outputs=outputs, queue=False, api_visibility="private",
                      show_progress="hidden")

    # --- handlers ------------------------------------------------------------------------
    def stop(self, session) -> bool:
        """The chat's Stop: True when it stopped this session's tune."""
        state = getattr(session, "auto", None)
        if state is not None and state.running:
            state.stop = True
            return True
        return False

    def auto(self, ppl, agreement, requests, session, request: gr.Request = None):
        p, skip = self.page, gr.skip()
        n_out = 4 + len(p.controls)
        if not hasattr(session, "auto"):         # API callers cannot break the state
            session = p.new_session()
        try:
            budget = tuning.budget(ppl, agreement)
        except SpiceError as exc:
            yield (f"⚠ Auto not run: {esc(spice_error_text(exc))}", *[skip] * (n_out - 1))
            return
        if "spice" not in self.ctx.info.policies:
            yield ("⚠ Auto not run: this engine offers no spice policy, so there is nothing to tune.",
                   *[skip] * (n_out - 1))
            return
        if session.streaming():
            yield ("⚠ Auto not run: a reply is still streaming. Wait for it or press Stop, then press Auto again.",
                   *[skip] * (n_out - 1))
            return
        with p._settings_lock:
            p._take_requests(requests, session)        # the sliders' values, as a Send takes them
            base = session.settings or p.defaults
        owner = (request.session_hash if request is not None else None) or f"session-{id(session)}"
        session.auto.running, session.auto.stop = True, False
        try:
            record, how = yield from tuning.shown(
                tuning.run(self.ctx, self.book, owner, base, budget, lambda: session.auto.stop),
                lambda line: (esc(line), *[skip] * (n_out - 1)))
        finally:
            session.auto.running = False
            self.ctx.runner.cancel_owner(owner, "closed")     # the page went away mid-tune: free the engine
        if record is None:
            yield (f"⚠ Auto found no setting: {esc(spice_error_text(how))}", *[skip] * (n_out - 1))
            return
        if record.stopped:      # Stop means "do not change my settings": the best so far is shown, not applied
            yield ("■ Auto stopped: your settings are unchanged. The best setting measured before the stop, for "
                   "reference:  \n" + tuning.pick_markdown(record, how, base.max_new_tokens), *[skip] * (n_out - 1))
            return
        yield self.apply(session, record, how)

    def adopt(self, session, request: gr.Request = None):
        """Page load: a pick the sweep page handed to this visitor's chat, applied; else one saved beside the
        model for this session's cache, profile and shape, offered in the side bar; else nothing changes."""
        skip = gr.skip()
        n_out = 4 + len(self.page.controls)
        if not hasattr(session, "auto"):
            return (skip,) * n_out
        record = self.book.take_for_chat(owner_of(request) + self.ctx.key) if owner_of(request) else None
        if record is not None:
            return self.apply(session, record, "from the sweep page")
        settings = session.settings or self.page.defaults
        kept = self.book.saved_for(self.ctx.key, settings)
        if kept is None:
            return (skip,) * n_out
        reply = settings.max_new_tokens
        then = ("Auto (within budget) with that budget applies it at once, without a tune."
                if tuning.reused_for(kept.record, reply) else
                f"Auto (within budget) does not apply it: it tunes again, re-measuring on replies of {reply} tokens.")
        return (esc(tuning.saved_markdown(kept, then, reply)), *[skip] * (n_out - 1))

    def apply(self, session, record, how: str) -> tuple:
        """The pick on top of the session's settings, through the chat's own settings path: (auto note, settings
        note, banner, numbers row, every control's value)."""
        p = self.page
        with p._settings_lock:
            before = session.requests.shown or p.defaults
            wanted = tuning.picked_settings(record, session.settings or p.defaults)
            try:
                settings = settings_from_values(p.info, {f: getattr(wanted, f) for f in SETTING_FIELDS},
                                                self.ctx.limits)
            except SpiceError as exc:      # a pick outside the chat's ranges: say so, change nothing
                return (f"⚠ The pick cannot be used here: {esc(spice_error_text(exc))}",
                        *[gr.skip()] * (3 + len(p.controls)))
            p._use(session, settings)
            note, banner, stats = p._report(session, before, [])
            session.auto.applied = record      # after the report: the auto note itself gives the pick's caveat
        controls = [gr.update(value=getattr(settings, f)) for f in SETTING_FIELDS]
        applied = "Applied to your next message. " if not session.replying() else \
            "τ_approx, τ_prefetch and max lookahead apply from the next token of this reply; the rest from your " \
            "next message. "
        return (applied + tuning.pick_markdown(record, how, settings.max_new_tokens), note, banner, stats, *controls)

