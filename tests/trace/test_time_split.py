"""Where a token's time goes (trace.occupancy): every instant of a decode token in exactly one state, by which lanes
were working then; the states add up to the token's wall time, on hand-made traces and on a real run's."""
import pytest

from spice_core.trace.events import TraceEvent
from spice_core.trace.occupancy import STATES, time_split


def ev(lane, kind, start, end, token=1, layer=0, detail=""):
    return TraceEvent(token, layer, -1, lane, kind, start, end, timing="measured", detail=detail)


def test_each_state_gets_the_time_only_it_covers():
    events = [
        ev("host", "token", 0.0, 10.0, token=0),           # the prefill: left out
        ev("gpu", "layer", 1.0, 9.0, token=0),
        ev("host", "token", 10.0, 30.0),
        ev("gpu", "layer", 10.0, 13.0),                     # GPU work 10-13
        ev("copy", "copy", 12.0, 17.0),                     # 12-13 hidden under the GPU's work
        ev("gpu", "stall", 13.0, 17.0, detail="waits for copy"),       # the decode waits for it: 13-17
        ev("cpu0", "cpu_run", 16.0, 20.0),
        ev("cpu1", "cpu_run", 18.0, 19.0),                  # inside cpu0's: the lane counts once
        ev("host", "stall", 16.0, 20.0, detail="waits for cpu"),       # 16-17 with the copy, 17-20 alone
        ev("gpu", "expert", 22.0, 26.0),                    # 20-22 nothing waited for: the host
        ev("copy", "prefetch", 24.0, 32.0),                 # in the background: 26-30 is the host's, not the link's
        ev("gpu", "miss", 27.0, 27.0),                      # instants take no time
        ev("gpu", "expert", 28.0, 28.0),                    # nor does zero-length work
    ]
    s = time_split(events)
    assert s.tokens == 1 and s.wall_ms == pytest.approx(20.0)
    assert s.ms == pytest.approx({"gpu": 7.0, "link": 3.0, "link + lane": 1.0, "lane": 3.0, "host": 2.0 + 4.0})
    assert sum(s.ms.values()) == pytest.approx(s.wall_ms)
    assert s.link_busy_ms == pytest.approx(5.0 + 6.0)        # clipped to the token: 12-17 and 24-30
    assert s.link_hidden_ms == pytest.approx(1.0 + 2.0)
    assert s.lane_busy_ms == pytest.approx(4.0)
    assert s.bound() == "GPU-bound" and s.share("host") == pytest.approx(0.3)


def test_a_modeled_runs_stall_for_the_lane_is_the_lanes_and_means_go_over_tokens():
    events = [ev("host", "token", 0.0, 4.0, token=1), ev("copy", "copy", 0.0, 4.0, token=1),
              ev("gpu", "stall", 1.0, 3.0, token=1, detail="waits for copy"),
              ev("host", "token", 4.0, 10.0, token=2), ev("gpu", "layer", 4.0, 5.0, token=2),
              ev("gpu", "stall", 5.0, 6.0, token=2, detail="waits for cpu_run")]
    s = time_split(events)
    assert s.tokens == 2 and s.wall_ms == pytest.approx(5.0)
    assert s.ms == pytest.approx({"gpu": 0.5, "link": 1.0, "link + lane": 0.0, "lane": 0.5, "host": 3.0})
    assert s.bound() == "host-bound"
    empty = time_split([ev("host", "token", 0.0, 4.0, token=0)])
    assert empty.tokens == 0 and empty.bound() == "" and set(empty.ms) == set(STATES)
    assert all(v == 0.0 for v in empty.ms.values()) and empty.share("gpu") == 0.0


def test_a_real_runs_split_adds_up_to_its_tokens(tiny_engine_run):
    """A modeled run of a tiny DeepSeek-V2 on the CPU: every decode token's wall time is split, nothing more or less."""
    events, _ = tiny_engine_run
    s = time_split(events)
    walls = [e.end_ms - e.start_ms for e in events if e.kind == "token" and e.token >= 1]
    assert s.tokens == len(walls) > 0
    assert sum(s.ms.values()) == pytest.approx(s.wall_ms, rel=1e-9)
    assert s.wall_ms == pytest.approx(sum(walls) / len(walls))
    assert s.ms["gpu"] > 0 and s.link_busy_ms > 0 and s.ms["link"] > 0    # lru at a small budget waits for copies


def test_the_trace_explorer_card_says_what_bounds_a_token(tiny_engine_run):
    from pages.trace_cards import summary_html

    events, summary = tiny_engine_run
    split = time_split(events)
    html = summary_html(summary, "a label", None, split)
    assert "time per token" in html and split.bound() in html
    assert f"gpu {100 * split.share('gpu'):.0f}%" in html
    assert "time per token" not in summary_html(summary)                  # no split given: no card
    assert "time per token" not in summary_html(summary, "", None, time_split([]))


@pytest.fixture(scope="module")
def tiny_engine_run(engines):
    from spice_core.api import RunSettings

    eng = engines["deepseek_v2"]
    gen = eng.start_ids([3, 5, 7, 11], RunSettings(policy="lru", cache_frac=0.25, max_new_tokens=6))
    list(gen)
    return eng.get_events(gen.run_id), eng.get_summary(gen.run_id)


def test_the_trace_split_script_reads_measured_chrome_traces(tmp_path, capsys):
    """benchmarks/trace_split.py: one row per trace written by the engine's exporter; a trace it cannot read is one
    clear line and exit code 2, not a traceback."""
    import importlib.util
    from pathlib import Path

    from spice_core.trace.export import write_chrome_trace

    spec = importlib.util.spec_from_file_location(
        "trace_split", Path(__file__).resolve().parents[2] / "benchmarks" / "trace_split.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    events = [ev("host", "token", 0.0, 4.0, token=1), ev("copy", "copy", 0.0, 3.0, token=1),
              ev("gpu", "stall", 0.0, 3.0, token=1, detail="waits for copy"), ev("gpu", "layer", 3.0, 4.0, token=1)]
    path = write_chrome_trace(events, tmp_path / "t.json", metadata={"policy": "lru"})
    assert script.main([str(path), "--markdown"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| trace | timing | decode tokens | wall ms/token | gpu ms | link ms")
    assert out[2].split(" | ")[1:6] == ["measured", "1", "4.00", "1.00", "3.00"] and out[2].endswith("link-bound |")
    modeled = [TraceEvent(e.token, e.layer, e.expert, e.lane, e.kind, e.start_ms, e.end_ms, timing="modeled",
                          detail=e.detail) for e in events]      # a trace downloaded from the app on a CPU
    path = write_chrome_trace(modeled, tmp_path / "m.json.gz", metadata={"policy": "lru"})
    assert script.main([str(path)]) == 0 and "modeled" in capsys.readouterr().out
    assert script.main([str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err
