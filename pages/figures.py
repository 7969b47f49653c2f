"""Plotly figures for the live panels, the trace explorer and the sweep, as plain JSON dicts.

Why dicts and not `plotly.graph_objects`: building a validated `go.Figure` (above all through
`make_subplots`) costs 30–70 ms of pure Python per chart; at two refreshes a second for three
live charts that would take a quarter of the interpreter away from token generation. A dict in
Plotly's JSON schema is what the browser receives anyway; `go.Figure(fig)` still opens one for
tests and notebooks.

Conventions (FACTS.md): no figure titles (the gr.Plot label names the chart; a title adds a
100 px margin); Gantt charts are horizontal bars with ``base=start_ms, x=dur_ms`` because
`px.timeline` turns numeric milliseconds into 1970 dates; ``uirevision`` is fixed per chart so a
user's zoom survives live updates. Colours are discrete and shared by every page, each with a
legend entry.

This module knows nothing of Gradio or of how the data was produced.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from spice_core.api import LaneInterval, PrefetchRecord
from pages.live import CATEGORIES, LiveRun

Figure = dict  # {"data": [trace, ...], "layout": {...}} in Plotly's JSON schema

OUTCOME_COLOURS = {
    "not selected": "#e9edf2", "hit": "#2e9d5b", "prefetch_hit": "#2b7bba",
    "approx": "#8e5cc4", "cpu": "#f0a030", "copy": "#d64545",
}
OUTCOME_LABELS = {
    "not selected": "not selected", "hit": "hit (resident)", "prefetch_hit": "prefetched hit",
    "approx": "approximated (LoRE)", "cpu": "CPU lane", "copy": "copied on demand",
}
KIND_COLOURS = {
    "layer": "#9aa5b1", "expert": "#2e9d5b", "approx": "#8e5cc4", "draft": "#5bc0be", "stall": "#f2b8b8",
    "copy": "#d64545", "prefetch": "#2b7bba", "cpu_run": "#f0a030", "token": "#d5dde6",
}
KIND_LABELS = {
    "layer": "attention + shared expert", "expert": "routed expert", "approx": "LoRE surrogate",
    "draft": "draft heads", "stall": "stall (waiting)", "copy": "on-demand copy", "prefetch": "prefetch copy",
    "cpu_run": "expert on CPU", "token": "token (host)",
}
PREFETCH_COLOURS = {"on time": "#2b7bba", "late": "#d64545", "wasted": "#b8c2cc"}
POLICY_COLOURS = ("#2b7bba", "#d64545", "#2e9d5b", "#f0a030", "#8e5cc4", "#5bc0be", "#7f8c99",
                  "#b35c00", "#e377c2", "#17becf")
MUTED = "#6b7785"
GRID = "#e5e9ef"


def _axis(**kw) -> dict:
    return {"gridcolor": GRID, "zerolinecolor": GRID, "linecolor": "#c9d1da", "automargin": True, **kw}


def _layout(height: int, uirevision: str, **kw) -> dict:
    layout = {
        "height": height, "uirevision": uirevision, "margin": {"l": 50, "r": 12, "t": 36, "b": 40},
        "font": {"size": 12, "family": "Inter, system-ui, sans-serif", "color": "#27313c"},
        "paper_bgcolor": "white", "plot_bgcolor": "white", "hoverlabel": {"font": {"size": 12}},
        # top right: the gr.Plot label sits over the top-left corner
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 1, "xanchor": "right",
                   "font": {"size": 11}},
        "xaxis": _axis(), "yaxis": _axis(),
    }
    layout.update(kw)
    return layout


def _note(text: str, x: float = 0.5, y: float = 0.5, xref: str = "paper", yref: str = "paper", **kw) -> dict:
    return {"text": text, "showarrow": False, "x": x, "y": y, "xref": xref, "yref": yref,
            "font": {"size": 12, "color": MUTED}, **kw}


def _subtitle(text: str, x: float, y: float = 1.0, xanchor: str = "left") -> dict:
    return {"text": text, "showarrow": False, "x": x, "y": y, "xref": "paper", "yref": "paper",
            "xanchor": xanchor, "yanchor": "bottom", "font": {"size": 12, "color": "#27313c"}}


def empty_figure(message: str, height: int = 260) -> Figure:
    """A blank chart with a centred hint saying what fills it."""
    return {"data": [], "layout": _layout(height, "empty", xaxis={"visible": False}, yaxis={"visible": False},
                                          annotations=[_note(message)])}


def _bottom_legend(y: float) -> dict:
    """A horizontal legend under the x-axis title (``y`` in plot-area fractions, negative)."""
    return {"orientation": "h", "yanchor": "top", "y": y, "x": 0, "font": {"size": 11}}


def _legend_square(name: str, colour: str) -> dict:
    return {"type": "scatter", "x": [None], "y": [None], "mode": "markers", "name": name, "hoverinfo": "skip",
            "marker": {"symbol": "square", "size": 12, "color": colour, "line": {"width": 1, "color": "#b8c2cc"}}}


# --- heatmap ----------------------------------------------------------------------------------
def _discrete_scale() -> list:
    n = len(CATEGORIES)
    scale = []
    for i, name in enumerate(CATEGORIES):
        scale += [[i / n, OUTCOME_COLOURS[name]], [(i + 1) / n, OUTCOME_COLOURS[name]]]
    return scale


def outcome_heatmap(live: LiveRun) -> Figure:
    """Layer × expert outcomes: the latest token (left) and each expert's most frequent outcome so far (right).

    Hover data stays small (it is resent at every refresh): short outcome names for the token, and the
    five per-outcome counts as numbers for the totals.
    """
    rows = [f"L{layer}" for layer in live.layers]
    experts = list(range(live.n_experts))
    short = np.array(["", "hit", "prefetched", "approx", "CPU", "copied"], dtype=object)
    scale = _discrete_scale()
    common = {"type": "heatmap", "x": experts, "y": rows, "zmin": -0.5, "zmax": len(CATEGORIES) - 0.5,
              "colorscale": scale, "showscale": False, "xgap": 1, "ygap": 1}
    data = [
        {**common, "z": live.current.tolist(), "text": short[live.current].tolist(), "xaxis": "x", "yaxis": "y",
         "hovertemplate": "%{y} · expert %{x}: %{text}<extra>this token</extra>"},
        {**common, "z": live.totals_mode().tolist(), "customdata": live.counts.tolist(), "xaxis": "x2", "yaxis": "y",
         "hovertemplate": "%{y} · expert %{x}: hit %{customdata[0]} · prefetched %{customdata[1]} · "
                          "approx %{customdata[2]} · CPU %{customdata[3]} · copied %{customdata[4]}"
                          "<extra>all tokens</extra>"},
    ]
    data += [_legend_square(OUTCOME_LABELS[c], OUTCOME_COLOURS[c]) for c in CATEGORIES]
    tick = max(1, live.n_experts // 16)
    plot_px = max(120, min(420, 16 * len(rows)))
    layout = _layout(
        plot_px + 150, "heatmap", margin={"l": 46, "r": 12, "t": 44, "b": 106},
        legend=_bottom_legend(-74 / plot_px),
        xaxis=_axis(domain=[0, 0.485], title={"text": "expert"}, dtick=tick, showgrid=False, zeroline=False),
        xaxis2=_axis(domain=[0.515, 1], title={"text": "expert"}, dtick=tick, anchor="y", showgrid=False,
                     zeroline=False),
        yaxis=_axis(autorange="reversed", dtick=max(1, len(rows) // 14), showgrid=False, zeroline=False),
        annotations=[_subtitle(f"token {max(live.n_tokens - 1, 0)}", 0),
                     _subtitle(f"all {live.n_tokens} tokens: most frequent outcome", 0.515)])
    return {"data": data, "layout": layout}


# --- prefetch timeline ------------------------------------------------------------------------
def _prefetch_status(p: PrefetchRecord) -> str:
    if p.needed_ms is None:
        return "wasted"
    return "on time" if p.arrived_ms <= p.needed_ms + 1e-9 else "late"


def prefetch_timeline(live: LiveRun) -> Figure:
    """Top: each recent prefetch's copy (issued → arrived) and when its layer needed it.
    Bottom: adaptive lookahead depth and hit rate per token."""
    groups: dict[str, dict[str, list]] = {}
    needed = {"x": [], "y": [], "text": []}
    for index, p in live.prefetches():
        status = _prefetch_status(p)
        g = groups.setdefault(status, {"base": [], "x": [], "y": [], "text": []})
        g["base"].append(p.issued_ms)
        g["x"].append(max(p.arrived_ms - p.issued_ms, 1e-3))
        g["y"].append(f"L{p.layer}")
        when = "not used by this token" if p.needed_ms is None else f"needed at {p.needed_ms:.2f} ms"
        g["text"].append(f"token {index} · L{p.layer} E{p.expert} · issued after L{p.issued_at_layer} at "
                         f"{p.issued_ms:.2f} ms · arrived {p.arrived_ms:.2f} ms · {when} · "
                         f"confidence {p.confidence:.2f}")
        if p.needed_ms is not None:
            needed["x"].append(p.needed_ms)
            needed["y"].append(f"L{p.layer}")
            needed["text"].append(f"token {index} · L{p.layer} needed E{p.expert} at {p.needed_ms:.2f} ms")
    data = []
    for status in ("on time", "late", "wasted"):
        g = groups.get(status)
        if g:
            data.append({"type": "bar", "orientation": "h", "base": g["base"], "x": g["x"], "y": g["y"],
                         "name": f"prefetch copy: {status}", "marker": {"color": PREFETCH_COLOURS[status]},
                         "hovertext": g["text"], "hoverinfo": "text", "width": 0.55, "opacity": 0.85,
                         "xaxis": "x", "yaxis": "y"})
    if needed["x"]:
        data.append({"type": "scatter", "mode": "markers", "x": needed["x"], "y": needed["y"],
                     "name": "needed by its layer", "hovertext": needed["text"], "hoverinfo": "text",
                     "marker": {"symbol": "line-ns-open", "size": 13, "color": "#1d2733", "line": {"width": 2}},
                     "xaxis": "x", "yaxis": "y"})
    tokens = list(range(len(live.lookahead)))
    hit_pct = [None if h != h else round(100 * h, 1) for h in live.hit_rate_per_step]   # NaN -> gap
    data.append({"type": "scatter", "mode": "lines+markers", "x": tokens, "y": live.lookahead,
                 "name": "lookahead depth (layers)", "line": {"color": "#2b7bba", "shape": "hv"},
                 "marker": {"size": 4}, "xaxis": "x2", "yaxis": "y2"})
    data.append({"type": "scatter", "mode": "lines", "x": tokens, "y": hit_pct, "name": "hit rate %",
                 "line": {"color": "#2e9d5b", "dash": "dot"}, "xaxis": "x2", "yaxis": "y3"})
    # Zoom on the prefetches that were used: a wasted one may have been issued long before (it is
    # reported when its layer passes without needing it) and would squeeze the rest into a corner.
    used = [p for _, p in live.prefetches() if p.needed_ms is not None] or [p for _, p in live.prefetches()]
    x_range = None
    if used:
        lo = min(p.issued_ms for p in used)
        hi = max(max(p.arrived_ms, p.needed_ms or p.arrived_ms) for p in used)
        pad = 0.03 * max(hi - lo, 1e-3)
        x_range = [lo - pad, hi + pad]
    annotations = [_subtitle("prefetches of the last tokens: copy issued → arrived, | = needed", 0, 1.0),
                   _subtitle("per token", 0, 0.3)]
    if not groups:
        annotations.append(_note("no prefetches yet (baselines never prefetch)", 0.5, 0.72))
    layout = _layout(
        450, "prefetch", barmode="overlay", margin={"l": 50, "r": 46, "t": 44, "b": 96},
        legend=_bottom_legend(-0.16),
        xaxis=_axis(domain=[0, 1], anchor="y", title={"text": "ms from the start of the run", "standoff": 4},
                    **({"range": x_range} if x_range else {})),
        yaxis=_axis(domain=[0.47, 1], anchor="x", type="category", categoryorder="array",
                    categoryarray=[f"L{layer}" for layer in live.layers],
                    range=[len(live.layers) - 0.5, -0.5], dtick=-(-len(live.layers) // 9)),
        xaxis2=_axis(domain=[0, 1], anchor="y2", title={"text": "token", "standoff": 4}),
        yaxis2=_axis(domain=[0, 0.3], anchor="x2", title={"text": "depth"}, rangemode="tozero"),
        yaxis3=_axis(overlaying="y2", side="right", anchor="x2", range=[0, 105], title={"text": "hit %"},
                     showgrid=False),
        annotations=annotations)
    return {"data": data, "layout": layout}


# --- lane Gantt -------------------------------------------------------------------------------
def lane_order(lanes: Iterable[str]) -> list[str]:
    """gpu, copy (and its overflow tracks), cpu0..cpuN, host, then anything else by name."""
    def key(lane: str):
        if lane == "gpu":
            return (0, 0, lane)
        if lane.startswith("copy"):
            return (1, 0, lane)
        if lane.startswith("cpu") and lane[3:].isdigit():
            return (2, int(lane[3:]), lane)
        if lane == "host":
            return (3, 0, lane)
        return (4, 0, lane)
    return sorted(set(lanes), key=key)


def merge_touching(intervals: Iterable, gap_ms: float = 1e-4) -> list[tuple[str, str, float, float, list]]:
    """(lane, kind, start_ms, end_ms, [(layer, expert), ...]) with back-to-back intervals of one kind on one
    lane merged: a token's six routed experts on the GPU become one bar, which keeps the browser fast."""
    ordered = sorted((iv for iv in intervals if iv.end_ms > iv.start_ms), key=lambda iv: (iv.lane, iv.start_ms))
    merged: list[list] = []
    open_by_key: dict[tuple[str, str], list] = {}
    for iv in ordered:
        key = (iv.lane, iv.kind)
        cur = open_by_key.get(key)
        if cur is not None and iv.start_ms - cur[3] <= gap_ms and merged and merged[-1] is cur:
            cur[3] = max(cur[3], iv.end_ms)
            cur[4].append((iv.layer, iv.expert))
            continue
        cur = [iv.lane, iv.kind, iv.start_ms, iv.end_ms, [(iv.layer, iv.expert)]]
        merged.append(cur)
        open_by_key[key] = cur
    return [tuple(m) for m in merged]


