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

Every chart must also read on a phone, where gr.Plot is about 330 px wide (desktop: 500–950 px), and
the server cannot know which: text placed in the figure is sized for the phone. Subtitles and notes
are short or broken onto lines of at most `LINE_CHARS` characters (`_wrap`); the top margin grows
with a subtitle's lines, because the gr.Plot label covers the figure's top-left corner. A legend under
a chart sits at the figure's bottom edge (`_bottom_legend`): the rows it needs on a phone come out of
the plot area as a whole, never out of the gap between an axis and the text below it.

This module knows nothing of Gradio or of how the data was produced.
"""
from __future__ import annotations

import json
from typing import Iterable, Sequence

import numpy as np

from spice_core.api import LaneInterval, PrefetchRecord
from pages.live import CATEGORIES, LiveRun

Figure = dict  # {"data": [trace, ...], "layout": {...}} in Plotly's JSON schema

# Okabe–Ito: distinguishable under the common colour-vision deficiencies (deuteranopia, protanopia,
# tritanopia). "not selected" is a translucent grey so the heatmap reads on light and dark pages.
OKABE_ITO = {"orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73", "yellow": "#F0E442", "blue": "#0072B2",
             "vermillion": "#D55E00", "purple": "#CC79A7", "grey": "#999999", "black": "#000000"}
OUTCOME_COLOURS = {
    "not selected": "rgba(140,150,162,0.16)", "hit": OKABE_ITO["green"], "prefetch_hit": OKABE_ITO["sky"],
    "approx": OKABE_ITO["purple"], "cpu": OKABE_ITO["orange"], "copy": OKABE_ITO["vermillion"],
    "prefetch_late": OKABE_ITO["yellow"], "cpu_int8": OKABE_ITO["blue"],
}
# Simulated deuteranopia and protanopia bring two pairs of these colours close (CIE76 distance about 18) in a
# cell 10 px wide: green and reddish purple (hit, approximated) and orange and vermillion (CPU, copied; orange is
# as close to a late prefetch's yellow). Any six of Okabe–Ito's seven colours hold such a pair, so approximated
# and CPU cells also carry a mark (a dot, a cross), which the legend's first character draws; outcomes without
# one stay at least 33 apart. The marks are markers, not cell text (Plotly lays out every text apart: 260 marks
# in text made a live refresh of the heatmap twice as long), and while a reply streams only the token's grid
# has them (tens of cells; the right grid's run to a thousand and more, drawn once, when the reply ends). The
# int8 CPU run's blue, the seventh colour, comes as close to the prefetched hit's sky and the approximation's
# purple, so it carries a mark of its own (a plus). The lane chart hatches the LoRE surrogate's bars, which sit
# beside the routed experts' on the GPU lane.
OUTCOME_MARKS = {"approx": ("•", "circle"), "cpu": ("×", "x-thin-open"),
                 "cpu_int8": ("+", "cross-thin-open")}   # (the legend's, the cell's)
OUTCOME_LABELS = {
    "not selected": "not selected", "hit": "hit (resident)", "prefetch_hit": "prefetched hit",
    "approx": "• approximated (LoRE)", "cpu": "× CPU lane", "copy": "copied on demand",
    "prefetch_late": "prefetched late (stalled)", "cpu_int8": "+ CPU lane, int8 (lossy)",
}
KIND_COLOURS = {
    "layer": "#9aa5b1", "expert": OKABE_ITO["green"], "approx": OKABE_ITO["purple"], "draft": OKABE_ITO["yellow"],
    "stall": "rgba(213,94,0,0.45)", "copy": OKABE_ITO["vermillion"], "prefetch": OKABE_ITO["sky"],
    "cpu_run": OKABE_ITO["orange"], "token": "rgba(140,150,162,0.35)",
}
# The LoRE surrogate's bars are hatched: they sit beside the routed experts' on the GPU lane (see OUTCOME_MARKS).
KIND_PATTERNS = {"approx": {"shape": "/", "fillmode": "overlay", "fgcolor": "#ffffff", "size": 6, "solidity": 0.3}}
KIND_LABELS = {
    "layer": "attention + shared expert", "expert": "routed expert", "approx": "LoRE surrogate",
    "draft": "draft heads", "stall": "stall (waiting)", "copy": "on-demand copy", "prefetch": "prefetch copy",
    "cpu_run": "expert on CPU", "token": "token (host)",
}
PREFETCH_COLOURS = {"on time": OKABE_ITO["blue"], "late": OKABE_ITO["vermillion"], "wasted": "rgba(140,150,162,0.55)"}
POLICY_COLOURS = (OKABE_ITO["blue"], OKABE_ITO["vermillion"], OKABE_ITO["green"], OKABE_ITO["orange"],
                  OKABE_ITO["purple"], OKABE_ITO["sky"], OKABE_ITO["yellow"], OKABE_ITO["grey"], OKABE_ITO["black"],
                  "#8c6d31")
# Neutral inks chosen to read on white and on Gradio's dark background; the app's CSS recolours
# text and grid lines in dark mode (Plotly writes them inline, a stylesheet `!important` wins).
INK = "#27313c"
MUTED = "#6b7785"
MID = "#7a8694"           # markers and lines that must show on light and dark backgrounds
MARK_INK = "rgba(39,49,60,0.75)"   # the heatmap's marks (OUTCOME_MARKS): INK, a little lighter over the cells
GRID = "rgba(140,150,162,0.25)"
TRANSPARENT = "rgba(0,0,0,0)"


def _axis(**kw) -> dict:
    return {"gridcolor": GRID, "zerolinecolor": GRID, "linecolor": "rgba(140,150,162,0.5)", "automargin": True, **kw}


def _layout(height: int, uirevision: str, **kw) -> dict:
    layout = {
        "height": height, "uirevision": uirevision, "margin": {"l": 50, "r": 12, "t": 36, "b": 40},
        "font": {"size": 12, "family": "Inter, system-ui, sans-serif", "color": INK},
        "paper_bgcolor": TRANSPARENT, "plot_bgcolor": TRANSPARENT, "hoverlabel": {"font": {"size": 12}},
        # top right: the gr.Plot label sits over the top-left corner
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 1, "xanchor": "right",
                   "font": {"size": 11}, "bgcolor": TRANSPARENT},
        "xaxis": _axis(), "yaxis": _axis(),
    }
    layout.update(kw)
    return layout


# Text in a figure is 12 px: about 6.5 px a character, so a line of LINE_CHARS fits a 360 px phone's
# plot (about 250 px between the axis labels and the edge).
LINE_CHARS = 36
LINE_PX = 15                     # one more line of 12 px text in a subtitle
LABEL_PX = 30                    # the gr.Plot label over the figure's top-left corner, and a gap


def _greedy_lines(words: list[str], width: int) -> list[str]:
    lines: list[str] = []
    for word in words:
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def _wrap(text: str, width: int = LINE_CHARS) -> str:
    """``text`` on as few lines of at most ``width`` characters as it needs, broken at spaces with "<br>".

    The lines are balanced ("lane activity appears here" / "while a reply streams", not a long line and
    an orphan word); a word longer than ``width`` keeps a line of its own.
    """
    words = text.split()
    if len(text) <= width or len(words) < 2:
        return text
    n_lines = len(_greedy_lines(words, width))
    for narrower in range(-(-len(text) // n_lines), width):
        lines = _greedy_lines(words, narrower)
        if len(lines) == n_lines:
            return "<br>".join(lines)
    return "<br>".join(_greedy_lines(words, width))


def _lines(text: str) -> int:
    return text.count("<br>") + 1


def _note(text: str, x: float = 0.5, y: float = 0.5, xref: str = "paper", yref: str = "paper", **kw) -> dict:
    return {"text": _wrap(text), "showarrow": False, "x": x, "y": y, "xref": xref, "yref": yref,
            "font": {"size": 12, "color": MUTED}, **kw}


def _subtitle(text: str, x: float, y: float = 1.0, xanchor: str = "left") -> dict:
    """Text over a plot's top edge, left-aligned; ``text`` carries its own "<br>"s (see `_wrap`)."""
    return {"text": text, "showarrow": False, "x": x, "y": y, "xref": "paper", "yref": "paper",
            "xanchor": xanchor, "yanchor": "bottom", "align": "left", "font": {"size": 12, "color": INK}}


