"""Trace explorer page: any finished run's timeline, per-token and per-layer numbers, and downloads.

    page load / Refresh ──► this visitor's runs (RunBook ∩ engine.list_runs()) ──► run picker
                            (newest first; ?run=<id> preselects one of theirs, or one shared with them)
    pick a run ──► engine.get_summary + get_events ──► summary cards, per-token chart, lane timeline,
                                                       per-layer table
    Refresh ──► the views above redrawn only where the run shown, or what it is drawn from, changed
                (drawn_signature, kept in a gr.State): a download link just made survives a Refresh that
                changes nothing
    a second run ──► the two side by side: numbers with ratios, its timeline, per-layer table of both
    a download button ──► ExportStore writes that one export ──► a file link
    Share ──► the owner makes the run's link open for anyone who has it (never listed to others); the note
              gives the full link (pages.links: the app's public address behind a proxy or on a Space)
    From token / Tokens shown ──► the timeline's window, within the run's tokens (fit_window says what it moved)

A visitor sees only the runs they started (pages.owners explains who "they" are): the list,
the views and the exports all check the run's owner first, and a malformed id never reaches
the engine or the disk. Everything shown that came from a visitor (labels) is escaped.
The numbers come from the trace events (pages.trace_numbers: one schema for measured and modeled runs); the
summary cards and the comparison's headline table are pages.trace_cards'. This module lays the page out and wires
its events.
"""
from __future__ import annotations

import html
import logging

import gradio as gr
import pandas as pd

from spice_core.api import time_split
from spice_core.errors import SpiceError
from pages import figures
from pages.common import AppContext, FreeDropdown, FreeNumber, as_plot, spice_error_text
from pages.links import page_link
from pages.owners import RUN_ID_RULE, esc, owner_of, valid_run_id
from pages.limits import strict_bool
# The numbers and the HTML live in modules of their own; their names stay importable from here.
from pages.trace_cards import baseline_cards, compare_html, summary_html  # noqa: F401 - baseline_cards: re-exported
from pages.trace_numbers import (COMPARE_COLUMNS, DEFAULT_WINDOW_TOKENS, LAYER_COLUMNS,  # noqa: F401 - re-exported
                                 MAX_FIRST_TOKEN, MAX_WINDOW_TOKENS, compare_frame, fit_window, last_token,
                                 per_layer_frame, per_token_series, window_bounds)

log = logging.getLogger(__name__)

LINK_ID_SHOWN = 80      # characters of a malformed ?run= kept in the picker (over RUN_ID's 64: it stays malformed)


def window_update(first: int, note: str, last: int | None):
    """The "From token" box showing the window drawn, bounded by the run's last token (its arrows stop there)."""
    return gr.update(value=first, info=note or None, maximum=last)