def _where(parts: list) -> str:
    layers = sorted({layer for layer, _ in parts if layer >= 0})
    if not layers:
        return ""
    experts = [f"E{e}" for _, e in parts if e >= 0]
    head = f" · L{layers[0]}" if len(layers) == 1 else f" · L{layers[0]}–L{layers[-1]}"
    if not experts:
        return head
    shown = ", ".join(experts[:8]) + (f" +{len(experts) - 8}" if len(experts) > 8 else "")
    return f"{head} {shown}"


def lane_gantt(intervals: Iterable, *, uirevision: str = "gantt", max_bars: int = 20_000,
               empty_hint: str = "no lane activity yet: send a message") -> Figure:
    """One row per lane, one bar per busy interval coloured by kind (ms from the run's start).

    Accepts anything with lane / kind / start_ms / end_ms / layer / expert (LaneInterval, TraceEvent).
    Back-to-back intervals of one kind on one lane are drawn as one bar (hover lists what it holds).
    """
    by_kind: dict[str, dict[str, list]] = {}
    lanes: set[str] = set()
    shown = truncated = 0
    for lane, kind, start, end, parts in merge_touching(intervals):
        if shown >= max_bars:
            truncated += 1
            continue
        shown += 1
        lanes.add(lane)
        g = by_kind.setdefault(kind, {"base": [], "x": [], "y": [], "text": []})
        g["base"].append(round(start, 4))
        g["x"].append(round(end - start, 4))
        g["y"].append(lane)
        count = f" ×{len(parts)}" if len(parts) > 1 else ""
        g["text"].append(f"{KIND_LABELS.get(kind, kind)}{count}{_where(parts)} · {start:.3f}–{end:.3f} ms "
                         f"({end - start:.3f} ms)")
    if not by_kind:
        return empty_figure(empty_hint)
    known = list(KIND_COLOURS)
    data = []
    for kind in sorted(by_kind, key=lambda k: (known.index(k) if k in known else len(known), k)):
        g = by_kind[kind]
        data.append({"type": "bar", "orientation": "h", "base": g["base"], "x": g["x"], "y": g["y"],
                     "name": KIND_LABELS.get(kind, kind), "hovertext": g["text"], "hoverinfo": "text",
                     "marker": {"color": KIND_COLOURS.get(kind, "#7f8c99"), "line": {"width": 0}},
                     "width": 0.9 if kind == "token" else 0.7})
    order = lane_order(lanes)
    annotations = []
    if truncated:
        annotations.append(_note(f"{truncated:,} more bars not drawn: narrow the token range", 1, -0.3,
                                 xanchor="right"))
    layout = _layout(max(300, 170 + 34 * len(order)), uirevision, barmode="overlay", bargap=0.2,
                     margin={"l": 50, "r": 12, "t": 44, "b": 110}, legend=_bottom_legend(-58 / (34 * len(order) + 16)),
                     xaxis=_axis(title={"text": "ms from the start of the run"}),
                     yaxis=_axis(type="category", categoryorder="array", categoryarray=order, autorange="reversed"),
                     annotations=annotations)
    return {"data": data, "layout": layout}


