"""Trace explorer page: any finished run's timeline, per-token and per-layer numbers, and downloads.

    page load / Refresh ──► this visitor's runs (RunBook ∩ engine.list_runs()) ──► run picker
                            (newest first; ?run=<id> preselects one of theirs, or one shared with them)
    pick a run ──► engine.get_summary + get_events ──► summary cards, per-token chart, lane timeline,
                                                       per-layer table
    a second run ──► the two side by side: numbers with ratios, its timeline, per-layer table of both
    a download button ──► ExportStore writes that one export ──► a file link
    Share ──► the owner makes the run's link open for anyone who has it (never listed to others); the note
              gives the full link (pages.links: the app's public address behind a proxy or on a Space)
    From token / Tokens shown ──► the timeline's window, within the run's tokens (fit_window says what it moved)

A visitor sees only the runs they started (pages.owners explains who "they" are): the list,
the views and the exports all check the run's owner first, and a malformed id never reaches
the engine or the disk. Everything shown that came from a visitor (labels) is escaped.
The tables are computed here from the trace events (one schema for measured and modeled runs).
"""
from __future__ import annotations

import html
import logging
from collections import defaultdict

import gradio as gr
import pandas as pd

from spice_core.errors import SpiceError
from spice_core import api as metrics   # the one definition of every metric (trace.metrics)
from pages import figures
from pages.common import AppContext, FreeDropdown, FreeNumber, as_plot, fmt_bytes, spice_error_text, timed_bytes
from pages.links import page_link
from pages.owners import RUN_ID_RULE, esc, owner_of, valid_run_id
from pages.limits import strict_bool

log = logging.getLogger(__name__)

DEFAULT_WINDOW_TOKENS = 16
MAX_WINDOW_TOKENS = 4096
MAX_FIRST_TOKEN = 10**9
LINK_ID_SHOWN = 80      # characters of a malformed ?run= kept in the picker (over RUN_ID's 64: it stays malformed)
# "prefetched hit %" are prefetches in time; "late prefetch %" those whose copy came after the layer needed it
# (a stall, not a hit: trace.metrics), so hit % + prefetched hit % is the layer's hit rate, as in the chat.
# "CPU int8 %" are misses run on the CPU lane from the experts' int8 copy (lossy), apart from the exact "CPU %",
# as the run summary's miss split and the exports' experts_cpu_int8 count them; the shares add up to 100.
LAYER_COLUMNS = ["layer", "selections", "hit %", "prefetched hit %", "late prefetch %", "approx %", "CPU %",
                 "CPU int8 %", "copied %", "prefetches", "wasted prefetches", "MB copied / token (timed shape)",
                 "stall ms / token"]


# --- numbers from events (pure) ---------------------------------------------------------------
def per_layer_frame(events, n_tokens: int) -> pd.DataFrame:
    """One row per layer that routed anything: outcome shares over the decode tokens (the run summary's
    scope, trace.metrics), prefetch counts, bytes and stalls per token."""
    table = metrics.per_layer_counts(metrics.outcomes_from_events(events, metrics.scope_tokens(n_tokens)))
    outcome_rows = {int(r.layer): r for r in table.itertuples(index=False)}
    rows: dict[int, dict] = defaultdict(lambda: defaultdict(float))
    for e in events:
        if e.layer < 0:
            continue
        r = rows[e.layer]
        if e.kind == "prefetch":
            r["prefetches"] += 1
        elif e.kind == "prefetch_wasted":
            r["wasted"] += 1
        if e.kind in ("copy", "prefetch"):
            r["bytes"] += e.bytes
        if e.kind == "stall":
            r["stall_ms"] += e.end_ms - e.start_ms
    out = []
    tokens = max(n_tokens, 1)
    for layer in sorted(set(rows) | set(outcome_rows)):
        r, o = rows[layer], outcome_rows.get(layer)
        sel = int(o.selections) if o is not None else 0
        if sel == 0 and r["prefetches"] == 0:
            continue
        pct = (lambda n: round(100 * n / sel, 1)) if sel else (lambda n: 0.0)
        get = (lambda k: getattr(o, k)) if o is not None else (lambda k: 0)
        out.append([layer, sel, pct(get("hit")), pct(get("prefetch_hit")), pct(get("prefetch_late")),
                    pct(get("approx")), pct(get("cpu")), pct(get(metrics.CPU_INT8_OUTCOME)), pct(get("copy")),
                    int(r["prefetches"]), int(r["wasted"]),
                    round(r["bytes"] / 1e6 / tokens, 2), round(r["stall_ms"] / tokens, 3)])
    return pd.DataFrame(out, columns=LAYER_COLUMNS)


