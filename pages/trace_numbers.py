"""The trace explorer's numbers, computed from a run's trace events (one schema for measured and modeled runs):
the per-layer table, the per-token series, the comparison of two runs per layer, and the timeline's window.

    events (spice_core.api TraceEvent) ──► per_layer_frame ──► per-layer table (LAYER_COLUMNS)
                                       ──► per_token_series ──► the per-token chart's series
    two per-layer tables ──► compare_frame ──► side by side (COMPARE_COLUMNS)
    "From token" / "Tokens shown" ──► window_bounds / fit_window ──► the timeline's window, within the run's tokens

Pure functions of their arguments: knows nothing of Gradio, of the page or of who may open a run; every metric is
defined once, in the engine (trace.metrics, reached through spice_core.api).
"""
from __future__ import annotations

from collections import defaultdict

import pandas as pd

from pages.limits import Limits
from spice_core import api as metrics   # the one definition of every metric (trace.metrics)

DEFAULT_WINDOW_TOKENS = 16
MAX_WINDOW_TOKENS = Limits.trace_max_window_tokens     # the app's one limit on "Tokens shown"
MAX_FIRST_TOKEN = 10**9
# "prefetched hit %" are prefetches in time; "late prefetch %" those whose copy came after the layer needed it
# (a stall, not a hit: trace.metrics), so hit % + prefetched hit % is the layer's hit rate, as in the chat.
# "CPU int8 %" are misses run on the CPU lane from the experts' int8 copy (lossy), apart from the exact "CPU %",
# as the run summary's miss split and the exports' experts_cpu_int8 count them; the shares add up to 100.
LAYER_COLUMNS = ["layer", "selections", "hit %", "prefetched hit %", "late prefetch %", "approx %", "CPU %",
                 "CPU int8 %", "copied %", "prefetches", "wasted prefetches", "MB copied / token (timed shape)",
                 "stall ms / token"]


def per_layer_frame(events, n_tokens: int) -> pd.DataFrame:
    """One row per layer that routed anything: outcome shares, bytes and stalls per token over the decode tokens
    (the run summary's scope, trace.metrics: its cards and this table agree), prefetch counts over the run."""
    scope = metrics.scope_tokens(n_tokens)
    table = metrics.per_layer_counts(metrics.outcomes_from_events(events, scope))
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
        if e.token not in scope:         # the prefill's copies and stalls are not a decode token's
            continue
        if e.kind in ("copy", "prefetch"):
            r["bytes"] += e.bytes
        if e.kind == "stall":
            r["stall_ms"] += e.end_ms - e.start_ms
    out = []
    tokens = max(len(scope), 1)
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