# --- trace explorer: per-token overview -------------------------------------------------------
def token_overview(index: Sequence[int], step_ms: Sequence[float], stall_ms: Sequence[float],
                   mb_copied: Sequence[float], timing: str) -> Figure:
    """Step time per token split into stall and the rest, and MB copied (token 0 includes the prefill)."""
    index = list(index)
    rest = [round(max(s - w, 0.0), 4) for s, w in zip(step_ms, stall_ms)]
    data = [
        {"type": "bar", "x": index, "y": rest, "name": "compute and overlapped copies (ms)",
         "marker": {"color": "#9aa5b1"}},
        {"type": "bar", "x": index, "y": [round(w, 4) for w in stall_ms], "name": "stall (ms)",
         "marker": {"color": "#d64545"}},
        {"type": "scatter", "mode": "lines", "x": index, "y": [round(m, 3) for m in mb_copied], "name": "MB copied",
         "line": {"color": "#2b7bba"}, "yaxis": "y2"},
    ]
    layout = _layout(300, "overview", barmode="stack", margin={"l": 56, "r": 56, "t": 36, "b": 40},
                     xaxis=_axis(title={"text": "token (0 includes the prefill)"}),
                     yaxis=_axis(title={"text": f"ms per token ({timing})"}),
                     yaxis2=_axis(overlaying="y", side="right", title={"text": "MB copied"}, showgrid=False,
                                  rangemode="tozero"))
    return {"data": data, "layout": layout}