# --- page -------------------------------------------------------------------------------------
class TraceExplorer:
    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx

    def build(self) -> None:
        gr.Markdown("## Trace explorer\nEvery finished run (chat replies, exact checks, sweeps) with its full "
                    "timeline. Downloads: the Chrome trace opens in [Perfetto](https://ui.perfetto.dev); the "
                    "TensorBoard zip unpacks into a run folder for torch-tb-profiler (only its **Trace** view holds the "
                    "run; its Overview and Operator views describe a stand-in profiler step); the CSV has one row "
                    "per token. Each run's cards put it beside its baselines: resident, on_demand and lru replayed "
                    "over the same routing in modeled time.")
        with gr.Row(equal_height=False):
            self.run = FreeDropdown(choices=[], value=None, label="Run", scale=5, elem_id="trace-run",
                                   info="newest first")
            self.refresh = gr.Button("Refresh list", scale=0, min_width=120, size="md", elem_id="trace-refresh")
        self.message = gr.Markdown("", elem_classes=["spice-note"])
        self.summary = gr.HTML("", elem_id="trace-summary")
        with gr.Row(equal_height=True):
            self.dl_chrome = gr.Button("Chrome trace (.json)", interactive=False, size="md", elem_id="dl-chrome")
            self.dl_chrome_gz = gr.Button("Chrome trace (.json.gz)", interactive=False, size="md",
                                          elem_id="dl-chrome-gz")
            self.dl_tb = gr.Button("TensorBoard run (.zip)", interactive=False, size="md", elem_id="dl-tb")
            self.dl_csv = gr.Button("Per-token CSV", interactive=False, size="md", elem_id="dl-csv")
            self.share = gr.Checkbox(False, label="Share: anyone with this run's link may open it", interactive=False,
                                     elem_id="trace-share")
        self.file = gr.File(None, label="Download", interactive=False, elem_id="trace-file", height=60)
        self.drawn = gr.State(None)     # drawn_signature of the run the views show (None: nothing drawn yet)
        self.share_note = gr.Markdown("", elem_classes=["spice-note"], elem_id="trace-share-note")
        self.overview = gr.Plot(as_plot(figures.empty_figure("pick a run")), label="Per token: time, stall, copies",
                                elem_id="trace-overview")
        with gr.Row(equal_height=True):
            # Any number is taken and brought into range (the boxes then show the window drawn).
            self.first = FreeNumber(0, precision=0, label="From token", scale=1, elem_id="trace-first", minimum=0,
                                    info="pick a run")
            self.count = FreeNumber(DEFAULT_WINDOW_TOKENS, precision=0, label=f"Tokens shown (1–{MAX_WINDOW_TOKENS:,})",
                                    scale=1, elem_id="trace-count")
        self.timeline = gr.Plot(as_plot(figures.empty_figure("pick a run")), label="Timeline: one row per lane",
                                elem_id="trace-timeline")
        self.table = gr.Dataframe(pd.DataFrame(columns=LAYER_COLUMNS), label="Per-layer statistics",
                                  interactive=False, elem_id="trace-table", wrap=True)
        with gr.Accordion("Compare with another run", open=False, elem_id="trace-compare"):
            self.other = FreeDropdown(choices=[], value=None, label="Second run", elem_id="trace-compare-run",
                                      info="side by side with the run above: summary, timeline, per layer")
            self.cmp_summary = gr.HTML("", elem_id="trace-compare-summary")
            self.cmp_timeline = gr.Plot(as_plot(figures.empty_figure("pick a second run")),
                                        label="Second run's timeline (same tokens)", elem_id="trace-compare-timeline")
            self.cmp_table = gr.Dataframe(pd.DataFrame(columns=COMPARE_COLUMNS), interactive=False, wrap=True,
                                          label="Per layer, first run vs second run", elem_id="trace-compare-table")
        self._wire()

    def _wire(self) -> None:
        buttons = [self.dl_chrome, self.dl_chrome_gz, self.dl_tb, self.dl_csv]
        shown = [self.message, self.summary, self.overview, self.timeline, self.table, self.file, self.share,
                 *buttons, self.first, self.count]
        # Read-only views never queue: a queue full of other visitors' work must not keep anyone from their traces.
        views = dict(inputs=[self.run, self.first, self.count], outputs=[*shown, self.drawn], queue=False)
        compared = dict(inputs=[self.run, self.other, self.first, self.count],
                        outputs=[self.cmp_summary, self.cmp_timeline, self.cmp_table], queue=False)
        # The run picker's value comes from the page load, Refresh, or the visitor's own pick. The views follow each,
        # chained rather than on the picker's change: a change listener also runs at the load, whose progress is
        # silent (pages.common.quiet_page_loads), so a visitor's pick showed none. `.input` is the visitor's pick
        # alone: its views show their progress.
        loaded = gr.on(None, self.on_load, inputs=None, outputs=[self.run], api_visibility="private", queue=False)
        listed = self.refresh.click(self.list_runs, inputs=[self.run], outputs=[self.run], api_name="runs",
                                    queue=False)
        picked = self.run.input(self.show_drawn, api_name="trace_run", **views)
        self.other.input(self.compare, api_name="compare", **compared)    # before the chained ones: they take its name
        redrawn = listed.then(self.refresh_view, inputs=[self.run, self.first, self.count, self.drawn],
                              outputs=views["outputs"], api_visibility="private", queue=False)
        for event in (loaded.then(self.show_drawn, api_visibility="private", **views), redrawn, picked):
            # then the second-run list without this run, and the comparison with the run now shown
            others = event.then(self.list_others, inputs=[self.run, self.other], outputs=[self.other],
                                api_visibility="private", queue=False)
            others.then(self.compare, api_visibility="private", **compared)
        gr.on([self.first.submit, self.count.submit, self.first.blur, self.count.blur], self.window,
              inputs=[self.run, self.first, self.count], outputs=[self.timeline, self.first, self.count],
              api_visibility="private", queue=False)
        # Exports are written when asked for, one kind at a time, outside the engine's group (they only
        # read a finished run); at most two at once so that exports cannot starve the server.
        for button, kind in zip(buttons, ("chrome", "chrome_gz", "tensorboard", "csv")):
            button.click(self._export_handler(kind),
                         inputs=[self.run], outputs=[self.file, self.message], api_visibility="private",
                         concurrency_id="exports", concurrency_limit=2)
        self.share.input(self.set_shared, inputs=[self.run, self.share], outputs=[self.share_note],
                         api_name="share", queue=False)
        # API only: one export by kind, e.g. client.predict("3f2a9c01d4", "chrome", api_name="/export")
        api_run = gr.Textbox(visible=False)
        api_kind = gr.Textbox(visible=False)
        api_file = gr.File(visible=False)
        api_kind.submit(self.export, inputs=[api_run, api_kind], outputs=[api_file], api_name="export",
                        concurrency_id="exports", concurrency_limit=2)

    def _choices(self, owner: str, extra: str = "") -> list[tuple[str, str]]:
        """This visitor's finished runs, newest first (plus ``extra``, a run shared with them)."""
        summaries = {s.run_id: s for s in self.ctx.engine.list_runs()}
        entries = self.ctx.runs.list_for(owner)
        wanted = [e for e in entries if e.run_id in summaries]
        if extra and extra in summaries and all(e.run_id != extra for e in wanted):
            shared = self.ctx.runs.get(extra)
            if shared is not None:
                wanted.insert(0, shared)
        out = []
        for e in wanted:
            s = summaries[e.run_id]
            mine = "" if e.owner == owner else " · shared with you"
            out.append((f"{s.run_id} · {s.policy} · {s.n_tokens} tok · TPOT {s.tpot_ms_median:.2f} ms"
                        f"{f' · {e.label}' if e.label else ''}{mine}", s.run_id))
        return out

    def _allowed(self, run_id, request) -> str:
        """The run id if this visitor may open it; raises SpiceError otherwise (same words for
        "not yours" and "unknown", so nobody learns which ids exist; text that cannot be an id is told so,
        as its form gives nothing away)."""
        clean = valid_run_id(run_id)
        if not clean:
            raise SpiceError(f"Run: that is not a run id ({RUN_ID_RULE}); check the link, or pick a run from "
                             "the list")
        if not self.ctx.runs.may_open(clean, owner_of(request)):
            raise SpiceError("Run: that run is unknown, expired or not yours (runs are private to the browser "
                             "that made them, unless their owner shares them); pick one from the list")
        return clean

    def on_load(self, request: gr.Request = None):
        """The run picker when the page opens: ``?run=<id>`` preselects that run; one this visitor may not open
        (unknown, expired, or another's unshared), or text that is no run id at all, stays selected under a label
        saying so, and `show` explains, rather than the page opening some other run as if the link had worked."""
        owner = owner_of(request)
        asked = request.query_params.get("run") if request is not None else None
        asked = asked.strip() if isinstance(asked, str) else ""
        wanted = valid_run_id(asked)
        if asked and not wanted:        # no run has such an id: say so rather than open another run silently
            kept = asked[:LINK_ID_SHOWN]                        # still malformed (over 64 characters when cut)
            choices = [(f"{kept} · from the link: not a run id", kept), *self._choices(owner)]
            return gr.update(choices=choices, value=kept)
        if wanted and not self.ctx.runs.may_open(wanted, owner):
            choices = [(f"{wanted} · from the link: not available to you", wanted), *self._choices(owner)]
            return gr.update(choices=choices, value=wanted)
        choices = self._choices(owner, extra=wanted)
        ids = [v for _, v in choices]
        value = wanted if wanted in ids else (ids[0] if ids else None)
        return gr.update(choices=choices, value=value)

    def list_others(self, run_id, current, request: gr.Request = None):
        """The second-run picker: this visitor's other runs."""
        choices = [c for c in self._choices(owner_of(request)) if c[1] != run_id]
        ids = [v for _, v in choices]
        return gr.update(choices=choices, value=current if current in ids else None)

    def compare(self, run_id, other_id, first, count, request: gr.Request = None):
        """Two runs side by side: their headline numbers with ratios, the second's timeline for the same
        tokens, and a per-layer table of both."""
        empty = (as_plot(figures.empty_figure("pick a second run")), pd.DataFrame(columns=COMPARE_COLUMNS))
        if not run_id or not other_id:
            return ("", *empty)
        try:
            a_id, b_id = self._allowed(run_id, request), self._allowed(other_id, request)
            a, b = self.ctx.engine.get_summary(a_id), self.ctx.engine.get_summary(b_id)
            ev_a, ev_b = self.ctx.engine.get_events(a_id), self.ctx.engine.get_events(b_id)
        except SpiceError as exc:
            return (f"<p>⚠ {esc(spice_error_text(exc))}</p>", *empty)
        first, count, _ = fit_window(first, count, last_token(ev_a))
        return (compare_html(a, b), as_plot(self._timeline(ev_b, first, count)),
                compare_frame(per_layer_frame(ev_a, a.n_tokens), per_layer_frame(ev_b, b.n_tokens)))

    def list_runs(self, current, request: gr.Request = None):
        choices = self._choices(owner_of(request))
        ids = [v for _, v in choices]
        return gr.update(choices=choices, value=current if current in ids else (ids[0] if ids else None))

    def show(self, run_id, first, count, request: gr.Request = None):
        off = gr.update(interactive=False)
        share_off = gr.update(value=False, interactive=False)
        if not run_id:
            return ("No finished runs yet: chat on the main page or run a sweep, then press Refresh.", "",
                    as_plot(figures.empty_figure("pick a run")), as_plot(figures.empty_figure("pick a run")),
                    pd.DataFrame(columns=LAYER_COLUMNS), None, share_off, off, off, off, off,
                    gr.update(info="pick a run", maximum=None), gr.skip())
        try:
            run_id = self._allowed(run_id, request)
            summary = self.ctx.engine.get_summary(run_id)
            events = self.ctx.engine.get_events(run_id)
        except SpiceError as exc:
            return (f"⚠ {esc(spice_error_text(exc))}", "", gr.skip(), gr.skip(), gr.skip(), None, share_off,
                    off, off, off, off, gr.skip(), gr.skip())
        tokens, step_ms, stall_ms, mb = per_token_series(events)
        last = last_token(events)
        first, count, note = fit_window(first, count, last)
        overview = figures.token_overview(tokens, step_ms, stall_ms, mb, summary.timing)
        entry = self.ctx.runs.get(run_id)
        mine = self.ctx.runs.is_owner(run_id, owner_of(request))
        on = gr.update(interactive=True)
        try:
            baselines = self.ctx.engine.baselines(run_id)
        except (SpiceError, ValueError, AttributeError) as exc:     # a fake or older engine without them
            log.info("no baselines for %s: %s", run_id, exc)
            baselines = {}
        split = time_split(events)
        return ("", summary_html(summary, entry.label if entry else "", baselines, split), as_plot(overview),
                as_plot(self._timeline(events, first, count)), per_layer_frame(events, summary.n_tokens), None,
                gr.update(value=bool(entry and entry.shared), interactive=mine), on, on, on, on,
                window_update(first, note, last), count)

    def drawn_signature(self, run_id, request: gr.Request = None) -> tuple:
        """What `show` draws ``run_id`` from, read cheaply (no events): the run's summary (a finished run's numbers:
        the engine never rewrites them, and a run's events end before its summary is made) and its label, or the
        words saying why it cannot be shown. Equal signatures, equal views. Sharing is left out: `refresh_view`
        sets the Share box on its own, as that redraws nothing."""
        if not run_id:
            return ("none",)
        try:
            clean = self._allowed(run_id, request)
            summary = self.ctx.engine.get_summary(clean)
        except SpiceError as exc:
            return ("refused", str(run_id), spice_error_text(exc))
        entry = self.ctx.runs.get(clean)
        return ("run", clean, repr(summary), entry.label if entry else "")   # repr: a NaN in it equals itself

    def show_drawn(self, run_id, first, count, request: gr.Request = None):
        """`show`, and the signature of what it drew (for the page's gr.State; API clients do not see it). The
        signature is read first: should the run change in between, the next Refresh redraws rather than keeps."""
        signature = self.drawn_signature(run_id, request)
        return (*self.show(run_id, first, count, request), signature)

    def refresh_view(self, run_id, first, count, drawn, request: gr.Request = None):
        """After Refresh: the views redrawn only when the run shown or its data changed since they were drawn
        (``drawn``: its signature then). Regression: every Refresh redrew them, which cleared a download link the
        visitor had just made though nothing had changed. Unchanged, only the Share box is set (another tab of
        the owner's may have shared the run); the link, the window and the rest stay as they are."""
        now = self.drawn_signature(run_id, request)
        if now != drawn:
            return (*self.show(run_id, first, count, request), now)
        entry = self.ctx.runs.get(now[1]) if now[0] == "run" else None
        share = gr.update(value=bool(entry and entry.shared)) if entry else gr.skip()
        keep = gr.skip()
        # message, summary, overview, timeline, table, file | share | 4 download buttons, first, count | signature
        return (keep,) * 6 + (share,) + (keep,) * 6 + (drawn,)

    def window(self, run_id, first, count, request: gr.Request = None):
        """The timeline for the tokens asked for; the boxes show the window drawn (an out-of-range or
        unreadable number is brought to the nearest one that can be drawn, past the run's end to its last
        tokens, and the box says so)."""
        first, count = window_bounds(first, count)
        if not run_id:
            return gr.skip(), first, count
        try:
            events = self.ctx.engine.get_events(self._allowed(run_id, request))
        except SpiceError:
            return gr.skip(), first, count
        last = last_token(events)
        first, count, note = fit_window(first, count, last)
        return as_plot(self._timeline(events, first, count)), window_update(first, note, last), count

    def set_shared(self, run_id, shared, request: gr.Request = None) -> str:
        """Share or unshare the owner's run; shared, the note gives the run's full link (the app's public
        address from the request: its host, scheme and root path behind a proxy or on a Space)."""
        clean = valid_run_id(run_id)
        try:
            shared = strict_bool(shared, "Share")
        except SpiceError as exc:
            return f"⚠ {esc(spice_error_text(exc))} (the run's sharing is unchanged)"
        if not clean or not self.ctx.runs.set_shared(clean, owner_of(request), shared):
            return "⚠ Only the visitor who made a run can share it."
        if shared:
            link = page_link(request, "trace", run=clean)
            return (f"Anyone with this link can now open run **{esc(clean)}** (read-only): "
                    f"<a href=\"{html.escape(link, quote=True)}\" target=\"_blank\">{esc(link)}</a>. "
                    "Untick to make it private again.")
        self.ctx.exports.drop_run(clean)     # download links handed out while it was shared stop working
        return "This run is private again (download links made while it was shared no longer work)."

    @staticmethod
    def _timeline(events, first, count):
        first, count = window_bounds(first, count)
        window = [e for e in events if first <= e.token < first + count]
        return figures.lane_gantt(window, uirevision=f"timeline-{first}-{count}",
                                  empty_hint=f"no intervals for tokens {first}–{first + count - 1}",
                                  timing=events[0].timing if events else "")

    def export(self, run_id, kind, request: gr.Request = None):
        if not run_id:
            raise gr.Error("Run: pick a run first.", print_exception=False)
        try:
            kind = (kind or "chrome").strip() if isinstance(kind, str) else kind
            return str(self.ctx.exports.get(self._allowed(run_id, request), kind))
        except SpiceError as exc:
            log.info("export refused")      # one line, no values (a refused export is a visitor's mistake)
            raise gr.Error(esc(spice_error_text(exc)), print_exception=False) from None

    def _export_handler(self, kind: str):
        def handler(run_id, request: gr.Request = None):
            return self.export_ui(run_id, kind, request)
        return handler

    def export_ui(self, run_id, kind: str, request: gr.Request = None):
        """A download button: write this one export and hand back its file."""
        try:
            return str(self.ctx.exports.get(self._allowed(run_id, request), kind)), ""
        except SpiceError as exc:
            return None, f"⚠ Export failed: {esc(spice_error_text(exc))}"


def build(ctx: AppContext) -> TraceExplorer:
    """Create the trace explorer's components in the caller's context."""
    page = TraceExplorer(ctx)
    page.build()
    return page
