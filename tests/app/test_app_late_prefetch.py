"""A prefetch that arrived after its layer needed it is a stall, not a hit (issue 24, defect 4): the numbers
row, the run note and the heatmap count and colour it apart. Regression: oracle_prefetch read "hit rate 100%"
beside 48.6 ms of stall per token, and the heatmap called those experts "already on the GPU"."""
import json
import re

from app_helpers import chat_inputs, close, serve_shipped
from pages import figures
from pages.live import CODE, LATE, LiveRun
from spice_core.api import ExpertOutcome, PrefetchRecord, StepStats


def _step(index, prefetches, outcomes):
    return StepStats(index, 5, "x", 1.0, "modeled", 2, 0, 0, 0.0, 1.0, outcomes=outcomes, prefetches=prefetches)


def test_a_late_prefetch_is_counted_and_coloured_apart_from_the_hits():
    live = LiveRun(layers=(1, 2), n_experts=4)
    on_time = PrefetchRecord(1, 0, 0, 0.0, 1.0, 2.0, 0.9)
    late = PrefetchRecord(2, 3, 0, 0.0, 5.0, 3.0, 0.9)
    outcomes = (ExpertOutcome(1, 0, "prefetch_hit"), ExpertOutcome(2, 3, "prefetch_hit"),
                ExpertOutcome(2, 1, "hit"), ExpertOutcome(1, 2, "copy"))
    live.add(_step(0, (on_time, late), outcomes))
    assert live.hit_rate == 0.5 and live.late_rate == 0.25
    assert live.current[1, 3] == CODE[LATE] and live.current[0, 0] == CODE["prefetch_hit"]
    fig = figures.outcome_heatmap(live)
    assert "prefetched late (stalled)" in [d.get("name") for d in fig["data"]]
    assert "late prefetch" in fig["data"][1]["hovertemplate"]
    assert json.loads(figures.panels_delta(live, "t", 1))["panels"]["heatmap"]["names"][CODE[LATE]].startswith("late")


def test_oracle_prefetch_on_the_shipped_model_does_not_call_its_stalls_hits():
    from gradio_client import Client

    served = serve_shipped()
    try:
        client = Client(served.url, verbose=False)
        out = client.predict(*chat_inputs("Tell me a story about a cat.", max_new_tokens=24, policy="oracle_prefetch",
                                          cache_frac=0.25, live_panels=False), api_name="/chat")
        client.close()
        stats = out[2]
        hit = re.search(r"<div class='k'>hit rate</div><div class='v'>(\d+)%</div><div class='s'[^>]*>([^<]*)<", stats)
        stall = re.search(r"<div class='k'>stall</div><div class='v'>([\d.]+) ms", stats)
        assert hit and stall, stats
        if float(stall.group(1)) > 0.5:          # copies outlasted their layers: some prefetches were late
            assert int(hit.group(1)) < 100 and "late prefetches" in hit.group(2), (hit.groups(), stall.group(1))
        notes = " ".join(str(m.get("metadata") or "") for m in out[1])
        assert "hit rate 100%" not in notes or float(stall.group(1)) <= 0.5, notes
    finally:
        close(served)
