"""The sweep's results as the page shows them: one row per setting, its table, and the page's four outputs.

    per setting: [((matching tokens, reference tokens), identical prefix), RunSummary] per prompt
        ──► setting_row (pooled agreement, mean TPOT, hit rate, bytes at the timed shape, ...) ──► rows
    rows ──► sweep_views ──► (status line, Pareto plot, policy bars, table fastest first)

The agreement is the project's one greedy agreement (spice_core.api.greedy_agreement: positions with the reference's
token over the longer sequence), pooled over the prompts as the benchmarks pool it (matching positions summed, then
divided); the table also gives the identical prefix (share of the reference reproduced before the first different
token) under that name. Plain values: knows nothing of running a sweep.
"""
from __future__ import annotations

import statistics

import pandas as pd

from spice_core.api import EXACT_POLICIES, RunSettings
from pages import figures_sweep
from pages.common import as_plot, timed_bytes
from pages.sweep_inputs import PREFETCHING

TABLE_COLUMNS = ["policy", "τ_prefetch", "τ_approx", "greedy agreement %", "identical prefix %", "TPOT ms", "tokens/s",
                 "hit rate %", "MB / token (timed shape)", "stall ms / token", "runs"]


def setting_row(s: RunSettings, per_prompt: list, timing: str) -> dict:
    """One setting's numbers over its prompts (``per_prompt``: ((matching, total), identical prefix), summary)."""
    summaries = [sm for _, sm in per_prompt if sm is not None]
    mean = lambda xs: statistics.fmean(xs) if xs else 0.0   # noqa: E731
    same = sum(m[0][0] for m, _ in per_prompt)
    total = sum(m[0][1] for m, _ in per_prompt)
    return {"policy": s.policy, "tau_prefetch": s.tau_prefetch, "tau_approx": s.tau_approx, "timing": timing,
            "label": point_label(s),
            "agreement": same / total if total else 1.0, "identical_prefix": mean([m[1] for m, _ in per_prompt]),
            "tpot_ms": (tpot := mean([x.tpot_ms_median for x in summaries])),
            # of the row's TPOT, as everywhere else in the app (a mean of the prompts' rates was not 1000 / TPOT)
            "tokens_per_s": 1000.0 / tpot if tpot > 0 else 0.0, "hit_rate": mean([x.hit_rate for x in summaries]),
            "mb_per_token": mean([timed_bytes(x.shape_bytes_per_token, x.bytes_per_token)[0] / 1e6
                                  for x in summaries]),      # at the shape the TPOT is for
            "stall_ms": mean([x.stall_ms_per_token for x in summaries]), "runs": len(per_prompt)}


def point_label(s: RunSettings) -> str:
    """The Pareto plot's text beside a point: the thresholds this policy uses (none for the plain baselines)."""
    parts = ([f"τp {s.tau_prefetch:g}"] if s.policy in PREFETCHING else []) + \
        ([f"τa {s.tau_approx:g}"] if s.policy not in EXACT_POLICIES else [])
    return " · ".join(parts) or s.policy


def settings_table(rows: list[dict]) -> pd.DataFrame:
    """Fastest first."""
    rows = sorted(rows, key=lambda r: (r["tpot_ms"], -r["agreement"]))
    return pd.DataFrame([[r["policy"], r["tau_prefetch"], r["tau_approx"], round(100 * r["agreement"], 1),
                          round(100 * r.get("identical_prefix", 0.0), 1),
                          round(r["tpot_ms"], 3), round(r["tokens_per_s"], 1), round(100 * r["hit_rate"], 1),
                          round(r["mb_per_token"], 2), round(r["stall_ms"], 3), r["runs"]] for r in rows],
                        columns=TABLE_COLUMNS)


def sweep_views(status: str, rows: list[dict], timing: str) -> tuple:
    """The page's outputs for ``rows``: (status line, Pareto plot, policy bars, table)."""
    return (status, as_plot(figures_sweep.pareto_plot(rows, timing)), as_plot(figures_sweep.policy_bars(rows, timing)),
            settings_table(rows))
