"""Sweep page: run a grid of thresholds and policies over a few prompts; plot speed against quality.

    prompts × {exact reference}  ──► reference tokens per prompt (greedy, exact policy)
    prompts × settings grid      ──► engine.start_prompt ──► tokens + RunSummary per run
                                 ──► per setting: greedy agreement (vs reference), mean TPOT, hit rate
                                 ──► Pareto plot (agreement vs TPOT), policies side by side, table

The grid only varies what a policy uses: τ_prefetch for prefetching policies, τ_approx for the
lossy ones (an exact policy ignores it), nothing for the plain baselines. Runs go through the
same runner and concurrency group as the chat, one at a time. The handler yields while every run
streams, so Gradio can stop it when the visitor leaves; Stop, closing the page (unload) and a
vanished reader (the runner's orphan watchdog) all end the sweep between tokens or runs. A sweep
never pre-empts anyone else's reply (pages.runner), and its size is capped at the API as at the UI
(pages.limits): runs, prompts, tokens per run and tokens in all. Its GPU cache size (the tune's too) takes the
chat's range for the page's model, from the smallest step that holds one layer's top-k experts (below it the
engine refuses to run); a number typed beyond it is said under the slider's label, and refused at the API.
The agreement shown is the project's one greedy agreement (spice_core.api.greedy_agreement: positions with
the reference's token over the longer sequence), pooled over the prompts as the benchmarks pool it (matching
positions summed, then divided); the table also gives the identical prefix (share of the reference reproduced
before the first different token) under that name. Always at temperature 0.
"""
from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, replace

import gradio as gr
import pandas as pd

from spice_core.api import EXACT_POLICIES, RunSettings
from spice_core.errors import ConfigError, SpiceError
from pages import figures_sweep, models
from pages.common import (ENGINE_GROUP, AppContext, FreeCheckboxGroup, FreeDropdown, FreeSlider, as_plot,
                          check_profile_and_shape, default_settings, shape_choices, shape_info, spice_error_text,
                          timed_bytes)
from pages.limits import bounded_number, cache_refusal, cache_share, slider_ranges
from spice_core.api import identical_prefix_share, matching_tokens
from pages.owners import esc, owner_of
from pages.runner import RunStream
from pages.sweep_tune import TuneSection
from pages.tuning import TuneBook

log = logging.getLogger(__name__)

STATUS_INTERVAL_S = 1.0       # a progress line at most once a second while a run streams
# Stop replaces "Run sweep" while a sweep runs (CSS on body.spice-sweeping), as Stop replaces Send in the chat.
SWEEPING_ON_JS = "() => { document.body.classList.add('spice-sweeping'); return []; }"
SWEEPING_OFF_JS = "() => { document.body.classList.remove('spice-sweeping'); return []; }"
PREFETCHING = ("gate_prefetch", "spice_prefetch", "oracle_prefetch", "spice", "spice_no_lore", "spice_no_cpu")
DEFAULT_POLICIES = ("lru", "spice_prefetch", "spice")
# The shipped model writes children's stories: prompts of the kind it learned, about the animals and things
# of the chat's examples (pages.chat.EXAMPLES).
DEFAULT_PROMPTS = ("Once upon a time, there was a little cat who had a red ball.",
                   "Once upon a time, a fox found a drum in the woods.",
                   "Once upon a time, a rabbit wanted a new hat.")
DEFAULT_TAU_PREFETCH = "0.1, 0.4, 0.7"
DEFAULT_TAU_APPROX = "0, 0.05, 0.1, 0.2"     # values the chat's τ_approx takes ([0, 0.2]; useful below ~0.1)
TABLE_COLUMNS = ["policy", "τ_prefetch", "τ_approx", "greedy agreement %", "identical prefix %", "TPOT ms", "tokens/s", "hit rate %",
                 "MB / token (timed shape)", "stall ms / token", "runs"]


@dataclass
class SweepSession:
    stop: bool = False
    running: bool = False
    reason: str = ""             # why it stopped early ("" = the visitor pressed Stop)


def parse_values(text: str, name: str) -> list[float]:
    """"0, 0.1, 0.2" -> [0.0, 0.1, 0.2]; ConfigError naming the field otherwise."""
    items = [t for t in str(text or "").replace(";", ",").replace(" ", ",").split(",") if t.strip()]
    if not items:
        raise ConfigError(f"{name}: give at least one value, e.g. 0.2 or 0, 0.1, 0.3")
    values = []
    for t in items:
        try:
            v = float(t)
        except ValueError:
            raise ConfigError(f"{name}: {t!r} is not a number; separate values with commas") from None
        if not 0.0 <= v <= 1.0:
            raise ConfigError(f"{name}={v:g} is out of range: use values in [0, 1]")
        values.append(v)
    return sorted(set(values))


