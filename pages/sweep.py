"""Sweep page: run a grid of thresholds and policies over a few prompts; plot speed against quality.

    the page's boxes ──► pages.sweep_inputs.plan_sweep ──► SweepPlan (or a note naming the box to change)
                     ──► pages.sweep_run.run_sweep (engine group, one run at a time) ──► rows
                     ──► pages.sweep_table.sweep_views ──► status, Pareto plot, policies side by side, table
    Stop / the page closed ──► the sweep ends between tokens or runs
    page load ──► this visitor's last sweep, drawn again

Its GPU cache size (the tune's too) takes the chat's range for the page's model, from the smallest step that holds
one layer's top-k experts (below it the engine refuses to run). A number typed into its box, or Tokens per run's, that
the box does not take is said under the slider's label with the value the box went to (the one a sweep then uses),
and refused at the API. This module lays the page out, wires its events and keeps which of its sessions runs
a sweep (for unload); what a sweep takes, does and shows is in the three modules above.
"""
from __future__ import annotations

import logging
from dataclasses import replace

import gradio as gr
import pandas as pd

from spice_core.errors import SpiceError
from pages import figures_sweep, models
from pages.common import (ENGINE_GROUP, AppContext, FreeCheckboxGroup, FreeDropdown, FreeSlider, as_plot,
                          default_settings, shape_choices, shape_info, spice_error_text)
from pages.limits import box_refusal, cache_refusal, slider_ranges
from pages.owners import esc, owner_of
from pages.sweep_inputs import (DEFAULT_POLICIES, DEFAULT_PROMPTS, DEFAULT_TAU_APPROX, DEFAULT_TAU_PREFETCH,
                                TOKENS_CONTROL, TypedData, plan_sweep, run_tokens, values_range)
from pages.sweep_run import SweepSession, run_sweep, sweep_owner
from pages.sweep_table import TABLE_COLUMNS, sweep_views
from pages.sweep_tune import TuneSection
from pages.tuning import TuneBook

log = logging.getLogger(__name__)

# Stop replaces "Run sweep" while a sweep runs (CSS on body.spice-sweeping), as Stop replaces Send in the chat.
SWEEPING_ON_JS = "() => { document.body.classList.add('spice-sweeping'); return []; }"
SWEEPING_OFF_JS = "() => { document.body.classList.remove('spice-sweeping'); return []; }"


def whole_tokens_js(index: int) -> str:
    """The page's Run, in the browser: Tokens per run (input ``index``) on its nearest whole number, halves up, as
    `on_tokens_typed` puts the box. A click on Run straight from a box holding 7.5 leaves the box and sends 7.5 before
    the box's update to 8 lands; the note says 8, so the sweep runs at 8. The browser alone brings a number beyond
    the slider's ends to the nearest end. An API call runs no script: it is refused such a number, by name."""
    return (f"(...args) => {{ const v = args[{index}]; "
            f"if (typeof v === 'number' && Number.isFinite(v)) args[{index}] = Math.floor(v + 0.5); return args; }}")