def per_token_series(events) -> tuple[list[int], list[float], list[float], list[float]]:
    """(token, step ms, stall ms, MB copied) per token; step time from the host "token" events when present."""
    span: dict[int, list[float]] = {}
    step: dict[int, float] = {}
    stall: dict[int, float] = defaultdict(float)
    copied: dict[int, float] = defaultdict(float)
    for e in events:
        if e.token < 0:
            continue
        lo_hi = span.setdefault(e.token, [e.start_ms, e.end_ms])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], e.start_ms), max(lo_hi[1], e.end_ms)
        if e.kind == "token":
            step[e.token] = e.end_ms - e.start_ms
        elif e.kind == "stall":
            stall[e.token] += e.end_ms - e.start_ms
        if e.kind in ("copy", "prefetch"):
            copied[e.token] += e.bytes / 1e6
    tokens = sorted(span)
    return (tokens, [step.get(t, span[t][1] - span[t][0]) for t in tokens], [stall[t] for t in tokens],
            [copied[t] for t in tokens])


COMPARE_COLUMNS = ["layer", "hit % (first)", "hit % (second)", "MB / token (first)", "MB / token (second)",
                   "stall ms / token (first)", "stall ms / token (second)"]


def window_bounds(first, count) -> tuple[int, int]:
    """(first token, tokens shown) of the timeline from what was typed: whole numbers within range; an
    empty or unreadable box gets its default."""
    def whole(value, default: int, low: int, high: int) -> int:
        try:
            number = float(value)
        except (TypeError, ValueError):
            return default
        if number != number:                  # NaN
            return default
        return int(round(max(low, min(high, number))))

    return whole(first, 0, 0, MAX_FIRST_TOKEN), whole(count, DEFAULT_WINDOW_TOKENS, 1, MAX_WINDOW_TOKENS)


def last_token(events) -> int | None:
    """The run's last token index (its tokens are 0..last), None for a run without per-token events."""
    return max((e.token for e in events if e.token >= 0), default=None)


def fit_window(first, count, last: int | None) -> tuple[int, int, str]:
    """(first token, tokens shown, note) of the timeline: `window_bounds`, then a first token past the run's
    ``last`` token is moved back so that the window shows the run's last tokens; the note, for the "From token"
    box, gives the run's range and says when the number typed was moved ("" for a run without tokens)."""
    first, count = window_bounds(first, count)
    if last is None:
        return first, count, ""
    if first <= last:
        return first, count, f"this run has tokens 0–{last:,}"
    moved = max(0, last + 1 - count)
    return moved, count, (f"⚠ {first:,} is past this run's last token ({last:,}): showing tokens "
                          f"{moved:,}–{last:,}")


def window_update(first: int, note: str, last: int | None):
    """The "From token" box showing the window drawn, bounded by the run's last token (its arrows stop there)."""
    return gr.update(value=first, info=note or None, maximum=last)