def _top_px(lines: int) -> int:
    """The top margin that fits ``lines`` of subtitle under the gr.Plot label."""
    return LABEL_PX + LINE_PX * max(lines, 1)


def empty_figure(message: str, height: int = 260) -> Figure:
    """A blank chart with a centred hint saying what fills it."""
    return {"data": [], "layout": _layout(height, "empty", xaxis={"visible": False}, yaxis={"visible": False},
                                          annotations=[_note(message)])}


def _bottom_legend() -> dict:
    """A horizontal legend along the figure's bottom edge, under the x-axis title.

    Anchored to the figure (``yref="container"``), Plotly reserves the legend's height as bottom margin
    and lays the axes out above it. Anchored to the plot area instead, a legend that wraps onto more
    rows on a phone squeezed the plot while its offset (a fraction of the plot) shrank, and it rode up
    over the x-axis title.
    """
    return {"orientation": "h", "yref": "container", "yanchor": "bottom", "y": 0, "x": 0, "xanchor": "left",
            "font": {"size": 11}, "bgcolor": TRANSPARENT}


def _legend_square(name: str, colour: str) -> dict:
    return {"type": "scatter", "x": [None], "y": [None], "mode": "markers", "name": name, "hoverinfo": "skip",
            "marker": {"symbol": "square", "size": 12, "color": colour, "line": {"width": 1, "color": "rgba(140,150,162,0.6)"}}}