class SweepPage:
    def __init__(self, ctx: AppContext, tunes: TuneBook | None = None) -> None:
        self.ctx = ctx
        self.tunes = tunes if tunes is not None else TuneBook()     # shared with the chat pages (app.py)
        self.info = ctx.info
        self.defaults = replace(default_settings(ctx.info), max_new_tokens=24)
        self.limits = ctx.limits
        self._running: dict[str, SweepSession] = {}      # page session -> its running sweep (for unload)

    def build(self) -> None:
        info, d = self.info, self.defaults
        gr.Markdown("## Threshold sweep\nAsk for the **fastest setting within a quality budget** (the tuner), or "
                    "run a grid: every prompt once with exact settings (the reference), then with each setting of "
                    "the grid, plotting **greedy agreement** with the reference against **TPOT**. Points on the "
                    "dashed Pareto front are the settings worth using.")
        models.picker(self.ctx.models, info.model_name, "sweep")
        self.session = gr.State(SweepSession())   # deep-copied per browser session
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                self.prompts = gr.Textbox("\n".join(DEFAULT_PROMPTS), lines=4, max_lines=self.limits.sweep_max_prompts,
                                          label=f"Prompts (one per line, at most {self.limits.sweep_max_prompts})", elem_id="sweep-prompts")
                self.policies = FreeCheckboxGroup(list(info.policies),
                                                 value=[p for p in DEFAULT_POLICIES if p in info.policies],
                                                 label="Policies", elem_id="sweep-policies")
            with gr.Column(scale=2):
                self.tau_prefetch = gr.Textbox(DEFAULT_TAU_PREFETCH, label="τ_prefetch values", elem_id="sweep-tp",
                                               info=f"used by prefetching policies; {values_range('tau_prefetch')}")
                self.tau_approx = gr.Textbox(DEFAULT_TAU_APPROX, label="τ_approx values", elem_id="sweep-ta",
                                             info=f"used by lossy SPICE policies; {values_range('tau_approx')}")
                with gr.Row():
                    # From the smallest step this model runs with, as the chat's (pages.limits.slider_ranges).
                    low, high, step = slider_ranges(info, self.limits)["cache_frac"]
                    self.cache_frac = FreeSlider(low, high, value=d.cache_frac, step=step, label="GPU cache size",
                                                 info=self.cache_info, elem_id="sweep-cache")
                    self.max_new_tokens = FreeSlider(self.limits.sweep_min_tokens, self.limits.sweep_max_tokens,
                                                     value=d.max_new_tokens, step=1, label=TOKENS_CONTROL,
                                                     info=self.tokens_info, elem_id="sweep-tokens")
                # Each menu gets the column's full width: side by side, a shape's label was cut off.
                self.profile = FreeDropdown(list(info.profiles), value=d.profile, label="Hardware profile",
                                            elem_id="sweep-profile")
                self.shape = FreeDropdown(shape_choices(info), value=d.shape, label="Model shape",
                                          info=shape_info(info), elem_id="sweep-shape")
        # A number typed beyond a slider is said under its label: the browser brings it to the slider's end when
        # the box is left (with no word), after the release event has sent what was typed.
        for slider, said in ((self.cache_frac, self.on_cache_typed), (self.max_new_tokens, self.on_tokens_typed)):
            slider.release(said, inputs=None, outputs=[slider], queue=False, api_visibility="private",
                           show_progress="hidden")
        self.tune = TuneSection(self)
        self.tune.build()
        self.tune.wire(self.cache_frac, self.profile, self.shape)
        gr.Markdown("### Grid of thresholds")
        with gr.Row():
            self.run_btn = gr.Button("Run sweep", variant="primary", elem_id="sweep-run")
            self.stop_btn = gr.Button("Stop", variant="stop", elem_id="sweep-stop")
        self.status = gr.Markdown("", elem_id="sweep-status", elem_classes=["spice-note"])
        with gr.Row(equal_height=False):
            self.pareto = gr.Plot(as_plot(figures_sweep.pareto_plot([], "")), label="Speed vs quality (Pareto front)",
                                  elem_id="sweep-pareto", scale=3)
            self.bars = gr.Plot(as_plot(figures_sweep.policy_bars([], "")), label="Policies side by side (each at its fastest setting with greedy agreement ≥ 90%)",
                                elem_id="sweep-bars", scale=2)
        self.table = gr.Dataframe(pd.DataFrame(columns=TABLE_COLUMNS), label="All settings", interactive=False,
                                  elem_id="sweep-table")
        outputs = [self.status, self.pareto, self.bars, self.table]
        # Listed first and browser-only: Stop shows at once, before the queue starts the sweep.
        self.run_btn.click(None, js=SWEEPING_ON_JS, queue=False, api_visibility="private", show_progress="hidden")
        inputs = [self.prompts, self.policies, self.tau_prefetch, self.tau_approx, self.cache_frac, self.max_new_tokens,
                  self.profile, self.shape, self.session]
        ran = self.run_btn.click(self.run, inputs=inputs, outputs=outputs, api_name="sweep" + self.ctx.key,
                                 js=whole_tokens_js(inputs.index(self.max_new_tokens)), concurrency_id=ENGINE_GROUP,
                                 concurrency_limit=1)
        ran.then(None, js=SWEEPING_OFF_JS, queue=False, api_visibility="private", show_progress="hidden")
        self.stop_btn.click(self.stop, inputs=[self.session], outputs=[self.status], queue=False,
                            api_name="sweep_stop" + self.ctx.key)
        gr.on(None, self.on_load, outputs=outputs, queue=False, api_visibility="private")

    # --- handlers ------------------------------------------------------------------------
    @property
    def cache_info(self) -> str:
        """The line under the GPU cache size's label when no note takes its place."""
        low = slider_ranges(self.info, self.limits)["cache_frac"][0]
        return f"share of all routed experts on the GPU; from {low:g} for this model"

    def on_cache_typed(self, typed: TypedData = None):
        """The GPU cache size's box was left or its slider let go: a number it does not take is said under its label
        with the value the box went to (`cache_refusal`); any other brings the slider's own line back."""
        refused = cache_refusal(getattr(typed, "value", None), self.info)
        return gr.update(info=self.cache_info) if refused is None else gr.update(value=refused[0], info=refused[1])

    @property
    def tokens_info(self) -> str:
        """The line under Tokens per run's label when no note takes its place."""
        return f"tokens each run generates; {self.limits.sweep_min_tokens} to {self.limits.sweep_max_tokens} here"

    def on_tokens_typed(self, typed: TypedData = None):
        """Tokens per run's box was left or its slider let go: a number it does not take (beyond this server's limits,
        not a whole number, not a number) is said under its label with the value the box went to, the one a sweep then
        runs with; any other brings the slider's own line back."""
        lim = self.limits
        refused = box_refusal(getattr(typed, "value", None), lambda raw: run_tokens(raw, lim), lim.sweep_min_tokens,
                              lim.sweep_max_tokens, 1)
        return gr.update(info=self.tokens_info) if refused is None else gr.update(value=refused[0], info=refused[1])

    def on_load(self, request: gr.Request = None):
        rows = self.ctx.last_sweep(owner_of(request))
        if not rows:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        return sweep_views("Showing your last sweep.", rows, rows[0].get("timing", ""))

    def on_unload(self, request: gr.Request) -> None:
        """The sweep's page closed: end its sweep between tokens (the chat's unload frees the engine)."""
        session = self._running.pop(getattr(request, "session_hash", None) or "", None)
        if session is not None:
            session.stop, session.reason = True, "the page was closed"
            self.ctx.runner.cancel_owner(sweep_owner(session), "closed")

    def stop(self, session: SweepSession) -> str:
        if session.running:
            session.stop = True
            return "Stopping after the current run…"
        return "No sweep is running."

    def run(self, prompts_text, policies, tau_prefetch_text, tau_approx_text, cache_frac, max_new_tokens, profile,
            shape, session: SweepSession, progress=gr.Progress(), request: gr.Request = None):
        skip = gr.skip()
        if not isinstance(session, SweepSession):          # API callers cannot break the state
            session = SweepSession()
        try:
            plan = plan_sweep(self.info, self.limits, self.defaults, self.ctx.max_message_chars, prompts_text,
                              policies, tau_prefetch_text, tau_approx_text, cache_frac, max_new_tokens, profile, shape)
        except (SpiceError, TypeError, ValueError) as exc:
            yield f"⚠ Sweep not started: {esc(spice_error_text(exc))}", skip, skip, skip
            return
        session.start()
        page_session = getattr(request, "session_hash", None) or ""
        if page_session:
            self._running[page_session] = session
        try:
            yield from run_sweep(self.ctx, plan, session, owner_of(request), progress)
        finally:
            if page_session and self._running.get(page_session) is session:
                del self._running[page_session]


def build(ctx: AppContext, tunes: TuneBook | None = None) -> SweepPage:
    """Create the sweep page's components in the caller's context (``tunes``: the picks, shared with the chat)."""
    page = SweepPage(ctx, tunes)
    page.build()
    return page
