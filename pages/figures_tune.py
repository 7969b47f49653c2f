"""The tuner's figure and table: every measured setting, speed against perplexity, the budget and the pick.

    TuneRecord.trials ──► tune_pareto: x modeled ms per token, y perplexity increase %; every point labelled
                          by its setting (text on the plot, not only on hover), the budget's line, the Pareto
                          front, the pick marked ★; within the budget, not confirmed, outside it
                      ──► tune_table: sorted by speed, each row flagged with its verdict and "pick"
                      ──► trial_words: how many were measured and what they came to, in words

A setting's verdict (TuneRecord.verdict): exact (within any budget), held or failed on the confirmation sample
(chat replies as long as the chat's), ruled out (a less lossy one failed there), not confirmed (passed the short
screening only) or missed (failed the screening). Its quality is the confirmation's where it was re-measured,
else the screening's, and the table says which.

Why perplexity on y and not agreement: on the short screening the lossy settings' greedy agreement is mostly
1.000, so it would put every point on one line; the budget's agreement part is in the table and the hover.
Settings with the same speed and quality (the exact ones often are: the exact knobs only move a copy's timing)
share one label that counts them, so labels do not print over each other.
"""
from __future__ import annotations

import pandas as pd

from spice_core import api as verdict     # the names TuneRecord.verdict returns
from spice_core.api import TuneRecord
from pages.figures import MID, OKABE_ITO, _axis, _layout, empty_figure
from pages.figures_sweep import pareto_front
from pages.tuning import setting_label, setting_words

TABLE_COLUMNS = ["", "within budget", "setting", "ms / token", "perplexity +%", "greedy agreement", "quality from",
                 "τ_approx", "LoRE rank", "τ_prefetch", "max lookahead", "CPU lane"]
MET, OPEN, MISSED, PICK = OKABE_ITO["blue"], MID, OKABE_ITO["vermillion"], OKABE_ITO["orange"]
VERDICT_WORDS = {verdict.EXACT: "✓ yes (exact)", verdict.HELD: "✓ yes (held on replies)",
                 verdict.FAILED: "✗ no (failed on replies)", verdict.RULED_OUT: "✗ no (ruled out)",
                 verdict.UNCONFIRMED: "? not confirmed", verdict.MISSED: "✗ no"}
# The plot's three groups: (name, verdicts, colour).
GROUPS = (("within the budget", verdict.WITHIN, MET),
          ("not confirmed (short screening only)", (verdict.UNCONFIRMED,), OPEN),
          ("outside the budget", (verdict.FAILED, verdict.RULED_OUT, verdict.MISSED), MISSED))


def quality(trial: dict) -> tuple[float, float, str]:
    """(perplexity increase %, greedy agreement, the sample they come from) of one trial: the confirmation's where
    it was re-measured, else the screening's."""
    if trial.get("confirm_agreement") is not None:
        return trial["confirm_ppl_pct"], trial["confirm_agreement"], "replies"
    return trial["ppl_pct"], trial["agreement"], "–" if trial.get("stage") == "exact" else "screening"


def _same(trial: dict) -> tuple:
    ppl, agreement, _ = quality(trial)
    within = TuneRecord.verdict(trial) in verdict.WITHIN
    return (round(trial["speed_ms"], 3), round(ppl, 3), round(agreement, 4), within)


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
    for name, verdicts, colour in GROUPS:
        pts = [g for g in ordered if TuneRecord.verdict(g[0]) in verdicts]
        if not pts:
            continue
        data.append({
            "type": "scatter", "mode": "markers+text", "name": name,
            "x": [g[0]["speed_ms"] for g in pts], "y": [round(quality(g[0])[0], 3) for g in pts],
            "text": [_label(g, record.setting) for g in pts],
            "textposition": ["top center" if above[id(g)] else "bottom center" for g in pts],
            "textfont": {"size": 10},
            "marker": {"size": 10, "color": colour, "line": {"width": 1, "color": "white"}},
            "hovertext": ["<br>".join(_hover(t) for t in g) for g in pts],
            "hoverinfo": "text"})
    ys = [quality(t)[0] for t in trials]
    front = pareto_front([(t["speed_ms"], -y) for t, y in zip(trials, ys)])
    front = sorted(front, key=lambda i: trials[i]["speed_ms"])
    data.append({"type": "scatter", "mode": "lines", "name": "Pareto front", "hoverinfo": "skip",
                 "x": [trials[i]["speed_ms"] for i in front], "y": [round(ys[i], 3) for i in front],
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


def _hover(t: dict) -> str:
    ppl, agreement, source = quality(t)
    on = {"replies": " on chat replies", "screening": " on the short screening"}.get(source, "")
    return (f"{setting_words(t)}: {t['speed_ms']:.2f} ms, perplexity {ppl:+.2f} %, agreement {agreement:.3f}{on} · "
            f"within budget: {VERDICT_WORDS[TuneRecord.verdict(t)]}")


def _label(group: list[dict], pick: dict) -> str:
    """A point's text: its setting, how many others measured the same, nothing for the pick (the star says it)."""
    if any(is_pick(t, pick) for t in group) and len(group) == 1:
        return ""
    return setting_label(group[0]) + (f" (+{len(group) - 1} same)" if len(group) > 1 else "")


def tune_table(record) -> pd.DataFrame:
    """Every measured setting, fastest first; flags: its verdict (within budget?), and the pick (★)."""
    if record is None:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    rows = []
    for t in sorted(record.trials, key=lambda t: (t["speed_ms"], quality(t)[0], -quality(t)[1])):
        ppl, agreement, source = quality(t)
        rows.append(["★ pick" if is_pick(t, record.setting) else "", VERDICT_WORDS[TuneRecord.verdict(t)],
                     setting_label(t), round(t["speed_ms"], 2), round(ppl, 2), round(agreement, 3), source,
                     t["tau_approx"], t["lore_rank"] if t["tau_approx"] > 0 else "–", t["tau_prefetch"],
                     t["max_lookahead"], "on" if t["cpu_lane"] else "off"])
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def trial_words(record) -> str:
    """How many settings were measured and what they came to: "19 settings measured: 9 exact; 10 approximating:
    0 within the budget on replies of 192 tokens, 1 failed there, 9 ruled out"."""
    verdicts = [TuneRecord.verdict(t) for t in record.trials]
    n = {v: verdicts.count(v) for v in VERDICT_WORDS}
    lossy = len(verdicts) - n[verdict.EXACT]
    parts = [f"{len(verdicts)} settings measured: {n[verdict.EXACT]} exact"]
    if lossy:
        replies = f"replies of {record.reply_tokens} tokens" if record.reply_tokens else "longer replies"
        counts = [f"{n[verdict.HELD]} within the budget on {replies}"] + [
            words for words, k in ((f"{n[verdict.FAILED]} failed there", n[verdict.FAILED]),
                                   (f"{n[verdict.RULED_OUT]} ruled out by those", n[verdict.RULED_OUT]),
                                   (f"{n[verdict.UNCONFIRMED]} passed the short screening only (not confirmed)",
                                    n[verdict.UNCONFIRMED]),
                                   (f"{n[verdict.MISSED]} missed the screening", n[verdict.MISSED])) if k]
        parts.append(f"{lossy} approximating: " + ", ".join(counts))
    return "; ".join(parts)