# --- heatmap ----------------------------------------------------------------------------------
def _discrete_scale() -> list:
    n = len(CATEGORIES)
    scale = []
    for i, name in enumerate(CATEGORIES):
        scale += [[i / n, OUTCOME_COLOURS[name]], [(i + 1) / n, OUTCOME_COLOURS[name]]]
    return scale


# The right grid encodes how often an expert was used as opacity (an expert used once coloured like one used
# every token said nothing of frequency): each outcome's band of z, [code - 0.5, code + 0.5], fades from
# USUAL_MIN_ALPHA at its bottom to opaque at its top, and a cell sits in its band by the tokens that used it
# over the most any expert was used (the most-used expert is opaque). Relative, not over all tokens: with
# top-k of many experts even a busy expert serves a fraction of the tokens, and every cell would be pale.
USUAL_MIN_ALPHA = 0.3
_BAND_EDGE = 0.01         # keeps a cell inside its band (a band's top is the next band's bottom)


def _faded(colour: str, alpha: float) -> str:
    """'#E69F00', 0.3 -> 'rgba(230,159,0,0.3)'."""
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha:g})"


def _frequency_scale() -> list:
    n = len(CATEGORIES)
    scale = []
    for i, name in enumerate(CATEGORIES):
        colour = OUTCOME_COLOURS[name]
        pale = _faded(colour, USUAL_MIN_ALPHA) if colour.startswith("#") else colour     # "not selected" stays
        scale += [[i / n, pale], [(i + 1) / n, colour]]
    return scale


def usual_outcome_z(live: LiveRun) -> np.ndarray:
    """[L, E] the right grid's z: each expert's usual outcome code, placed within that code's colour band by the
    tokens that used it over the most-used expert's (0 = not selected)."""
    codes, used = live.totals_mode(), live.tokens_used()
    share = used / max(int(used.max()), 1)
    z = np.where(codes > 0, codes - 0.5 + _BAND_EDGE + (1 - 2 * _BAND_EDGE) * share, 0.0)
    return np.round(z, 3)


SHORT_OUTCOMES = ("", "hit", "prefetched", "approx", "CPU", "copied", "late prefetch (stalled)", "CPU int8")  # by code
# The right grid's hover: each outcome's count, in code order (LiveRun.counts' last axis), then the tokens that
# used the expert.
HOVER_COUNTS = ("hit", "prefetched", "approx", "CPU", "copied", "late prefetch", "CPU int8")
USED_INDEX = len(CATEGORIES) - 1             # customdata index of the tokens that used the expert
MARK_SYMBOLS = tuple(OUTCOME_MARKS.get(name, ("", ""))[1] for name in CATEGORIES)                    # by heatmap code


HEATMAP_TITLE_LINES = 2         # the top margin fits this many lines of `heatmap_titles`


def heatmap_titles(live: LiveRun) -> list[str]:
    """The two grids' subtitles. Each grid is half the chart, about 130 px (19 characters) on a phone;
    a live refresh changes only their text (not the margin), so their line count never changes."""
    if live.n_tokens <= 1:          # token 0 comes out of the prefill: every prompt token's experts (review)
        return ["token 0 = prompt<br>(all its tokens)", f"all {live.n_tokens} tokens:<br>usual outcome"]
    return [f"token {live.n_tokens - 1}", f"all {live.n_tokens} tokens:<br>usual outcome"]


