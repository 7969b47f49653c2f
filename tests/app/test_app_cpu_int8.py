"""The lossy cpu_int8 miss action in the chat's heatmap and the trace explorer's per-layer table: counted, and
shown apart (its own colour, mark and legend entry; its own column), with the counts of the run summary's miss
split and of the per-token CSV's experts_cpu_int8.

Regression: both dropped it. The heatmap skipped such a selection (so the chat's hit rate was not the summary's),
and the table's outcome shares fell short of 100 % by the int8 runs' share."""
import json

import numpy as np
import pytest

from fake_engine import FakeEngine
from pages import figures
from pages.live import CODE, CPU_INT8, LiveRun
from pages.trace_explorer import per_layer_frame
from spice_core.api import RunSettings
from spice_core.trace.export import per_token_frame

SHARES = ["hit %", "prefetched hit %", "late prefetch %", "approx %", "CPU %", "CPU int8 %", "copied %"]


@pytest.fixture(scope="module")
def int8_run():
    engine = FakeEngine(token_delay_s=0)
    gen = engine.start_prompt("a story told from int8 experts", RunSettings(policy="spice", tau_int8=0.6,
                                                                             max_new_tokens=8))
    steps = list(gen)
    n_int8 = sum(o.outcome == CPU_INT8 for s in steps for o in s.outcomes)
    assert n_int8 > 0 and any(o.outcome == CPU_INT8 for o in steps[-1].outcomes)
    return engine, steps, engine.get_events(gen.run_id), engine.get_summary(gen.run_id), n_int8


def _live(engine, steps):
    """The chat's heatmap state after the run's steps, as the page builds it."""
    live = LiveRun.for_engine(engine.info())
    for s in steps:
        live.add(s)
    return live


def test_the_heatmap_counts_int8_cpu_runs_as_the_run_summary_does(int8_run):
    engine, steps, _events, summary, n_int8 = int8_run
    live = _live(engine, steps)
    code = CODE[CPU_INT8]
    assert live.counts[..., code - 1].sum() == n_int8
    assert live.counts.sum() == sum(len(s.outcomes) for s in steps)       # no selection left out
    assert live.hit_rate == pytest.approx(summary.hit_rate)
    row = {layer: i for i, layer in enumerate(live.layers)}
    for o in steps[-1].outcomes:
        if o.outcome == CPU_INT8:
            assert live.current[row[o.layer], o.expert] == code


def test_the_heatmap_shows_int8_cpu_runs_with_a_legend_entry_colour_and_mark_of_their_own(int8_run):
    engine, steps, _events, _summary, n_int8 = int8_run
    live = _live(engine, steps)
    code = CODE[CPU_INT8]
    fig = figures.outcome_heatmap(live)
    legend = [d.get("name") for d in fig["data"] if d.get("name")]
    assert figures.OUTCOME_LABELS[CPU_INT8] in legend and len(set(legend)) == len(legend)
    colour = figures.OUTCOME_COLOURS[CPU_INT8]
    assert colour not in [c for name, c in figures.OUTCOME_COLOURS.items() if name != CPU_INT8]
    mark = figures.OUTCOME_MARKS[CPU_INT8]
    assert figures.OUTCOME_LABELS[CPU_INT8].split()[0] == mark[0]       # the legend draws the cells' mark
    assert mark not in [m for name, m in figures.OUTCOME_MARKS.items() if name != CPU_INT8]
    # The right grid's hover counts them; the tokens that used the expert come after every outcome.
    right = fig["data"][1]
    assert f"CPU int8 %{{customdata[{code - 1}]}}" in right["hovertemplate"]
    assert f"used by %{{customdata[{figures.USED_INDEX}]}}" in right["hovertemplate"]
    assert np.array(right["customdata"])[..., code - 1].sum() == n_int8
    # The latest token's grid marks them, and the live refresh names them.
    left_marks = fig["data"][2]["marker"]["symbol"]
    assert left_marks.count(mark[1]) == int((live.current == code).sum()) > 0
    delta = json.loads(figures.panels_delta(live, "t", 1))["panels"]["heatmap"]
    assert delta["names"][code] == "CPU int8" and delta["symbols"][code] == mark[1]


def test_the_explorer_table_has_an_int8_column_that_agrees_with_the_summary_and_the_csv(int8_run):
    _engine, steps, events, summary, _n = int8_run
    table = per_layer_frame(events, summary.n_tokens)
    assert SHARES[-2] in table.columns and list(table.columns).index("CPU int8 %") == \
        list(table.columns).index("CPU %") + 1
    assert (table[SHARES].sum(axis=1) - 100).abs().max() < 0.6            # every selection has its share
    in_table = (table["CPU int8 %"] * table["selections"] / 100).sum()
    csv = per_token_frame(steps)                   # the CSV export's rows; the table's scope is the decode tokens
    assert summary.miss_split["cpu_int8"] > 0
    assert in_table == pytest.approx(summary.miss_split["cpu_int8"], abs=0.5)
    assert int(csv["experts_cpu_int8"].iloc[1:].sum()) == summary.miss_split["cpu_int8"]