# --- sweep ------------------------------------------------------------------------------------
def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated (TPOT, agreement) points: lower TPOT, higher agreement; by TPOT."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def pareto_plot(rows: Sequence[dict], timing: str) -> Figure:
    """Greedy agreement vs TPOT per setting, one colour per policy, and the Pareto front."""
    if not rows:
        return empty_figure("run a sweep to see the speed–quality trade-off", 400)
    data = []
    for i, policy in enumerate(dict.fromkeys(r["policy"] for r in rows)):
        mine = [r for r in rows if r["policy"] == policy]
        data.append({
            "type": "scatter", "mode": "markers", "name": policy,
            "x": [r["tpot_ms"] for r in mine], "y": [round(100 * r["agreement"], 2) for r in mine],
            "marker": {"size": 11, "color": POLICY_COLOURS[i % len(POLICY_COLOURS)],
                       "line": {"width": 1, "color": "white"}},
            "hovertext": [f"{policy} · τ_prefetch {r['tau_prefetch']} · τ_approx {r['tau_approx']}<br>"
                          f"TPOT {r['tpot_ms']:.2f} ms · agreement {100 * r['agreement']:.0f}% · "
                          f"hit rate {100 * r['hit_rate']:.0f}%" for r in mine],
            "hoverinfo": "text"})
    front = pareto_front([(r["tpot_ms"], r["agreement"]) for r in rows])
    data.append({"type": "scatter", "mode": "lines+markers", "name": "Pareto front", "hoverinfo": "skip",
                 "x": [rows[i]["tpot_ms"] for i in front], "y": [round(100 * rows[i]["agreement"], 2) for i in front],
                 "line": {"color": "#1d2733", "dash": "dash", "width": 1.5},
                 "marker": {"symbol": "circle-open", "size": 18, "color": "#1d2733", "line": {"width": 1.5}}})
    layout = _layout(420, "pareto", xaxis=_axis(title={"text": f"TPOT, median ms ({timing}): lower is faster"}),
                     yaxis=_axis(title={"text": "greedy agreement with the exact run (%)"}, range=[-3, 103]))
    return {"data": data, "layout": layout}


