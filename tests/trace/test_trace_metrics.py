"""summarize / per_layer_table arithmetic on hand-made steps."""
from __future__ import annotations

import math

import pytest

from spice_core.api import ExpertOutcome, RunSummary, StepStats
from spice_core.trace.metrics import PER_LAYER_COLUMNS, per_layer_table, rate_scope, summarize


def step(index, step_ms, outcomes=(), *, hits=0, misses=0, bytes_copied=0, stall_ms=0.0):
    return StepStats(index=index, token_id=index, text="x", step_ms=step_ms, timing="modeled", hits=hits,
                     misses=misses, bytes_copied=bytes_copied, stall_ms=stall_ms, lookahead_depth=1.0,
                     outcomes=tuple(ExpertOutcome(layer, 0, o) for layer, o in outcomes))


def run(steps, **kw):
    args = dict(run_id="r1", policy="spice", timing="modeled", profile="p", shape="s")
    args.update(kw)
    return summarize(steps, **args)


# The prefill (index 0) copies everything; decode steps mix outcomes on layers 1 and 2.
STEPS = [
    step(0, 100.0, [(1, "copy")] * 6 + [(2, "copy")] * 6, bytes_copied=12_000, stall_ms=50.0),
    step(1, 10.0, [(1, "hit"), (1, "prefetch_hit"), (2, "copy"), (2, "hit")], bytes_copied=1000, stall_ms=1.0),
    step(2, 20.0, [(1, "hit"), (1, "approx"), (2, "cpu"), (2, "prefetch_hit")], bytes_copied=0, stall_ms=0.0),
    step(3, 30.0, [(1, "hit"), (1, "hit"), (2, "copy"), (2, "copy")], bytes_copied=2000, stall_ms=2.0),
    step(4, 40.0, [(1, "prefetch_hit"), (1, "hit"), (2, "hit"), (2, "approx")], bytes_copied=0, stall_ms=3.0),
]


def test_summary_arithmetic_on_known_steps():
    s = run(STEPS, notes=("n1",), text="hello", finish_reason="length")
    assert isinstance(s, RunSummary)
    assert s.n_tokens == 5
    assert s.ttft_ms == 100.0
    assert s.tpot_ms_median == 25.0                      # median of 10, 20, 30, 40
    assert s.tpot_ms_p90 == pytest.approx(37.0)          # 30 + 0.7 * (40 - 30)
    assert s.tokens_per_s == pytest.approx(40.0)
    # decode outcomes: 16 selections, hits: 3 + 2 + 2 + 3 = 10
    assert s.hit_rate == pytest.approx(10 / 16)
    assert s.miss_split == {"approx": 2, "cpu": 1, "cpu_int8": 0, "copy": 3}
    assert s.hit_rate_per_layer == {1: pytest.approx(7 / 8), 2: pytest.approx(3 / 8)}
    assert s.bytes_per_token == pytest.approx(750.0)     # (1000 + 0 + 2000 + 0) / 4: prefill excluded
    assert s.stall_ms_per_token == pytest.approx(1.5)
    assert (s.run_id, s.policy, s.timing, s.profile, s.shape) == ("r1", "spice", "modeled", "p", "s")
    assert (s.notes, s.text, s.finish_reason) == (("n1",), "hello", "length")


def test_step_order_does_not_matter():
    assert run(list(reversed(STEPS))) == run(STEPS)


def test_a_single_step_run_has_no_tpot_and_takes_rates_over_the_prefill():
    s = run([STEPS[0]])
    assert (s.ttft_ms, s.tpot_ms_median, s.tpot_ms_p90, s.tokens_per_s) == (100.0, 0.0, 0.0, 0.0)
    assert s.hit_rate == 0.0 and s.miss_split == {"approx": 0, "cpu": 0, "cpu_int8": 0, "copy": 12}
    assert s.bytes_per_token == 12_000 and s.stall_ms_per_token == 50.0
    assert s.notes == ()


def test_an_empty_run_is_all_zeros_not_nan():
    s = run([])
    values = [s.n_tokens, s.ttft_ms, s.tpot_ms_median, s.tpot_ms_p90, s.tokens_per_s, s.hit_rate,
              s.bytes_per_token, s.stall_ms_per_token]
    assert values == [0] * len(values) and not any(math.isnan(v) for v in values)
    assert s.hit_rate_per_layer == {}


def test_hit_rate_falls_back_to_step_counters_without_outcomes():
    s = run([step(0, 5.0, hits=0, misses=9), step(1, 5.0, hits=3, misses=1), step(2, 5.0, hits=1, misses=3)])
    assert s.hit_rate == pytest.approx(4 / 8)


def test_nan_step_times_are_ignored():
    s = run([step(0, 5.0), step(1, float("nan")), step(2, 8.0)])
    assert s.tpot_ms_median == 8.0 and s.tokens_per_s == pytest.approx(125.0)


def test_rate_scope_is_decode_steps_or_everything_for_one_step():
    assert [s.index for s in rate_scope(STEPS[::-1])] == [1, 2, 3, 4]
    assert [s.index for s in rate_scope(STEPS[:1])] == [0]


def test_per_layer_table_counts_each_outcome():
    df = per_layer_table(STEPS)
    assert tuple(df.columns) == PER_LAYER_COLUMNS
    rows = {r["layer"]: r for r in df.to_dict("records")}
    assert list(rows) == [1, 2]
    assert rows[1] == {"layer": 1, "selections": 14, "hit": 5, "prefetch_hit": 2, "prefetch_late": 0, "approx": 1,
                       "cpu": 0, "cpu_int8": 0, "copy": 6, "hit_rate": pytest.approx(7 / 14)}
    assert rows[2]["copy"] == 6 + 3 and rows[2]["hit_rate"] == pytest.approx(3 / 14)
    assert per_layer_table([]).empty and tuple(per_layer_table([]).columns) == PER_LAYER_COLUMNS