def compare_frame(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per layer, two runs' hit rates (hit + prefetched hit), copies and stalls side by side."""
    def part(df, tag):
        return pd.DataFrame({"layer": df["layer"], f"hit % ({tag})": df["hit %"] + df["prefetched hit %"],
                             f"MB / token ({tag})": df["MB copied / token (timed shape)"],
                             f"stall ms / token ({tag})": df["stall ms / token"]})
    both = part(a, "first").merge(part(b, "second"), on="layer", how="outer").sort_values("layer")
    both = both[COMPARE_COLUMNS].fillna(0.0).reset_index(drop=True)
    # Sums of rounded shares carry float noise (65.30000000000001): one decimal, as the per-layer table shows.
    return both.round({c: 1 for c in both.columns if c.startswith("hit %")} | {c: 3 for c in both.columns
                                                                                 if c.startswith(("MB", "stall"))})


def _late_text(s) -> str:
    """The share of selections served by a prefetch that came late (RunSummary.late_prefetch_rate)."""
    return f"{100 * s.late_prefetch_rate:.0f}%"


def _hit_rate_note(s) -> str:
    """Under the hit rate: the late prefetches' share when there is one (as the chat's card), then the misses."""
    split = " · ".join(f"{k} {v}" for k, v in sorted(s.miss_split.items()) if v) or "no misses"
    return f"in time; {_late_text(s)} late prefetches · {split}" if s.late_prefetch_rate >= 0.005 else split


def _timed_bytes_text(s) -> str:
    return fmt_bytes(timed_bytes(s.shape_bytes_per_token, s.bytes_per_token)[0])


def compare_html(a, b) -> str:
    """The two runs' headline numbers and how the second compares (every value escaped)."""
    def ratio(x, y, better_low=True):
        if not x or not y:
            return "—"
        r = x / y if better_low else y / x
        if not better_low:
            return f"{r:.2f}×"
        # r = first / second: above 1 the second is faster by r; below, slower by 1 / r ("0.73× slower" was wrong).
        return "same" if round(r, 2) == 1 else f"{r:.2f}× faster" if r > 1 else f"{1 / r:.2f}× slower"
    rows = [("policy", a.policy, b.policy, ""), ("timing", f"{a.timing} · {a.shape}", f"{b.timing} · {b.shape}", ""),
            ("TPOT median", f"{a.tpot_ms_median:.2f} ms", f"{b.tpot_ms_median:.2f} ms",
             ratio(a.tpot_ms_median, b.tpot_ms_median)),
            ("hit rate (in time)", f"{100 * a.hit_rate:.0f}%", f"{100 * b.hit_rate:.0f}%", ""),
            ("late prefetches (stalled)", _late_text(a), _late_text(b), ""),
            ("copied / token (timed shape)", _timed_bytes_text(a), _timed_bytes_text(b), ""),
            ("copied / token (native)", fmt_bytes(a.bytes_per_token), fmt_bytes(b.bytes_per_token), ""),
            ("stall / token", f"{a.stall_ms_per_token:.2f} ms", f"{b.stall_ms_per_token:.2f} ms", ""),
            ("tokens", f"{a.n_tokens}", f"{b.n_tokens}", "")]
    head = "<tr><th></th><th>first run</th><th>second run</th><th>second vs first</th></tr>"
    body = "".join(f"<tr><td>{esc(k)}</td><td>{esc(x)}</td><td>{esc(y)}</td><td>{esc(r)}</td></tr>"
                   for k, x, y, r in rows)
    note = "" if a.timing == b.timing else "<p>⚠ one run is measured and the other modeled: compare with care.</p>"
    return f"<table class='spice-compare'>{head}{body}</table>{note}"


def baseline_cards(s, baselines: dict) -> list[tuple[str, str, str]]:
    """The run beside its baselines: ``baselines`` are modeled ms per token of resident, on_demand and lru
    over the run's own routing (engine.baselines). Ratios only when the run is modeled too (same clock)."""
    out = []
    for name, label in (("lru", "vs lru"), ("on_demand", "vs on_demand"), ("resident", "vs resident floor")):
        ms = baselines.get(name)
        if not ms or s.policy == name:
            continue
        if s.timing == "modeled" and s.tpot_ms_median > 0:
            r = ms / s.tpot_ms_median
            verdict = f"{r:.2f}× faster" if r >= 1 else f"{1 / r:.2f}× slower"
            out.append((label, verdict, f"{name} {ms:.2f} ms · modeled, same routing"))
        else:
            out.append((label, f"{ms:.2f} ms", f"{name}, modeled for this routing (this run is {s.timing})"))
    return out


def _copied_card(s) -> tuple[str, str]:
    """Bytes per token at the shape the run's times are for (as the per-layer table and the chart), native under."""
    shown, native = timed_bytes(s.shape_bytes_per_token, s.bytes_per_token)
    return fmt_bytes(shown), "per token (own sizes)" if native is None else \
        f"per token at {s.shape} · native {fmt_bytes(native)}"


def summary_html(s, label: str = "", baselines: dict | None = None) -> str:
    """The summary cards; every interpolated value is escaped (labels are visitors' prompts)."""
    cards = [
        ("tokens", f"{s.n_tokens}", s.finish_reason or "—"),
        ("TTFT", f"{s.ttft_ms:.1f} ms", "incl. prefill"),
        ("TPOT", f"{s.tpot_ms_median:.2f} ms", f"median · p90 {s.tpot_ms_p90:.2f}"),
        ("tokens/s", f"{s.tokens_per_s:.1f}", s.timing),
        ("hit rate", f"{100 * s.hit_rate:.0f}%", _hit_rate_note(s)),
        ("copied", *_copied_card(s)),
        ("stall", f"{s.stall_ms_per_token:.2f} ms", "per token"),
        *baseline_cards(s, baselines or {}),
    ]
    body = "".join(f"<div class='card'><div class='k'>{esc(k)}</div><div class='v'>{esc(v)}</div>"
                   f"<div class='s'>{esc(t)}</div></div>" for k, v, t in cards)
    notes = "".join(f"<li>{esc(n)}</li>" for n in s.notes)
    where = f" ({esc(s.profile)}, {esc(s.shape)})" if s.timing == "modeled" else ""
    head = (f"<b>{esc(s.run_id)}</b> · {esc(s.policy)} · {esc(s.timing)} timing{where}"
            f"{f' · {esc(label)}' if label else ''}")
    return (f"<div class='spice-stats'><div class='head'>{head}</div><div class='cards'>{body}</div>"
            f"{f'<ul class=notes>{notes}</ul>' if notes else ''}</div>")


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
        gr.on(None, self.on_load, inputs=None, outputs=[self.run], api_visibility="private", queue=False)
        self.refresh.click(self.list_runs, inputs=[self.run], outputs=[self.run], api_name="runs", queue=False)
        self.run.change(self.list_others, inputs=[self.run, self.other], outputs=[self.other],
                        api_visibility="private", queue=False)
        compare_out = [self.cmp_summary, self.cmp_timeline, self.cmp_table]
        # Read-only views never queue: a queue full of other visitors' work must not keep anyone from their traces.
        gr.on([self.other.change], self.compare, inputs=[self.run, self.other, self.first, self.count],
              outputs=compare_out, api_name="compare", queue=False)
        self.run.change(self.show, inputs=[self.run, self.first, self.count], outputs=shown, api_name="trace_run",
                        queue=False)
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
        return ("", summary_html(summary, entry.label if entry else "", baselines), as_plot(overview),
                as_plot(self._timeline(events, first, count)), per_layer_frame(events, summary.n_tokens), None,
                gr.update(value=bool(entry and entry.shared), interactive=mine), on, on, on, on,
                window_update(first, note, last), count)

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
                                  empty_hint=f"no intervals for tokens {first}–{first + count - 1}")

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
