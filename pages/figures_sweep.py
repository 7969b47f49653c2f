"""The sweep page's figures: speed vs quality per setting with its Pareto front, and policies side by side.
Plotly dicts, as `pages.figures` makes them (its axes, layout and colours)."""
from __future__ import annotations

from typing import Sequence

from pages.figures import MID, OKABE_ITO, POLICY_COLOURS, Figure, _axis, _layout, empty_figure


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
            "type": "scatter", "mode": "markers+text", "name": policy, "textposition": "top center",
            "x": [r["tpot_ms"] for r in mine], "y": [round(100 * r["agreement"], 2) for r in mine],
            "text": [r.get("label", f"τp {r['tau_prefetch']:g} · τa {r['tau_approx']:g}") for r in mine],
            "textfont": {"size": 10},
            "marker": {"size": 11, "color": POLICY_COLOURS[i % len(POLICY_COLOURS)],
                       "line": {"width": 1, "color": "white"}},
            "hovertext": [f"{policy} · τ_prefetch {r['tau_prefetch']} · τ_approx {r['tau_approx']}<br>"
                          f"TPOT {r['tpot_ms']:.2f} ms · agreement {100 * r['agreement']:.0f}% · "
                          f"hit rate {100 * r['hit_rate']:.0f}%" for r in mine],
            "hoverinfo": "text"})
    front = pareto_front([(r["tpot_ms"], r["agreement"]) for r in rows])
    data.append({"type": "scatter", "mode": "lines+markers", "name": "Pareto front", "hoverinfo": "skip",
                 "x": [rows[i]["tpot_ms"] for i in front], "y": [round(100 * rows[i]["agreement"], 2) for i in front],
                 "line": {"color": MID, "dash": "dash", "width": 1.5},
                 "marker": {"symbol": "circle-open", "size": 18, "color": MID, "line": {"width": 1.5}}})
    layout = _layout(420, "pareto", xaxis=_axis(title={"text": f"TPOT, median ms ({timing}): lower is faster"}),
                     yaxis=_axis(title={"text": "greedy agreement with the exact run (%)"}, range=[-3, 103]))
    return {"data": data, "layout": layout}


BARS_MIN_AGREEMENT = 0.9     # the tuner's default budget: a setting this close to the exact run counts as usable


def policy_bars(rows: Sequence[dict], timing: str, min_agreement: float = BARS_MIN_AGREEMENT) -> Figure:
    """Policies side by side, each at its fastest setting with greedy agreement >= ``min_agreement`` (a policy
    with none: its highest agreement), each bar labelled with the setting it shows."""
    if not rows:
        return empty_figure("run a sweep to compare policies", 300)
    best: dict[str, dict] = {}
    for r in rows:
        cur = best.get(r["policy"])
        ok = r["agreement"] >= min_agreement - 1e-9
        key = (ok, -r["tpot_ms"] if ok else r["agreement"], -r["tpot_ms"])
        if cur is None or key > cur[0]:
            best[r["policy"]] = (key, r)
    best = {p: r for p, (_, r) in best.items()}
    names = list(best)
    data = [
        {"type": "bar", "x": names, "y": [best[p]["tpot_ms"] for p in names], "name": "TPOT (ms)",
         "marker": {"color": OKABE_ITO["blue"]}, "offsetgroup": "tpot", "textposition": "inside", "insidetextanchor": "end",
         "textfont": {"color": "#ffffff", "size": 11},
         "text": [f"τ_approx {best[p]['tau_approx']:g} · agreement {100 * best[p]['agreement']:.0f}%" for p in names]},
        {"type": "bar", "x": names, "y": [round(100 * best[p]["hit_rate"], 1) for p in names], "name": "hit rate (%)",
         "marker": {"color": OKABE_ITO["green"]}, "offsetgroup": "hit", "yaxis": "y2"},
    ]
    layout = _layout(320, "policies", barmode="group", margin={"l": 56, "r": 56, "t": 36, "b": 60},
                     yaxis=_axis(title={"text": f"TPOT ms ({timing})"}),
                     yaxis2=_axis(overlaying="y", side="right", range=[0, 105], title={"text": "hit rate %"},
                                  showgrid=False))
    return {"data": data, "layout": layout}
