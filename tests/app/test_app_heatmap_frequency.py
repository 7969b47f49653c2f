"""The heatmap's right grid shows how often each expert was used (issue 24, defect 7, second half). Regression:
its "usual outcome" coloured an expert that one token used like one that every other token used; now a cell is
paler the fewer tokens used it (opaque: as often as the most-used expert), the legend says so and the hover
gives the count."""
import json
import re

import numpy as np
import pytest

from app_helpers import SHIPPED
from pages import figures
from pages.live import LiveRun
from spice_core.api import RunSettings


@pytest.fixture(scope="module")
def live():
    if not SHIPPED.exists():
        pytest.skip("the shipped model is not in assets/spice-mini")
    from spice_core.engine import SpiceEngine

    engine = SpiceEngine.load(None, device="cpu")
    live = LiveRun.for_engine(engine.info())
    for step in engine.start_prompt("Tell me a story about a cat and a ball", RunSettings(max_new_tokens=24)):
        live.add(step)
    return live


def _rgba(colour: str) -> np.ndarray:
    if colour.startswith("#"):
        return np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)] + [1.0])
    return np.array([float(v) for v in re.findall(r"[\d.]+", colour)][:4])


def _drawn(trace: dict, z: float) -> np.ndarray:
    """The colour Plotly paints for ``z``: the trace's colorscale, linear between its stops."""
    at = (z - trace["zmin"]) / (trace["zmax"] - trace["zmin"])
    stops = trace["colorscale"]
    for (lo, c_lo), (hi, c_hi) in zip(stops, stops[1:]):
        if lo <= at <= hi and hi > lo:
            return _rgba(c_lo) + (at - lo) / (hi - lo) * (_rgba(c_hi) - _rgba(c_lo))
    raise AssertionError(f"z={z} is outside the colour scale")


def test_an_expert_few_tokens_used_is_paler_than_a_busier_one_of_the_same_outcome(live):
    right = figures.outcome_heatmap(live)["data"][1]
    codes, used = live.totals_mode(), live.counts.sum(axis=-1)   # tokens that used each expert
    alpha = np.vectorize(lambda z: _drawn(right, z)[3])(np.array(right["z"]))
    compared = 0
    for code in np.unique(codes[codes > 0]):
        cells = codes == code
        if used[cells].min() == used[cells].max():
            continue
        rare = np.argwhere(cells & (used == used[cells].min()))[0]
        busy = np.argwhere(cells & (used == used[cells].max()))[0]
        assert alpha[tuple(rare)] < alpha[tuple(busy)], (code, used[tuple(rare)], used[tuple(busy)])
        hue = _rgba(figures.OUTCOME_COLOURS[figures.CATEGORIES[code]])[:3]
        assert np.allclose(_drawn(right, right["z"][rare[0]][rare[1]])[:3], hue, atol=1)   # the outcome's colour
        compared += 1
    assert compared >= 2, "the reply should use some experts of one outcome more often than others"
    assert alpha[used == used.max()].min() == pytest.approx(1.0, abs=0.02)
    assert alpha[used == 1].max() < 0.5


def test_the_legend_and_the_hover_say_how_many_tokens_used_an_expert(live):
    fig = figures.outcome_heatmap(live)
    right = fig["data"][1]
    names = [d.get("name", "") for d in fig["data"]]
    assert any("pale" in n and "few tokens" in n for n in names), names
    assert any("solid" in n and "most-used" in n for n in names), names
    assert f"used by %{{customdata[{figures.USED_INDEX}]}} of {live.n_tokens} tokens" in right["hovertemplate"]
    used = live.counts.sum(axis=-1)
    assert np.array(right["customdata"])[..., figures.USED_INDEX].tolist() == used.tolist()


def test_the_live_refresh_shades_the_grid_alike_and_names_cells_by_their_outcome(live):
    delta = json.loads(figures.panels_delta(live, "t", 1))["panels"]["heatmap"]
    live_fig = figures.outcome_heatmap(live, counts=False)
    assert delta["z"][1] == live_fig["data"][1]["z"] == figures.outcome_heatmap(live)["data"][1]["z"]
    assert delta["codes"] == [live.current.tolist(), live.totals_mode().tolist()]
    assert live_fig["data"][1]["text"] == np.array(figures.SHORT_OUTCOMES, dtype=object)[live.totals_mode()].tolist()
    # The marks (approximated, CPU): the token's grid while the reply streams, both grids in the last figure.
    marked = np.array([bool(s) for s in figures.MARK_SYMBOLS])
    assert delta["symbols"] == list(figures.MARK_SYMBOLS)
    assert len(live_fig["data"][2]["x"]) == marked[live.current].sum() and not live_fig["data"][3]["x"]
    assert len(figures.outcome_heatmap(live)["data"][3]["x"]) == marked[live.totals_mode()].sum() > 0
