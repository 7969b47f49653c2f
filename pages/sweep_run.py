"""Running a sweep's plan: every prompt once with exact settings (the reference), then once per setting of the grid.

    SweepPlan ──► run_sweep (a generator of the page's outputs)
        prompts × {exact reference}  ──► reference tokens per prompt (greedy, exact policy)
        prompts × settings grid      ──► engine.start_prompt ──► tokens + RunSummary per run
                                     ──► per setting: a row (pages.sweep_table), the views redrawn

Runs go through the same runner and concurrency group as the chat, one at a time. The generator yields while every
run streams (a progress line about once a second), so Gradio can stop it when the visitor leaves; Stop, closing the
page (unload) and a vanished reader (the runner's orphan watchdog) all end the sweep between tokens or runs. A sweep
never pre-empts anyone else's reply (pages.runner). Always at temperature 0.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import gradio as gr

from spice_core.api import RunSettings, identical_prefix_share, matching_tokens
from spice_core.errors import SpiceError
from pages.common import AppContext, spice_error_text
from pages.owners import esc
from pages.runner import RunStream
from pages.sweep_inputs import SweepPlan, reference_policy
from pages.sweep_table import setting_row, sweep_views

STATUS_INTERVAL_S = 1.0       # a progress line at most once a second while a run streams


@dataclass
class SweepSession:
    stop: bool = False
    running: bool = False
    reason: str = ""             # why it stopped early ("" = the visitor pressed Stop)

    def start(self) -> None:
        """A new sweep in this session: running, and not (yet) asked to stop."""
        self.stop, self.running, self.reason = False, True, ""


def sweep_owner(session: SweepSession) -> str:
    """Whom the runner books a sweep's runs to: its session (one sweep at a time per page)."""
    return f"sweep-{id(session)}"


def run_sweep(ctx: AppContext, plan: SweepPlan, session: SweepSession, visitor: str, progress):
    """Run ``plan`` in ``session`` (started: `SweepSession.start`): yields (status, Pareto plot, policy bars, table) as
    it goes; the runs belong to ``visitor``."""
    skip = gr.skip()
    owner = sweep_owner(session)
    total, started = plan.n_runs, time.perf_counter()
    rows: list[dict] = []
    try:
        ref_settings = replace(plan.base, policy=reference_policy(ctx.info.policies), tau_approx=0.0)
        references, ref_summary, done = [], None, 0
        for i, prompt in enumerate(plan.prompts):
            progress((done, total), desc=f"reference {i + 1}/{len(plan.prompts)}")
            ids, ref_summary, error = yield from _one(ctx, owner, visitor, session, prompt, ref_settings,
                                                      f"sweep reference {i + 1}", (done, total))
            if session.stop:          # the run Stop cut short is not counted as done
                break
            done += 1
            if error:
                yield f"⚠ Reference run failed: {esc(error)}", skip, skip, skip
                return
            references.append(ids)
        timing = ref_summary.timing if references and ref_summary else ctx.info.default_timing
        for s in plan.settings:
            if session.stop:
                break
            per_prompt = []
            for j, (prompt, ref) in enumerate(zip(plan.prompts, references)):
                if session.stop:
                    break
                progress((done, total), desc=f"{s.policy} τp={s.tau_prefetch:g} τa={s.tau_approx:g}")
                ids, summary, error = yield from _one(ctx, owner, visitor, session, prompt, s,
                                                      f"sweep {s.policy} τp={s.tau_prefetch:g} τa={s.tau_approx:g} "
                                                      f"· prompt {j + 1}", (done, total))
                if session.stop:
                    break
                done += 1
                if error:
                    yield f"⚠ {s.policy} failed: {esc(error)}", skip, skip, skip
                    continue
                per_prompt.append(((matching_tokens(ref, ids), identical_prefix_share(ref, ids)), summary))
            if per_prompt:
                rows.append(setting_row(s, per_prompt, timing))
                ctx.remember_sweep(visitor, rows)
                yield sweep_views(f"{len(rows)} of {len(plan.settings)} settings done · {done}/{total} runs · "
                                  f"{time.perf_counter() - started:.0f} s", rows, timing)
        verb = (f"Stopped ({session.reason})" if session.reason else "Stopped") if session.stop else "Done"
        yield sweep_views(f"{verb}: {_count(len(rows), 'setting')}, {_count(done, 'run')} in "
                          f"{time.perf_counter() - started:.0f} s "
                          f"({timing} timing, {plan.base.profile}, {plan.base.shape}). {' '.join(plan.notes)}".strip(),
                          rows, timing)
    finally:
        session.running = False
        ctx.runner.cancel_owner(owner, "closed")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _one(ctx: AppContext, owner: str, visitor: str, session: SweepSession, prompt: str, settings: RunSettings,
         label: str, done_total: tuple[int, int]):
    """One greedy run (a generator: yields a progress line about once a second, so Gradio can stop the sweep while
    it streams); returns (token ids, summary, error text)."""
    skip = gr.skip()
    try:
        stream: RunStream = ctx.runner.start(owner, settings, lambda: ctx.engine.start_prompt(prompt, settings),
                                             kind="sweep run")
    except SpiceError as exc:
        return [], None, spice_error_text(exc)
    ctx.label_run(stream.run_id, label, visitor)
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
