"""The sweep page's "fastest within a quality budget" section: a budget, a tune, the pick and its hand-off.

    budget boxes + the page's cache, profile, shape ──► tune (engine group; pages.tuning.run: a job of the
        runner, progress once a second, Stop between settings) ──► TuneRecord
                                                      ──► Pareto plot (every point labelled, ★ the pick),
                                                          table (fastest first, flagged), the pick in words
    The tune's replies are the chat's default length (pages.common.DEFAULT_CHAT_TOKENS), not the sweep's short runs:
    the pick is for the chat, and a lossy one is within the budget only for replies as long as it was confirmed on.
    "Use this setting in chat" ──► TuneBook.hand_to_chat(visitor) ──► the browser opens the chat page, whose
        load applies it through the chat's own settings path (pages.chat_auto.adopt)
    "Save this pick beside the model" ──► TuneBook.save_beside_model ──► spice-tuned.json in the model's folder
        (the CLI's file and format), one line saying where, or why not
    page load ──► a pick saved beside the model for the page's cache, profile and shape (TuneBook.saved_for)
        ──► shown as a tune's result is, ready to use in chat

Why a hand-off and not a write into the chat's state: the chat and the sweep are separate pages, each with
its own Gradio session; the visitor (pages.owners) is what they share.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import gradio as gr

from spice_core.errors import SpiceError
from pages import figures_tune
from pages.common import (DEFAULT_CHAT_TOKENS, ENGINE_GROUP, FreeNumber, as_plot, check_profile_and_shape,
                          spice_error_text)
from pages.limits import cache_share
from pages.owners import esc, owner_of
from pages import tuning

TUNING_ON_JS = "() => { document.body.classList.add('spice-tuning'); return []; }"
TUNING_OFF_JS = "() => { document.body.classList.remove('spice-tuning'); return []; }"
# The chat page of this model, relative to the sweep's own path ("/sweep" -> "/", "/sweep-x" -> "/x"), so
# that the app works under a root path too; the server says where (empty: nothing to open).
GO_JS = "(url) => { if (url) window.location.assign(url); return []; }"


@dataclass
class TuneSession:
    stop: bool = False
    running: bool = False
    reason: str = ""
    record: object = None         # the last pick shown (spice_core.api.TuneRecord)


class TuneSection:
    """Built inside the sweep page, after its cache, profile and shape controls (which the tune uses)."""

    def __init__(self, page) -> None:
        self.page, self.ctx = page, page.ctx
        self.book: tuning.TuneBook = page.tunes
        self.book.offer_saved(self.ctx.key, self.ctx.info)
        # The pick is for the chat ("Use this setting in chat"), so its quality is confirmed on replies as long as the
        # chat's by default, not on the sweep's short runs.
        self.reply_tokens = DEFAULT_CHAT_TOKENS

    def build(self) -> None:
        reply = self.reply_tokens
        gr.Markdown("### Fastest setting within a quality budget\nThe tuner searches spice's τ_approx, LoRE rank, "
                    "τ_prefetch, max lookahead and CPU lane for the fastest setting whose measured quality keeps "
                    "the budget, at the GPU cache size, hardware profile and model shape above. Quality: perplexity "
                    "and greedy agreement against the exact model on held-out text, screened on a short sample and "
                    f"re-measured on chat replies as long as the chat's ({reply} tokens) before a lossy setting counts "
                    "as within the budget (agreement over a few tokens runs high: replies diverge later); speed: "
                    f"{'measured' if self.ctx.info.default_timing == 'measured' else 'modeled'} ms per token. "
                    f"One tune of the shipped model takes {tuning.APP_TUNE_WORDS} on a 2-core machine.",
                    elem_id="tune-intro")
        self.session = gr.State(TuneSession())
        with gr.Row(equal_height=True):
            self.ppl = FreeNumber(tuning.DEFAULT_PPL_PCT, label="Perplexity increase at most (%)", minimum=0,
                                  maximum=tuning.MAX_PPL_PCT, step=0.1, elem_id="tune-ppl",
                                  info="empty: no perplexity limit")
            self.agreement = FreeNumber(tuning.DEFAULT_AGREEMENT, label="Greedy agreement at least", minimum=0,
                                        maximum=1, step=0.01, elem_id="tune-agreement", info="0–1; empty: no limit")
            self.run_btn = gr.Button("Find the fastest setting", variant="primary", elem_id="tune-run")
            self.stop_btn = gr.Button("Stop", variant="stop", elem_id="tune-stop")
        self.status = gr.Markdown("", elem_id="tune-status", elem_classes=["spice-note"])
        self.plot = gr.Plot(as_plot(figures_tune.tune_pareto(None)), label="Every setting the tuner measured "
                            "(★ the pick)", elem_id="tune-pareto")
        self.table = gr.Dataframe(figures_tune.tune_table(None), label="Settings measured, fastest first",
                                  interactive=False, elem_id="tune-table")
        self.pick = gr.Markdown("", elem_id="tune-pick")
        with gr.Row():
            self.use_btn = gr.Button("Use this setting in chat", interactive=False, elem_id="tune-use")
            self.save_btn = gr.Button("Save this pick beside the model", interactive=False, elem_id="tune-save")
            self.go = gr.Textbox("", visible="hidden", elem_id="tune-go", show_label=False, container=False)
        self.saved = gr.Markdown("", elem_id="tune-saved", elem_classes=["spice-note"])

    def wire(self, cache_frac, profile, shape) -> None:
        outputs = [self.status, self.plot, self.table, self.pick, self.use_btn]
        self.run_btn.click(None, js=TUNING_ON_JS, queue=False, api_visibility="private", show_progress="hidden")
        ran = self.run_btn.click(self.run, inputs=[self.ppl, self.agreement, cache_frac, profile, shape, self.session],
                                 outputs=outputs, api_name="tune" + self.ctx.key, concurrency_id=ENGINE_GROUP,
                                 concurrency_limit=1, show_progress="minimal", show_progress_on=[self.status])
        ran.then(None, js=TUNING_OFF_JS, queue=False, api_visibility="private", show_progress="hidden")
        ran.then(self.saveable, inputs=[self.session], outputs=[self.save_btn, self.saved], queue=False,
                 api_visibility="private", show_progress="hidden")
        self.stop_btn.click(self.stop, inputs=[self.session], outputs=[self.status], queue=False,
                            api_name="tune_stop" + self.ctx.key)
        used = self.use_btn.click(self.use_in_chat, inputs=[self.session], outputs=[self.status, self.go], queue=False,
                                  api_name="tune_use" + self.ctx.key)
        used.then(None, inputs=[self.go], js=GO_JS, queue=False, api_visibility="private", show_progress="hidden")
        self.save_btn.click(self.save, inputs=[self.session], outputs=[self.saved], queue=False,
                            api_name="tune_save" + self.ctx.key)
        root = gr.context.Context.root_block
        if root is not None:
            root.load(self.offer, inputs=[self.session], outputs=outputs, queue=False, api_visibility="private",
                      show_progress="hidden")

    # --- handlers ------------------------------------------------------------------------
    def stop(self, session: TuneSession) -> str:
        if isinstance(session, TuneSession) and session.running:
            session.stop = True
            return "Stopping after the setting being measured…"
        return "No tune is running."

    def run(self, ppl, agreement, cache_frac, profile, shape, session: TuneSession, request: gr.Request = None):
        skip = gr.skip()
        info = self.ctx.info
        if not isinstance(session, TuneSession):
            session = TuneSession()
        try:
            budget = tuning.budget(ppl, agreement)
            check_profile_and_shape(info, profile, shape)
            if "spice" not in info.policies:
                raise SpiceError("this engine offers no spice policy: there is nothing to tune")
            base = replace(self.page.defaults, policy="spice", profile=profile, shape=shape,
                           cache_frac=cache_share(cache_frac, info),
                           max_new_tokens=self.reply_tokens)
        except (SpiceError, TypeError, ValueError) as exc:
            yield f"⚠ Tune not started: {esc(spice_error_text(exc))}", skip, skip, skip, skip
            return
        session.stop, session.running, session.reason = False, True, ""
        page_session = getattr(request, "session_hash", None) or ""
        if page_session:
            self.page._running[page_session] = session      # the page's unload stops it (SweepPage.on_unload)
        owner = f"sweep-{id(session)}"
        started = time.perf_counter()
        try:
            record, how = yield from tuning.shown(
                tuning.run(self.ctx, self.book, owner, base, budget, lambda: session.stop),
                lambda line: (esc(line), skip, skip, skip, skip))
        finally:
            session.running = False
            if page_session and self.page._running.get(page_session) is session:
                del self.page._running[page_session]
            self.ctx.runner.cancel_owner(owner, "closed")
        if record is None:
            reason = f" ({session.reason})" if session.reason else ""
            yield f"⚠ No pick{reason}: {esc(spice_error_text(how))}", skip, skip, skip, skip
            return
        session.record = record
        verb = "Stopped early" if record.stopped else "Done"
        yield (f"{verb}: {figures_tune.trial_words(record)}, in {time.perf_counter() - started:.0f} s ({esc(how)}).",
               as_plot(figures_tune.tune_pareto(record)), figures_tune.tune_table(record),
               tuning.pick_markdown(record, how, base.max_new_tokens), gr.update(interactive=True))

    def use_in_chat(self, session: TuneSession, request: gr.Request = None):
        """Hand the pick to this visitor's chat page and open it (GO_JS)."""
        record = session.record if isinstance(session, TuneSession) else None
        if record is None:
            return "⚠ Nothing to use yet: find the fastest setting first.", ""
        owner = owner_of(request)
        if not owner:
            return "⚠ This browser sent no visitor id, so the chat page cannot receive the setting: set it there " \
                   f"by hand ({esc(tuning.setting_words(record.setting))}).", ""
        self.book.hand_to_chat(owner + self.ctx.key, record)
        return f"Opening the chat with {esc(tuning.setting_words(record.setting))}…", self.chat_url()

    def saveable(self, session: TuneSession):
        """After a tune: the save button, usable when there is a whole tune's pick to save, and no saved line yet."""
        record = session.record if isinstance(session, TuneSession) else None
        return gr.update(interactive=record is not None and not record.stopped), ""

    def save(self, session: TuneSession) -> str:
        """Write the pick shown into spice-tuned.json beside the model; one line says where, or why not."""
        record = session.record if isinstance(session, TuneSession) else None
        if record is None:
            return "⚠ Nothing to save yet: find the fastest setting first."
        return esc(self.book.save_beside_model(self.ctx.key, self.ctx.info, record))

    def offer(self, session: TuneSession):
        """Page load: a pick saved beside the model for this page's cache, profile and shape, shown as a tune's
        result (plot, table, the pick) and ready to use in chat; else nothing changes."""
        skip = gr.skip()
        kept = self.book.saved_for(self.ctx.key, self.page.defaults)
        if kept is None or not isinstance(session, TuneSession) or session.running:
            return skip, skip, skip, skip, skip
        session.record = kept.record
        reply = self.reply_tokens
        then = ("“Find the fastest setting” with that budget reuses it; “Use this setting in chat” applies it."
                if tuning.reused_for(kept.record, reply) else
                f"“Find the fastest setting” with that budget tunes again, re-measuring on chat replies of {reply} "
                "tokens; “Use this setting in chat” applies it as it is.")
        return (esc(tuning.saved_markdown(kept, then, reply)),
                as_plot(figures_tune.tune_pareto(kept.record)), figures_tune.tune_table(kept.record),
                tuning.pick_markdown(kept.record, f"saved beside the model (`{kept.saved_at}`)", reply),
                gr.update(interactive=True))

    def chat_url(self) -> str:
        """This model's chat page, relative to its sweep page."""
        page = next((m for m in self.ctx.models if m.key == self.ctx.key), None)
        return "./" + (page.chat_path if page is not None else "")
