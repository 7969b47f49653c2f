"""The tuner's figure and table: every measured setting, speed against perplexity, the budget and the pick.

    TuneRecord.trials ──► tune_pareto: x modeled ms per token, y perplexity increase %; every point labelled
                          by its setting (text on the plot, not only on hover), the budget's line, the Pareto
                          front, the pick marked ★
                      ──► tune_table: sorted by speed, each row flagged "meets the budget" and "pick"

Why perplexity on y and not agreement: on the app's small evaluation the lossy settings' greedy agreement is
mostly 1.000, so it would put every point on one line; the budget's agreement part is in the table and the
hover. Settings with the same speed and quality (the exact ones often are: the exact knobs only move a
copy's timing) share one label that counts them, so labels do not print over each other.
"""
from __future__ import annotations

from typing import Sequence

import pandas as pd

from pages.figures import MID, OKABE_ITO, _axis, _layout, empty_figure
from pages.figures_sweep import pareto_front
from pages.tuning import setting_label, setting_words

TABLE_COLUMNS = ["", "within budget", "setting", "ms / token", "perplexity +%", "greedy agreement", "τ_approx",
                 "LoRE rank", "τ_prefetch", "max lookahead", "CPU lane"]
MET, MISSED, PICK = OKABE_ITO["blue"], OKABE_ITO["vermillion"], OKABE_ITO["orange"]


def _same(trial: dict) -> tuple:
    return (round(trial["speed_ms"], 3), round(trial["ppl_pct"], 3), round(trial["agreement"], 4))


def is_pick(trial: dict, setting: dict) -> bool:
    return all(trial[k] == v for k, v in setting.items())


def tune_pareto(record) -> dict:
    """The tuner's trials as one figure (record: a spice_core.api.TuneRecord, or None before a tune)."""
    if record is None or not record.trials:
        return empty_figure("find the fastest setting within a budget to see every setting the tuner measured", 420)
    trials = record.trials
    groups: dict[tuple, list[dict]] = {}
    for t in trials:
        groups.setdefault(_same(t), []).append(t)
    # By speed, labels alternately above and below, so that neighbours' labels do not print over each other;
    # the pick's label is the star's.
    ordered = sorted(groups.values(), key=lambda g: g[0]["speed_ms"])
    above = {id(g): i % 2 == 0 for i, g in enumerate(ordered)}
    data = []
    for met, name, colour in ((True, "meets the budget", MET), (False, "misses the budget", MISSED)):
        pts = [g for g in ordered if g[0]["met"] == met]
        if not pts:
            continue
        data.append({
            "type": "scatter", "mode": "markers+text", "name": name,
            "x": [g[0]["speed_ms"] for g in pts], "y": [round(g[0]["ppl_pct"], 3) for g in pts],
            "text": [_label(g, record.setting) for g in pts],
            "textposition": ["top center" if above[id(g)] else "bottom center" for g in pts],
            "textfont": {"size": 10},
            "marker": {"size": 10, "color": colour, "line": {"width": 1, "color": "white"}},
            "hovertext": ["<br>".join(f"{setting_words(t)}: {t['speed_ms']:.2f} ms, perplexity {t['ppl_pct']:+.2f} %, "
                                      f"agreement {t['agreement']:.3f}" for t in g) for g in pts],
            "hoverinfo": "text"})
    front = pareto_front([(t["speed_ms"], -t["ppl_pct"]) for t in trials])
    front = sorted(front, key=lambda i: trials[i]["speed_ms"])
    data.append({"type": "scatter", "mode": "lines", "name": "Pareto front", "hoverinfo": "skip",
                 "x": [trials[i]["speed_ms"] for i in front], "y": [round(trials[i]["ppl_pct"], 3) for i in front],
                 "line": {"color": MID, "dash": "dash", "width": 1.5}})
    data.append({"type": "scatter", "mode": "markers+text", "name": "★ pick", "x": [record.speed_ms],
                 "y": [round(record.ppl_pct, 3)], "text": [f"★ pick: {setting_label(record.setting)}"],
                 "textposition": "bottom right",
                 "textfont": {"size": 13, "color": PICK},
                 "marker": {"symbol": "star", "size": 22, "color": PICK, "line": {"width": 1, "color": "white"}},
                 "hovertext": [f"pick: {setting_words(record.setting)}"], "hoverinfo": "text"})
    shapes = []
    if record.budget.get("ppl_pct") is not None:
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": record.budget["ppl_pct"],
                       "y1": record.budget["ppl_pct"], "line": {"color": MISSED, "dash": "dot", "width": 1}})
    xs = [t["speed_ms"] for t in trials]
    pad = 0.12 * (max(xs) - min(xs) or max(xs) or 1.0)      # room for the labels at both ends
    layout = _layout(460, "tune", xaxis=_axis(title={"text": f"ms per token, {record.speed_timing}: lower is faster"},
                                              range=[min(xs) - pad, max(xs) + pad]),
                     yaxis=_axis(title={"text": "perplexity increase over exact (%): lower is better"}),
                     shapes=shapes)
    if shapes:
        layout["annotations"] = list(layout.get("annotations", [])) + [
            {"xref": "paper", "x": 1, "xanchor": "right", "y": record.budget["ppl_pct"], "yanchor": "bottom",
             "text": f"budget: +{record.budget['ppl_pct']:g} %", "showarrow": False,
             "font": {"size": 11, "color": MISSED}}]
    return {"data": data, "layout": layout}


def _label(group: list[dict], pick: dict) -> str:
    """A point's text: its setting, how many others measured the same, nothing for the pick (the star says it)."""
    if any(is_pick(t, pick) for t in group) and len(group) == 1:
        return ""
    return setting_label(group[0]) + (f" (+{len(group) - 1} same)" if len(group) > 1 else "")


def tune_table(record) -> pd.DataFrame:
    """Every measured setting, fastest first; flags: within budget, and the pick (★)."""
    if record is None:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    rows = sorted(record.trials, key=lambda t: (t["speed_ms"], t["ppl_pct"], -t["agreement"]))
    return pd.DataFrame([["★ pick" if is_pick(t, record.setting) else "", "✓ yes" if t["met"] else "✗ no",
                          setting_label(t), round(t["speed_ms"], 2), round(t["ppl_pct"], 2), round(t["agreement"], 3),
                          t["tau_approx"], t["lore_rank"] if t["tau_approx"] > 0 else "–", t["tau_prefetch"],
                          t["max_lookahead"], "on" if t["cpu_lane"] else "off"] for t in rows],
                        columns=TABLE_COLUMNS)


def trial_count(trials: Sequence[dict]) -> tuple[int, int]:
    """(settings within budget, settings measured)."""
    return sum(1 for t in trials if t["met"]), len(trials)