def grid(policies, tau_prefetch: list[float], tau_approx: list[float], base: RunSettings) -> list[RunSettings]:
    """The settings to run: each policy crossed only with the thresholds it uses."""
    out = []
    for policy in policies:
        prefetch_values = tau_prefetch if policy in PREFETCHING else [base.tau_prefetch]
        approx_values = tau_approx if policy not in EXACT_POLICIES else [0.0]
        for tp in prefetch_values:
            for ta in approx_values:
                out.append(replace(base, policy=policy, tau_prefetch=tp, tau_approx=ta, temperature=0.0))
    return list(dict.fromkeys(out))


def reference_policy(policies) -> str:
    return "resident" if "resident" in policies else next(p for p in policies if p in EXACT_POLICIES)


class TypedData(gr.EventData):
    """A slider's release event: ``value`` is the number in its box as the browser had it when the box was left,
    before Gradio brings it to the slider's nearest end (None when the box held none)."""

    def __init__(self, target, data) -> None:
        super().__init__(target, data)
        self.value = data


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
                self.tau_prefetch = gr.Textbox(DEFAULT_TAU_PREFETCH, label="τ_prefetch values",
                                               info="used by prefetching policies", elem_id="sweep-tp")
                self.tau_approx = gr.Textbox(DEFAULT_TAU_APPROX, label="τ_approx values",
                                             info="used by lossy SPICE policies", elem_id="sweep-ta")
                with gr.Row():
                    # From the smallest step this model runs with, as the chat's (pages.limits.slider_ranges).
                    low, high, step = slider_ranges(info, self.limits)["cache_frac"]
                    self.cache_frac = FreeSlider(low, high, value=d.cache_frac, step=step, label="GPU cache size",
                                                 info=self.cache_info, elem_id="sweep-cache")
                    self.max_new_tokens = FreeSlider(self.limits.sweep_min_tokens, self.limits.sweep_max_tokens,
                                                     value=d.max_new_tokens, step=1,
                                                     label="Tokens per run", elem_id="sweep-tokens")
                # Each menu gets the column's full width: side by side, a shape's label was cut off.
                self.profile = FreeDropdown(list(info.profiles), value=d.profile, label="Hardware profile",
                                            elem_id="sweep-profile")
                self.shape = FreeDropdown(shape_choices(info), value=d.shape, label="Model shape",
                                          info=shape_info(info), elem_id="sweep-shape")
        # A number typed beyond the slider is said under its label: the browser brings it to the slider's end when
        # the box is left (with no word), after the release event has sent what was typed.
        self.cache_frac.release(self.on_cache_typed, inputs=None, outputs=[self.cache_frac], queue=False,
                                api_visibility="private", show_progress="hidden")
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
        ran = self.run_btn.click(self.run, inputs=[self.prompts, self.policies, self.tau_prefetch, self.tau_approx,
                                                   self.cache_frac, self.max_new_tokens, self.profile, self.shape,
                                                   self.session],
                                 outputs=outputs, api_name="sweep" + self.ctx.key, concurrency_id=ENGINE_GROUP,
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

    def on_load(self, request: gr.Request = None):
        rows = self.ctx.last_sweep(owner_of(request))
        if not rows:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        timing = rows[0].get("timing", "")
        return ("Showing your last sweep.", as_plot(figures_sweep.pareto_plot(rows, timing)),
                as_plot(figures_sweep.policy_bars(rows, timing)), _table(rows))

    def on_unload(self, request: gr.Request) -> None:
        """The sweep's page closed: end its sweep between tokens (the chat's unload frees the engine)."""
        session = self._running.pop(getattr(request, "session_hash", None) or "", None)
        if session is not None:
            session.stop, session.reason = True, "the page was closed"
            self.ctx.runner.cancel_owner(f"sweep-{id(session)}", "closed")

    def stop(self, session: SweepSession) -> str:
        if session.running:
            session.stop = True
            return "Stopping after the current run…"
        return "No sweep is running."

    def run(self, prompts_text, policies, tau_prefetch_text, tau_approx_text, cache_frac, max_new_tokens, profile,
            shape, session: SweepSession, progress=gr.Progress(), request: gr.Request = None):
        skip = gr.skip()
        lim = self.limits
        if not isinstance(session, SweepSession):          # API callers cannot break the state
            session = SweepSession()
        try:
            prompts = [p.strip() for p in str(prompts_text or "").splitlines() if p.strip()]
            if not prompts:
                raise ConfigError("Prompts: write at least one prompt, one per line")
            if len(prompts) > lim.sweep_max_prompts:
                raise ConfigError(f"Prompts: {len(prompts)} given; the limit is {lim.sweep_max_prompts}")
            too_long = next((p for p in prompts if len(p) > self.ctx.max_message_chars), None)
            if too_long is not None:
                raise ConfigError(f"Prompts: one is {len(too_long):,} characters; the limit is "
                                  f"{self.ctx.max_message_chars:,}")
            if isinstance(policies, str):
                policies = [policies]
            if not isinstance(policies, (list, tuple)) or not all(isinstance(p, str) for p in policies):
                raise ConfigError("Policies: tick at least one policy")
            policies = [p for p in (policies or [])]
            if not policies:
                raise ConfigError("Policies: tick at least one policy")
            unknown = [p for p in policies if p not in self.info.policies]
            if unknown:
                raise ConfigError(f"Policies: {unknown[0][:40]!r} is unknown; choose from {', '.join(self.info.policies)}")
            check_profile_and_shape(self.info, profile, shape)
            base = replace(self.defaults, cache_frac=cache_share(cache_frac, self.info),
                           max_new_tokens=bounded_number(max_new_tokens, "Tokens per run", lim.sweep_min_tokens,
                                                         lim.sweep_max_tokens, integer=True),
                           profile=profile, shape=shape)
            tau_approx = parse_values(tau_approx_text, "τ_approx")
            notes = []
            if not self.info.has_lore and tau_approx != [0.0]:
                tau_approx = [0.0]
                notes.append("τ_approx was left at 0: this model has no LoRE factors, so nothing is approximated.")
            settings = grid(policies, parse_values(tau_prefetch_text, "τ_prefetch"), tau_approx, base)
        except (SpiceError, TypeError, ValueError) as exc:
            yield f"⚠ Sweep not started: {esc(spice_error_text(exc))}", skip, skip, skip
            return
        total = len(prompts) * (len(settings) + 1)
        if total > lim.sweep_max_runs:
            yield (f"⚠ Sweep not started: it would make {total} runs ({len(settings)} settings × {len(prompts)} "
                   f"prompts, plus references); the limit is {lim.sweep_max_runs}. Use fewer values, policies or "
                   f"prompts."), skip, skip, skip
            return
        if total * base.max_new_tokens > lim.sweep_token_budget:
            yield (f"⚠ Sweep not started: it would generate up to {total * base.max_new_tokens:,} tokens ({total} "
                   f"runs × {base.max_new_tokens} tokens per run); this shared server allows {lim.sweep_token_budget:,} "
                   f"per sweep. Lower Tokens per run, or use fewer values, policies or prompts."), skip, skip, skip
            return
        session.stop, session.running, session.reason = False, True, ""
        owner = f"sweep-{id(session)}"
        visitor = owner_of(request)
        page_session = getattr(request, "session_hash", None) or ""
        if page_session:
            self._running[page_session] = session
        started = time.perf_counter()
        rows: list[dict] = []
        try:
            ref_settings = replace(base, policy=reference_policy(self.info.policies), tau_approx=0.0)
            references = []
            done = 0
            for i, prompt in enumerate(prompts):
                progress((done, total), desc=f"reference {i + 1}/{len(prompts)}")
                ids, ref_summary, error = yield from self._one(owner, visitor, session, prompt, ref_settings,
                                                               f"sweep reference {i + 1}", (done, total))
                done += 1
                if session.stop:
                    break
                if error:
                    yield f"⚠ Reference run failed: {esc(error)}", skip, skip, skip
                    return
                references.append(ids)
            timing = ref_summary.timing if references and ref_summary else self.info.default_timing
            for s in settings:
                if session.stop:
                    break
                per_prompt = []
                for prompt, ref in zip(prompts, references):
                    if session.stop:
                        break
                    progress((done, total), desc=f"{s.policy} τp={s.tau_prefetch:g} τa={s.tau_approx:g}")
                    ids, summary, error = yield from self._one(owner, visitor, session, prompt, s,
                                                               f"sweep {s.policy}", (done, total))
                    done += 1
                    if session.stop:
                        break
                    if error:
                        yield f"⚠ {s.policy} failed: {esc(error)}", skip, skip, skip
                        continue
                    per_prompt.append(((matching_tokens(ref, ids), identical_prefix_share(ref, ids)), summary))
                if per_prompt:
                    rows.append(_row(s, per_prompt, timing))
                    self.ctx.remember_sweep(visitor, rows)
                    yield (f"{len(rows)} of {len(settings)} settings done · {done}/{total} runs · "
                           f"{time.perf_counter() - started:.0f} s", as_plot(figures_sweep.pareto_plot(rows, timing)),
                           as_plot(figures_sweep.policy_bars(rows, timing)), _table(rows))
            verb = (f"Stopped ({session.reason})" if session.reason else "Stopped") if session.stop else "Done"
            yield (f"{verb}: {len(rows)} settings, {done} runs in {time.perf_counter() - started:.0f} s "
                   f"({timing} timing, {base.profile}, {base.shape}). {' '.join(notes)}".strip(),
                   as_plot(figures_sweep.pareto_plot(rows, timing)),
                   as_plot(figures_sweep.policy_bars(rows, timing)), _table(rows))
        finally:
            session.running = False
            if page_session and self._running.get(page_session) is session:
                del self._running[page_session]
            self.ctx.runner.cancel_owner(owner, "closed")

    def _one(self, owner: str, visitor: str, session: SweepSession, prompt: str, settings: RunSettings,
             label: str, done_total: tuple[int, int]):
        """One greedy run (a generator: yields a progress line about once a second, so Gradio can stop
        the sweep while it streams); returns (token ids, summary, error text)."""
        skip = gr.skip()
        try:
            stream: RunStream = self.ctx.runner.start(owner, settings,
                                                      lambda: self.ctx.engine.start_prompt(prompt, settings),
                                                      kind="sweep run")
        except SpiceError as exc:
            return [], None, spice_error_text(exc)
        self.ctx.label_run(stream.run_id, label, visitor)
        ids: list[int] = []
        due = time.monotonic() + STATUS_INTERVAL_S
        while True:
            if session.stop:
                stream.cancel("stop")
            steps, ended = stream.take(0.25)
            ids += [s.token_id for s in steps]
            if ended:
                break
            if time.monotonic() >= due:
                due = time.monotonic() + STATUS_INTERVAL_S
                yield (f"Running {done_total[0] + 1} of {done_total[1]}: {esc(label)} · {len(ids)} tokens",
                       skip, skip, skip)
        return ids, stream.summary(), stream.error


def _row(s: RunSettings, per_prompt: list, timing: str) -> dict:
    summaries = [sm for _, sm in per_prompt if sm is not None]
    mean = lambda xs: statistics.fmean(xs) if xs else 0.0   # noqa: E731
    same = sum(m[0][0] for m, _ in per_prompt)
    total = sum(m[0][1] for m, _ in per_prompt)
    return {"policy": s.policy, "tau_prefetch": s.tau_prefetch, "tau_approx": s.tau_approx, "timing": timing,
            "label": point_label(s),
            "agreement": same / total if total else 1.0, "identical_prefix": mean([m[1] for m, _ in per_prompt]),
            "tpot_ms": mean([x.tpot_ms_median for x in summaries]),
            "tokens_per_s": mean([x.tokens_per_s for x in summaries]), "hit_rate": mean([x.hit_rate for x in summaries]),
            "mb_per_token": mean([timed_bytes(x.shape_bytes_per_token, x.bytes_per_token)[0] / 1e6
                                  for x in summaries]),      # at the shape the TPOT is for
            "stall_ms": mean([x.stall_ms_per_token for x in summaries]), "runs": len(per_prompt)}


def point_label(s: RunSettings) -> str:
    """The Pareto plot's text beside a point: the thresholds this policy uses (none for the plain baselines)."""
    parts = ([f"τp {s.tau_prefetch:g}"] if s.policy in PREFETCHING else []) + \
        ([f"τa {s.tau_approx:g}"] if s.policy not in EXACT_POLICIES else [])
    return " · ".join(parts) or s.policy


def _table(rows: list[dict]) -> pd.DataFrame:
    """Fastest first."""
    rows = sorted(rows, key=lambda r: (r["tpot_ms"], -r["agreement"]))
    return pd.DataFrame([[r["policy"], r["tau_prefetch"], r["tau_approx"], round(100 * r["agreement"], 1),
                          round(100 * r.get("identical_prefix", 0.0), 1),
                          round(r["tpot_ms"], 3), round(r["tokens_per_s"], 1), round(100 * r["hit_rate"], 1),
                          round(r["mb_per_token"], 2), round(r["stall_ms"], 3), r["runs"]] for r in rows],
                        columns=TABLE_COLUMNS)


def build(ctx: AppContext, tunes: TuneBook | None = None) -> SweepPage:
    """Create the sweep page's components in the caller's context (``tunes``: the picks, shared with the chat)."""
    page = SweepPage(ctx, tunes)
    page.build()
    return page