def heatmap_delta(live: LiveRun) -> dict:
    """What a live heatmap refresh sends: the two grids as drawn (``z``; the right one shaded by use), their
    [L, E] outcome codes and the subtitles, no figure.

    The browser restyles the figure it already has (``assets/static/spice_live.js``) and rebuilds the
    hover names and the left grid's marks from the codes, so a refresh is about 20 kB (26 layers x 64 experts)
    and skips Plotly's full re-layout.
    """
    current = live.current.tolist()
    return {"z": [current, usual_outcome_z(live).tolist()], "codes": [current, live.totals_mode().tolist()],
            "titles": heatmap_titles(live), "names": list(SHORT_OUTCOMES), "symbols": list(MARK_SYMBOLS)}


def _marks(codes: np.ndarray, rows: list[str], xaxis: str) -> dict:
    """One grid's marks (OUTCOME_MARKS): a marker over each cell whose outcome has one, taking no hover."""
    symbols = np.array(MARK_SYMBOLS, dtype=object)[codes]
    at = np.argwhere(symbols != "")                          # row-major, as symbols[...] below
    return {"type": "scatter", "mode": "markers", "x": at[:, 1].tolist(), "y": [rows[i] for i in at[:, 0]],
            "xaxis": xaxis, "yaxis": "y", "hoverinfo": "skip", "showlegend": False,
            "marker": {"symbol": symbols[symbols != ""].tolist(), "size": 4, "color": MARK_INK,
                       "line": {"width": 1, "color": MARK_INK}}}