def policy_bars(rows: Sequence[dict], timing: str) -> Figure:
    """Policies side by side at each one's best setting (highest agreement, then lowest TPOT)."""
    if not rows:
        return empty_figure("run a sweep to compare policies", 300)
    best: dict[str, dict] = {}
    for r in rows:
        cur = best.get(r["policy"])
        if cur is None or (r["agreement"], -r["tpot_ms"]) > (cur["agreement"], -cur["tpot_ms"]):
            best[r["policy"]] = r
    names = list(best)
    data = [
        {"type": "bar", "x": names, "y": [best[p]["tpot_ms"] for p in names], "name": "TPOT (ms)",
         "marker": {"color": "#2b7bba"}, "offsetgroup": "tpot"},
        {"type": "bar", "x": names, "y": [round(100 * best[p]["hit_rate"], 1) for p in names], "name": "hit rate (%)",
         "marker": {"color": "#2e9d5b"}, "offsetgroup": "hit", "yaxis": "y2"},
    ]
    layout = _layout(320, "policies", barmode="group", margin={"l": 56, "r": 56, "t": 36, "b": 60},
                     yaxis=_axis(title={"text": f"TPOT ms ({timing})"}),
                     yaxis2=_axis(overlaying="y", side="right", range=[0, 105], title={"text": "hit rate %"},
                                  showgrid=False))
    return {"data": data, "layout": layout}
