"""The trace explorer's comparison says what it means (issue 24, defect 11): a second run at 1.37× the
first's TPOT is "1.37× slower" (it said "0.73× slower"), and the per-layer table shows one decimal, not the
float noise of a sum (65.30000000000001)."""
from types import SimpleNamespace

import pandas as pd

from pages.trace_explorer import compare_frame, compare_html


def _summary(tpot):
    return SimpleNamespace(policy="p", timing="modeled", shape="s", tpot_ms_median=tpot, hit_rate=0.5, late_prefetch_rate=0.0,
                           bytes_per_token=1e6, shape_bytes_per_token=0.0, stall_ms_per_token=0.1, n_tokens=8)


def test_the_second_run_is_called_slower_or_faster_by_the_right_factor():
    assert "1.37× slower" in compare_html(_summary(10.0), _summary(13.7))
    assert "2.00× faster" in compare_html(_summary(10.0), _summary(5.0))
    assert "slower" not in compare_html(_summary(10.0), _summary(5.0))


def test_the_per_layer_comparison_has_no_float_noise():
    def frame(hit, pre):
        return pd.DataFrame({"layer": [1], "hit %": [hit], "prefetched hit %": [pre],
                             "MB copied / token (timed shape)": [0.1 + 0.2], "stall ms / token": [0.30000000000000004]})
    both = compare_frame(frame(40.1, 25.200000000000003), frame(10.0, 0.3))
    shown = both.to_string()
    assert "65.3" in shown and "0000" not in shown, shown
    assert both["hit % (first)"][0] == 65.3 and str(float(both["MB / token (first)"][0])) == "0.3"