def outcome_heatmap(live: LiveRun, *, counts: bool = True, meta: str = "") -> Figure:
    """Layer × expert outcomes: the latest token (left) and each expert's most frequent outcome so far (right),
    paler the fewer tokens used it (`usual_outcome_z`; the legend says so).

    ``counts=False`` (the live figure, updated in place by `heatmap_delta`) leaves out the per-outcome
    counts behind the right grid's hover and the right grid's marks (OUTCOME_MARKS); the figure sent when the
    reply ends carries them.
    """
    rows = [f"L{layer}" for layer in live.layers]
    experts = list(range(live.n_experts))
    short = np.array(SHORT_OUTCOMES, dtype=object)
    scale = _discrete_scale()
    common = {"type": "heatmap", "x": experts, "y": rows, "zmin": -0.5, "zmax": len(CATEGORIES) - 0.5,
              "colorscale": scale, "showscale": False, "xgap": 1, "ygap": 1}
    totals, used = live.totals_mode(), live.tokens_used()
    right = {**common, "z": usual_outcome_z(live).tolist(), "colorscale": _frequency_scale(), "xaxis": "x2",
             "yaxis": "y"}
    if counts:
        right |= {"customdata": np.concatenate([live.counts, used[..., None]], axis=-1).tolist(),
                  "hovertemplate": f"%{{y}} · expert %{{x}}: used by %{{customdata[{USED_INDEX}]}} of {live.n_tokens} "
                                   f"tokens (the most-used expert: {int(used.max())}) · "
                                   + " · ".join(f"{name} %{{customdata[{i}]}}" for i, name in enumerate(HOVER_COUNTS))
                                   + "<extra>all tokens</extra>"}
    else:
        right |= {"text": short[totals].tolist(),
                  "hovertemplate": "%{y} · expert %{x}: mostly %{text}<extra>all tokens so far</extra>"}
    data = [
        {**common, "z": live.current.tolist(), "text": short[live.current].tolist(), "xaxis": "x", "yaxis": "y",
         "hovertemplate": "%{y} · expert %{x}: %{text}<extra>this token</extra>"},
        right, _marks(live.current, rows, "x"), _marks(totals if counts else np.zeros_like(totals), rows, "x2"),
    ]
    data += [_legend_square(OUTCOME_LABELS[c], OUTCOME_COLOURS[c]) for c in CATEGORIES]
    data += [_legend_square("right grid, pale: used by few tokens", _faded(MID, USUAL_MIN_ALPHA)),
             _legend_square("solid: as often as the most-used expert", MID)]
    plot_px = max(120, min(420, 16 * len(rows)))
    titles = heatmap_titles(live)
    top_px = _top_px(HEATMAP_TITLE_LINES)
    # No dtick on the expert axes: Plotly then spaces ticks by the axis' width, so they do not collide
    # on a phone.
    layout = _layout(
        plot_px + 126 + top_px, "heatmap", margin={"l": 46, "r": 12, "t": top_px, "b": 40},
        legend=_bottom_legend(),
        # Ranges fixed at the cells' edges: the marks' markers would widen an automatic range.
        xaxis=_axis(domain=[0, 0.485], range=[-0.5, live.n_experts - 0.5], title={"text": "expert", "standoff": 2},
                    showgrid=False, zeroline=False),
        xaxis2=_axis(domain=[0.515, 1], range=[-0.5, live.n_experts - 0.5], title={"text": "expert", "standoff": 2},
                     anchor="y", showgrid=False, zeroline=False),
        yaxis=_axis(range=[len(rows) - 0.5, -0.5], dtick=max(1, len(rows) // 14), showgrid=False, zeroline=False),
        annotations=[_subtitle(titles[0], 0), _subtitle(titles[1], 0.515)])
    if meta:
        layout["meta"] = meta
    return {"data": data, "layout": layout}


# --- prefetch timeline ------------------------------------------------------------------------
def _prefetch_status(p: PrefetchRecord) -> str:
    if p.needed_ms is None:
        return "wasted"
    return "on time" if p.arrived_ms <= p.needed_ms + 1e-9 else "late"


PREFETCH_SUBTITLE = "prefetches of the last tokens:<br>copy issued → arrived, | = needed"
# Two plots stacked in one plot area: the gap between them holds the upper plot's tick labels and
# x-axis title and the lower one's subtitle, about 55 px. The plot area is what the figure's height
# leaves after the margins and the legend (one row on a desktop, three on a phone, about 20 px each),
# so the gap's fraction is sized for the phone's smaller plot area: 0.24 of about 270 px. The legend's
# short names are what fit it in two columns there.
PREFETCH_HEIGHT_PX = 470
PREFETCH_UPPER_FROM = 0.54       # the upper plot's domain starts here (plot-area fractions)
PREFETCH_LOWER = (0.0, 0.3)      # the lower plot's domain


def prefetch_timeline(live: LiveRun, *, meta: str = "") -> Figure:
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
                         "name": status, "marker": {"color": PREFETCH_COLOURS[status]},
                         "hovertext": g["text"], "hoverinfo": "text", "width": 0.55, "opacity": 0.85,
                         "xaxis": "x", "yaxis": "y"})
    if needed["x"]:
        data.append({"type": "scatter", "mode": "markers", "x": needed["x"], "y": needed["y"],
                     "name": "needed", "hovertext": needed["text"], "hoverinfo": "text",
                     "marker": {"symbol": "line-ns-open", "size": 13, "color": MID, "line": {"width": 2}},
                     "xaxis": "x", "yaxis": "y"})
    tokens = list(range(len(live.lookahead)))
    hit_pct = [None if h != h else round(100 * h, 1) for h in live.hit_rate_per_step]   # NaN -> gap
    data.append({"type": "scatter", "mode": "lines+markers", "x": tokens, "y": live.lookahead,
                 "name": "lookahead", "line": {"color": OKABE_ITO["blue"], "shape": "hv"},
                 "marker": {"size": 4}, "xaxis": "x2", "yaxis": "y2"})
    data.append({"type": "scatter", "mode": "lines", "x": tokens, "y": hit_pct, "name": "hit rate %",
                 "line": {"color": OKABE_ITO["green"], "dash": "dot"}, "xaxis": "x2", "yaxis": "y3"})
    # Zoom on the prefetches that were used: a wasted one may have been issued long before (it is
    # reported when its layer passes without needing it) and would squeeze the rest into a corner.
    used = [p for _, p in live.prefetches() if p.needed_ms is not None] or [p for _, p in live.prefetches()]
    x_range = None
    if used:
        lo = min(p.issued_ms for p in used)
        hi = max(max(p.arrived_ms, p.needed_ms or p.arrived_ms) for p in used)
        pad = 0.03 * max(hi - lo, 1e-3)
        x_range = [lo - pad, hi + pad]
    annotations = [_subtitle(PREFETCH_SUBTITLE, 0, 1.0), _subtitle("per token", 0, PREFETCH_LOWER[1])]
    if not groups:
        annotations.append(_note("no prefetches yet (baselines never prefetch)", 0.5, 0.78))
    top_px = _top_px(_lines(PREFETCH_SUBTITLE))
    layout = _layout(
        PREFETCH_HEIGHT_PX, "prefetch", barmode="overlay", margin={"l": 50, "r": 46, "t": top_px, "b": 40},
        legend=_bottom_legend(),
        xaxis=_axis(domain=[0, 1], anchor="y", title={"text": run_ms_title(live.timing), "standoff": 4},
                    **({"range": x_range} if x_range else {})),
        yaxis=_axis(domain=[PREFETCH_UPPER_FROM, 1], anchor="x", type="category", categoryorder="array",
                    categoryarray=[f"L{layer}" for layer in live.layers],
                    range=[len(live.layers) - 0.5, -0.5], dtick=-(-len(live.layers) // 9)),
        xaxis2=_axis(domain=[0, 1], anchor="y2", title={"text": "token", "standoff": 4}),
        yaxis2=_axis(domain=list(PREFETCH_LOWER), anchor="x2", title={"text": "depth"}, rangemode="tozero"),
        yaxis3=_axis(overlaying="y2", side="right", anchor="x2", range=[0, 105], title={"text": "hit %"},
                     showgrid=False),
        annotations=annotations)
    if meta:
        layout["meta"] = meta
    return {"data": data, "layout": layout}


def wasted_note(live: LiveRun) -> str:
    """"7 of 8 prefetches wasted (88%)" over the whole reply ("" before any prefetch)."""
    n = live.prefetches_issued
    if not n:
        return ""
    return f"{live.prefetches_wasted} of {n} prefetches wasted ({100 * live.prefetches_wasted / n:.0f}%) this reply"


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
    lane merged: a token's six routed experts on the GPU become one bar, which keeps the browser fast. The host's
    "token" bars are never merged: each is one token, and two in a row showed as one (review)."""
    ordered = sorted((iv for iv in intervals if iv.end_ms > iv.start_ms), key=lambda iv: (iv.lane, iv.start_ms))
    merged: list[list] = []
    open_by_key: dict[tuple[str, str], list] = {}
    for iv in ordered:
        key = (iv.lane, iv.kind)
        cur = open_by_key.get(key)
        if cur is not None and iv.kind != "token" and iv.start_ms - cur[3] <= gap_ms and merged and merged[-1] is cur:
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


def run_span(intervals: Sequence) -> tuple[float, float] | None:
    """(first start, last end) of the work the tokens waited for: every interval but prefetch copies.

    Prefetch copies queued behind the last token may end long after it (a second and more on a slow
    link); drawn to their end they squeeze the run into a sliver, so the chart's x-range stops here.
    """
    span = [(iv.start_ms, iv.end_ms) for iv in intervals if iv.kind != "prefetch" and iv.end_ms > iv.start_ms]
    if not span:
        return None
    return min(a for a, _ in span), max(b for _, b in span)


def run_ms_title(timing: str) -> str:
    """A time axis in ms from the run's start, saying whether the times are modeled or measured."""
    return f"ms from the start of the run ({timing})" if timing else "ms from the start of the run"


def lane_gantt(intervals: Iterable, *, uirevision: str = "gantt", max_bars: int = 20_000,
               empty_hint: str = "no lane activity yet: send a message", note: str = "", meta: str = "",
               timing: str = "") -> Figure:
    """One row per lane, one bar per busy interval coloured by kind (ms from the run's start).

    Accepts anything with lane / kind / start_ms / end_ms / layer / expert (LaneInterval, TraceEvent).
    Back-to-back intervals of one kind on one lane are drawn as one bar (hover lists what it holds).
    The x-range is clipped to `run_span`; how many prefetch copies ran past it is said over the chart,
    with ``note`` (e.g. how many prefetches were wasted). ``timing``: "modeled" or "measured", said on the time axis.
    """
    intervals = list(intervals)
    span = run_span(intervals)
    past_end = 0 if span is None else sum(1 for iv in intervals if iv.kind == "prefetch" and iv.end_ms > span[1] + 1e-9)
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
                     "marker": {"color": KIND_COLOURS.get(kind, "#7f8c99"), "line": {"width": 0},
                                **({"pattern": KIND_PATTERNS[kind]} if kind in KIND_PATTERNS else {})},
                     "width": 0.9 if kind == "token" else 0.7})
    order = lane_order(lanes)
    said = []                   # over the chart, each on a line of its own (two on a phone's width)
    if past_end:
        one = past_end == 1
        said.append(f"{past_end:,} prefetch cop{'y' if one else 'ies'} ran past the last token<br>"
                    f"and {'is' if one else 'are'} cut off")
    if note:
        said.append(_wrap(note))
    if truncated:
        said.append(_wrap(f"{truncated:,} more bars not drawn: narrow the token range"))
    subtitle = "<br>".join(said)
    annotations = [_subtitle(subtitle, 0, 1.0)] if said else []
    top_px = _top_px(_lines(subtitle))
    # Unclipped, the range is said to be automatic: a live update merges this axis into the drawn one, which kept
    # an earlier update's clipped range, and the last tokens' bars were drawn outside it (an empty chart).
    x_axis = _axis(title={"text": run_ms_title(timing), "standoff": 4}, autorange=True)
    if span is not None and past_end:
        pad = 0.02 * max(span[1] - span[0], 1e-3)
        x_axis |= {"range": [span[0] - pad, span[1] + pad], "autorange": False}
    # A subtitle's extra lines make the figure taller, not the lanes thinner.
    layout = _layout(max(300, 190 + 34 * len(order)) + top_px - 44, uirevision, barmode="overlay", bargap=0.2,
                     margin={"l": 50, "r": 12, "t": top_px, "b": 40}, legend=_bottom_legend(),
                     xaxis=x_axis,
                     yaxis=_axis(type="category", categoryorder="array", categoryarray=order, autorange="reversed"),
                     annotations=annotations)
    if meta:
        layout["meta"] = meta
    return {"data": data, "layout": layout}


# --- trace explorer: per-token overview -------------------------------------------------------
def token_overview(index: Sequence[int], step_ms: Sequence[float], stall_ms: Sequence[float],
                   mb_copied: Sequence[float], timing: str) -> Figure:
    """Step time per token split into stall and the rest, and MB copied at the timed shape (the trace events'
    bytes: the shape the step times are for); token 0 includes the prefill."""
    index = list(index)
    rest = [round(max(s - w, 0.0), 4) for s, w in zip(step_ms, stall_ms)]
    data = [
        {"type": "bar", "x": index, "y": rest, "name": "compute and overlapped copies (ms)",
         "marker": {"color": "#9aa5b1"}},
        {"type": "bar", "x": index, "y": [round(w, 4) for w in stall_ms], "name": "stall (ms)",
         "marker": {"color": OKABE_ITO["vermillion"]}},
        {"type": "scatter", "mode": "lines", "x": index, "y": [round(m, 3) for m in mb_copied],
         "name": "MB copied (timed shape)", "line": {"color": OKABE_ITO["blue"]}, "yaxis": "y2"},
    ]
    # The legend goes under the chart: over it, on a phone, its rows ran into the gr.Plot label.
    layout = _layout(330, "overview", barmode="stack", margin={"l": 56, "r": 56, "t": 36, "b": 40},
                     legend=_bottom_legend(),
                     xaxis=_axis(title={"text": "token (0 includes the prefill)"}),
                     yaxis=_axis(title={"text": f"ms per token ({timing})"}),
                     yaxis2=_axis(overlaying="y", side="right", title={"text": "MB copied (timed shape)"},
                                  showgrid=False, rangemode="tozero"))
    return {"data": data, "layout": layout}


def panel_figure(name: str, live: LiveRun, meta: str = "", live_view: bool = False) -> dict:
    """A chat panel's whole figure; ``live_view`` leaves out what the in-place updates do not refresh."""
    if name == "heatmap":
        return outcome_heatmap(live, counts=not live_view, meta=meta)
    if name == "prefetch":
        return prefetch_timeline(live, meta=meta)
    return lane_gantt(live.intervals(), note=wasted_note(live), meta=meta, timing=live.timing)


def panels_delta(live: LiveRun, tag: str, seq: int) -> str:
    """The chat panels' changes since their figures were sent (JSON for assets/static/spice_live.js)."""
    panels = {"heatmap": {"meta": f"{tag}:heatmap", **heatmap_delta(live)}}
    # The margin follows the lane chart's subtitle, whose line count changes while a reply streams.
    keys = ("height", "margin", "xaxis", "yaxis", "annotations")
    for name in ("prefetch", "gantt"):
        fig = panel_figure(name, live)
        panels[name] = {"meta": f"{tag}:{name}", "data": fig["data"],
                        "layout": {k: fig["layout"][k] for k in keys if k in fig["layout"]}}
    return json.dumps({"seq": seq, "panels": panels}, separators=(",", ":"), allow_nan=False)
