"""The app's pure parts, without a server: messages, settings, live numbers, figures, runner, tables."""
from __future__ import annotations

import json
import time

import plotly.graph_objects as go
import pytest
from types import SimpleNamespace

from app_helpers import CHAT_DEFAULTS
from fake_engine import FakeEngine, settings
from pages import figures, figures_sweep
from pages.about import benchmark_tables, first_table
from pages.common import AppContext, ExportStore, settings_from_values, spice_error_text
from pages.live import LiveRun
from spice_core.api import identical_prefix_share
from pages.messages import clean_message, drop_oldest_turn, engine_turns, normalize_history, note, problem_with
from pages.runner import EngineRunner
from pages.sweep_inputs import grid, parse_values
from pages.trace_explorer import per_layer_frame, per_token_series
from spice_core.api import LaneInterval, RunSettings, format_bytes
from spice_core.errors import ConfigError, SpiceError


# --- messages ----------------------------------------------------------------------------------
def test_clean_message_keeps_newlines_and_tabs_and_drops_other_controls():
    m = clean_message("a\x00b\tc\r\nd\x1b[0m\ud800")
    assert m.text == "ab\tc\nd[0m" and m.removed == 3 and m.example == "U+0000"


@pytest.mark.parametrize("raw,words", [("", "empty"), (" \n ", "empty"), ("\x07\x08", "only had control"),
                                       ("x" * 5000, "5,000 characters"), ("\x00" * 20 + "abc", "binary")])
def test_problem_with_names_what_is_wrong(raw, words):
    assert words in problem_with(clean_message(raw), len(raw), 4000, 1024)


def test_a_terminal_escape_in_normal_text_is_not_binary():
    raw = "see \x1b[31mred\x1b[0m output please"
    assert problem_with(clean_message(raw), len(raw), 4000, 1024) == ""


def test_history_in_parts_or_strings_becomes_turns_without_app_notes():
    history = normalize_history([
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": "hello"},
        note("Run x · 3 tokens", "stats"),
        {"role": "assistant", "content": [{"type": "file", "file": {}}]},
        "garbage",
    ])
    assert engine_turns(history) == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def test_drop_oldest_turn_keeps_system_prompt_and_starts_on_a_user_turn():
    turns = [{"role": "system", "content": "s"}, {"role": "user", "content": "1"},
             {"role": "assistant", "content": "a"}, {"role": "user", "content": "2"}]
    assert drop_oldest_turn(turns) == [{"role": "system", "content": "s"}, {"role": "user", "content": "2"}]
    assert drop_oldest_turn([{"role": "user", "content": "only"}]) is None


# --- settings ----------------------------------------------------------------------------------
def _values(**overrides):
    return dict(list((CHAT_DEFAULTS | overrides).items())[:11])


def test_settings_from_values_converts_integral_floats_and_refuses_the_rest_by_name():
    info = FakeEngine().info()
    s = settings_from_values(info, _values(max_lookahead=6.0, lore_rank="8"))
    assert s.max_lookahead == 6 and s.lore_rank == 8
    for bad, words in [(dict(max_lookahead=2.5), "max_lookahead=2.5"), (dict(cpu_lane="yes"), "cpu_lane"),
                       (dict(cache_frac=float("nan")), "cache_frac is NaN"), (dict(shape="huge"), "shape='huge'"),
                       (dict(policy=None), "policy is missing")]:
        with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
            settings_from_values(info, _values(**bad))


# --- live numbers --------------------------------------------------------------------------------
def test_live_numbers_match_the_engine_summary():
    engine = FakeEngine(token_delay_s=0)
    gen = engine.start_prompt("hello", settings(max_new_tokens=30))
    live = LiveRun.for_engine(engine.info())
    for step in gen:
        live.add(step)
    s = gen.summary()
    assert live.n_tokens == s.n_tokens
    assert live.tpot_ms == pytest.approx(s.tpot_ms_median)
    assert live.hit_rate == pytest.approx(s.hit_rate) and live.late_rate == pytest.approx(s.late_prefetch_rate)
    assert live.bytes_per_token == pytest.approx(s.bytes_per_token)
    assert live.counts.sum() == sum(len(st.outcomes) for st in engine._runs[gen.run_id].steps)


def test_live_run_ignores_outcomes_for_layers_it_was_not_told_about():
    from spice_core.api import ExpertOutcome, StepStats
    live = LiveRun(layers=(1, 2), n_experts=4)
    live.add(StepStats(0, 5, "x", 1.0, "modeled", 1, 1, 0, 0.0, 1.0,
                       outcomes=(ExpertOutcome(1, 0, "hit"), ExpertOutcome(9, 0, "copy"), ExpertOutcome(2, 7, "copy"),
                                 ExpertOutcome(2, 1, "weird"))))
    assert live.counts.sum() == 1 and live.hit_rate == 1.0


@pytest.mark.parametrize("tokens,ref,expected", [([1, 2, 3], [1, 2, 3], 1.0), ([1, 9, 3], [1, 2, 3], 1 / 3),
                                                 ([], [1, 2], 0.0), ([1, 2], [1, 2, 3, 4], 0.5), ([], [], 1.0)])
def test_identical_prefix_share_is_the_share_of_the_reference_before_the_first_divergence(tokens, ref, expected):
    assert identical_prefix_share(ref, tokens) == pytest.approx(expected)


# --- figures -----------------------------------------------------------------------------------------
def _live(n=20):
    engine = FakeEngine(token_delay_s=0)
    live = LiveRun.for_engine(engine.info())
    for step in engine.start_prompt("figures", settings(max_new_tokens=n)):
        live.add(step)
    return live


def test_every_figure_is_valid_plotly_json_without_a_title():
    live = _live()
    rows = [dict(policy="lru", tau_prefetch=0.2, tau_approx=0.0, tpot_ms=9.0, agreement=1.0, hit_rate=0.5)]
    for fig in (figures.outcome_heatmap(live), figures.prefetch_timeline(live), figures.lane_gantt(live.intervals()),
                figures.token_overview([0, 1], [5.0, 2.0], [1.0, 0.5], [3.0, 1.0], "modeled"),
                figures_sweep.pareto_plot(rows, "modeled"), figures_sweep.policy_bars(rows, "modeled"), figures.empty_figure("x")):
        go.Figure(fig)                                    # validates against plotly's schema
        json.dumps(fig, allow_nan=False)
        assert "title" not in fig["layout"]


def test_gantt_bars_start_at_base_and_merge_back_to_back_intervals():
    ivs = [LaneInterval("gpu", "expert", 0.0, 1.0, 3, 1), LaneInterval("gpu", "expert", 1.0, 2.0, 3, 4),
           LaneInterval("gpu", "stall", 2.0, 2.5, 3), LaneInterval("gpu", "expert", 2.5, 3.0, 3, 7),
           LaneInterval("copy", "copy", 0.5, 2.0, 3, 7), LaneInterval("gpu", "hit", 1.0, 1.0, 3, 1)]
    fig = figures.lane_gantt(ivs)
    bars = {t["name"]: t for t in fig["data"]}
    experts = bars[figures.KIND_LABELS["expert"]]
    assert experts["base"] == [0.0, 2.5] and experts["x"] == [2.0, 0.5]
    assert "×2" in experts["hovertext"][0] and "E1, E4" in experts["hovertext"][0]
    assert fig["layout"]["yaxis"]["categoryarray"] == ["gpu", "copy"]


def test_lane_order_is_gpu_copy_cpus_by_number_then_host():
    assert figures.lane_order(["host", "cpu10", "copy", "cpu2", "gpu", "zz", "copy#2"]) == \
        ["gpu", "copy", "copy#2", "cpu2", "cpu10", "host", "zz"]


def test_pareto_front_keeps_only_settings_no_other_beats_on_both_axes():
    points = [(10.0, 1.0), (8.0, 0.9), (9.0, 0.8), (6.0, 0.5), (7.0, 0.5)]
    assert figures_sweep.pareto_front(points) == [3, 1, 0]


# --- sweep ---------------------------------------------------------------------------------------------
def test_sweep_grid_varies_only_the_thresholds_each_policy_uses():
    base = RunSettings()
    g = grid(["lru", "spice_prefetch", "spice"], [0.1, 0.5], [0.0, 0.3], base)
    by_policy = {p: [(s.tau_prefetch, s.tau_approx) for s in g if s.policy == p] for p in ("lru", "spice_prefetch",
                                                                                             "spice")}
    assert by_policy == {"lru": [(base.tau_prefetch, 0.0)], "spice_prefetch": [(0.1, 0.0), (0.5, 0.0)],
                         "spice": [(0.1, 0.0), (0.1, 0.3), (0.5, 0.0), (0.5, 0.3)]}
    assert all(s.temperature == 0.0 for s in g)


def test_parse_values_accepts_commas_and_spaces_and_names_bad_items():
    assert parse_values("0.3, 0.1 0.3;0", "tau_prefetch") == [0.0, 0.1, 0.3]
    with pytest.raises(ConfigError, match="τ_prefetch: 'x' is not a number"):
        parse_values("0.1, x", "tau_prefetch")


# --- runner ---------------------------------------------------------------------------------------------
def _drain(stream, timeout_s=10.0):
    steps, end = [], time.monotonic() + timeout_s
    while time.monotonic() < end:
        got, ended = stream.take(0.05)
        steps += got
        if ended:
            return steps
    raise AssertionError("the run did not end")


def test_runner_cancels_a_run_nobody_reads_and_lets_the_next_one_start():
    engine = FakeEngine(token_delay_s=0.01)
    runner = EngineRunner(orphan_after_s=0.3)
    s = settings(max_new_tokens=1000)
    first = runner.start("a", s, lambda: engine.start_prompt("one", s))
    assert first.join(5), "an unread run must cancel itself"
    assert first.cancel_reason == "orphaned" and first.summary().finish_reason == "cancelled"
    second = runner.start("b", settings(max_new_tokens=5), lambda: engine.start_prompt("two", settings(max_new_tokens=5)))
    assert len(_drain(second)) == 5 and engine.concurrent_violations == 0


def test_starting_a_run_supersedes_only_the_same_owners_previous_one():
    engine = FakeEngine(token_delay_s=0.01)
    runner = EngineRunner()
    s = settings(max_new_tokens=1000)
    first = runner.start("a", s, lambda: engine.start_prompt("one", s))
    first.take(1.0)
    second = runner.start("a", s, lambda: engine.start_prompt("two", s))
    assert first.done and first.cancel_reason == "superseded" and engine.concurrent_violations == 0
    second.cancel()
    _drain(second)


# --- exports, tables, about --------------------------------------------------------------------------
class _OneRunExports:
    """An engine with one run, "r-1", whose exports are small files (what ExportStore needs of an engine)."""

    def list_runs(self):
        return [SimpleNamespace(run_id="r-1")]

    def export_chrome_trace(self, run_id, out_dir):
        path = out_dir / "t.json"
        path.write_text("{}")
        return path

    def export_csv(self, run_id, out_dir):
        path = out_dir / "t.csv"
        path.write_text("a\n")
        return path


def test_exports_go_to_a_folder_named_from_the_run_id_only_and_malformed_ids_never_touch_the_disk(tmp_path):
    store = ExportStore(_OneRunExports(), tmp_path)
    path = store.get("r-1", "chrome")
    assert path.is_relative_to(tmp_path / "r-1")
    for bad in ("../../etc/x", "x" * 5000, "a/b", ""):
        with pytest.raises(ConfigError):
            store.get(bad, "chrome")
    with pytest.raises(ConfigError):
        store.get("r-1", "pdf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r-1"]


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), MemoryError()])
def test_an_export_the_server_cannot_write_is_a_message_and_leaves_nothing(tmp_path, failure):
    """Regression (review): a full disk (or memory) while an export was written escaped the trace explorer's
    "Export failed" note as Gradio's bare error with a traceback in the log. It is a SpiceError naming the cause."""
    class Failing(_OneRunExports):
        def export_csv(self, run_id, out_dir):
            (out_dir / "half.csv").write_text("a")
            raise failure

    store = ExportStore(Failing(), tmp_path)
    with pytest.raises(SpiceError, match=r"the server could not write this export \((no space left on device|out of "
                                         r"memory)\); nothing was kept"):
        store.get("r-1", "csv")
    assert list(tmp_path.iterdir()) == []
    assert store.get("r-1", "chrome").exists()        # the next export works


def test_per_layer_frame_and_per_token_series_from_trace_events():
    engine = FakeEngine(token_delay_s=0)
    gen = engine.start_prompt("tables", settings(max_new_tokens=6))
    list(gen)
    events = engine.get_events(gen.run_id)
    frame = per_layer_frame(events, 6)
    assert list(frame["layer"]) == list(engine.moe_layers)
    shares = ["hit %", "prefetched hit %", "late prefetch %", "approx %", "CPU %", "CPU int8 %", "copied %"]
    assert (frame[shares].sum(axis=1) - 100).abs().max() < 0.6
    tokens, step_ms, stall_ms, mb = per_token_series(events)
    assert tokens == list(range(6)) and all(s >= w for s, w in zip(step_ms, stall_ms))


def test_about_finds_the_newest_benchmark_table(tmp_path):
    (tmp_path / "old.md").write_text("# Old 2024-01-01\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "new.md").write_text("Measured 2025-03-04.\n## Results\n| x |\n|:--|\n| 9 |\ntext\n")
    (tmp_path / "none.md").write_text("no table here 2026-01-01")
    tables = benchmark_tables(tmp_path)
    assert [t.path.name for t in tables] == ["new.md", "old.md"]
    assert tables[0].heading == "Results" and tables[0].table == "| x |\n|:--|\n| 9 |"
    assert first_table("nothing") == ("", "")
    rounds = ("# Round 1\n| old |\n|---|\n| 1 |\n# Round 2\n```bash\n# a comment, not a heading\n```\n"
              "## Results\n<!-- about: table -->\n"
              "| new |\n|---|\n| 2 |\n\n| later |\n|---|\n| 3 |\n")
    assert first_table(rounds) == ("Round 2 — Results", "| new |\n|---|\n| 2 |")


def test_the_app_writes_sizes_with_the_engines_one_helper(tmp_path):
    """Regression: pages.common.fmt_bytes copied spice_core.units.format_bytes at one figure fewer, so a page said
    "196.6 kB" of a size the engine's own messages wrote "197 kB". The pages now use the engine's helper."""
    import pages.common
    from pages.about import AboutPage

    assert not hasattr(pages.common, "fmt_bytes")
    assert [format_bytes(n) for n in (12, 1536, 17.3e6, 2.7e9)] == ["12 B", "1.54 kB", "17.3 MB", "2.70 GB"]
    engine = FakeEngine()
    ctx = AppContext.create(engine, export_root=tmp_path / "exports")
    expert = format_bytes(engine.expert_bytes)
    assert expert == "197 kB" and f"| expert size | {expert} |" in AboutPage(ctx, tmp_path, tmp_path)._engine_table()
    said = spice_error_text(ConfigError("cache budget 0.0015 GB leaves room for 3 experts: raise --cache-frac"))
    assert "1.50 MB" in said, said


def test_about_headline_quotes_the_headline_results_file(tmp_path):
    import json

    from pages.about import headline_markdown

    assert "No measured headline yet" in headline_markdown(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    assert "No measured headline yet" in headline_markdown(tmp_path / "bad.json")
    rec = lambda link, pol, ms, **kw: {"link": link, "policy": pol, "budget_frac": 0.25, "workload": "prompts",
                                       "timing": "measured", "tpot_ms_median": ms, "n_decode_tokens": 504, **kw}
    records = [rec("native", "on_demand", 60.0), rec("native", "lru", 45.0), rec("native", "spice", 20.0, ppl_delta_pct=0.3),
               rec("native", "resident", 10.0), rec("pcie4x8", "spice", 99.0) | {"budget_frac": 0.5},
               rec("native", "spice", 1.0) | {"timing": "modeled"}]
    (tmp_path / "r.json").write_text(json.dumps(records))
    text = headline_markdown(tmp_path / "r.json")
    assert "| PCIe 5.0 x16 (native) | H200 | 60.0 ms | 45.0 ms | – | 20.0 ms | – | 10.0 ms | 3.00× | 2.25× | 504 |" in text
    assert "PCIe 4.0 x8" not in text and "+0.30%" in text          # only measured 25% records are quoted
    assert "measured** on one H200" in text and "fewer decode steps" not in text


def test_about_headline_names_each_links_gpu_and_a_partial_link(tmp_path):
    """Regression: the About page said "measured on one H200" of a model whose x8 link ran on an H100, on 5 of
    its 8 prompts, and nothing in the table told the two apart."""
    import json

    from pages.about import headline_markdown

    rec = lambda link, pol, ms, steps, gpu: {"link": link, "policy": pol, "budget_frac": 0.25,  # noqa: E731
                                             "workload": "prompts", "timing": "measured", "tpot_ms_median": ms,
                                             "n_decode_tokens": steps, "gpu": gpu}
    records = [rec("native", "on_demand", 240.0, 504, "H200"), rec("native", "spice", 70.0, 504, "H200"),
               rec("pcie4x8", "on_demand", 960.0, 315, "H100"), rec("pcie4x8", "spice", 112.0, 315, "H100")]
    (tmp_path / "r.json").write_text(json.dumps(records))
    text = headline_markdown(tmp_path / "r.json")
    assert "| PCIe 5.0 x16 (native) | H200 |" in text and "| PCIe 4.0 x8 (emulated) | H100 |" in text
    assert "one GPU per link (the GPU column)" in text and "one H200" not in text
    assert "fewer decode steps has run on fewer of the prompts" in text


def test_about_headline_matches_the_committed_results():
    import json
    from pathlib import Path

    from pages.about import HEADLINE_RESULTS, headline_markdown

    path = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / HEADLINE_RESULTS
    text = headline_markdown(path)
    for r in json.loads(path.read_text()):
        if r.get("workload") == "prompts" and r.get("budget_frac") == 0.25 and r["policy"] in ("spice", "lru"):
            assert f"{r['tpot_ms_median']:.1f} ms" in text


def test_trace_window_bounds_bring_any_typed_number_into_range():
    from pages.trace_explorer import DEFAULT_WINDOW_TOKENS, MAX_WINDOW_TOKENS, window_bounds

    assert window_bounds(-5, 16) == (0, 16)
    assert window_bounds(3.6, 0) == (4, 1)
    assert window_bounds(12, 10**9) == (12, MAX_WINDOW_TOKENS)
    assert window_bounds(None, "") == (0, DEFAULT_WINDOW_TOKENS)
    assert window_bounds("x", float("nan")) == (0, DEFAULT_WINDOW_TOKENS)
    assert window_bounds(float("inf"), float("-inf"))[1] == 1


def test_a_lore_rank_the_models_factors_lack_is_refused_naming_the_ranks_it_has():
    """Regression: /settings took LoRE rank 3 on a model shipping ranks 1, 2, 4 (the run used r4 and a note said
    so), and 8 came back from /chat as a command-line message about --lore-rank. The engine's default (16) stays
    accepted: it means "up to 16", the largest rank the model has."""
    from dataclasses import replace
    from spice_core.api import DEFAULT_LORE_RANK
    info = replace(FakeEngine().info(), lore_ranks=(1, 2, 4))
    assert settings_from_values(info, CHAT_DEFAULTS | {"lore_rank": DEFAULT_LORE_RANK}).lore_rank == DEFAULT_LORE_RANK
    for rank in (3, 8, 12):
        with pytest.raises(ConfigError, match=rf"LoRE rank: lore_rank={rank} is not a rank .*choose one of 1, 2, 4"):
            settings_from_values(info, CHAT_DEFAULTS | {"lore_rank": rank})
    assert settings_from_values(info, CHAT_DEFAULTS | {"lore_rank": 2}).lore_rank == 2
    # A model without LoRE factors names no ranks: any rank in range is taken (approximation is off there).
    assert settings_from_values(replace(info, lore_ranks=()), CHAT_DEFAULTS).lore_rank == CHAT_DEFAULTS["lore_rank"]


def test_an_export_made_again_after_its_run_goes_private_has_a_new_unguessable_path(tmp_path):
    """Regression (review): an export's path was fixed per run and kind, so after Share was unticked (`drop_run`) the
    owner's next export of the same kind rewrote the very file an old shared link named, and the link worked again."""
    store = ExportStore(_OneRunExports(), tmp_path)
    shared = store.get("r-1", "csv")
    assert store.get("r-1", "csv") == shared          # the same export while nothing changed
    store.drop_run("r-1")
    again = store.get("r-1", "csv")
    assert again != shared and not shared.exists() and again.exists()
    assert len(again.parent.name) >= len("csv-") + 16, again


def test_the_first_tokens_heatmap_says_it_is_the_prompts_and_token_bars_stay_apart():
    """Regression (review): the heatmap's "token 0" was the whole prompt's experts (48 a layer where a token uses
    6), untold; and the lane chart merged two tokens' back-to-back host bars into one."""
    live = LiveRun(layers=(1,), n_experts=4)
    assert figures.heatmap_titles(live)[0].startswith("token 0 = prompt")
    bars = figures.merge_touching([LaneInterval("host", "token", 0.0, 1.0), LaneInterval("host", "token", 1.0, 2.0),
                                   LaneInterval("gpu", "expert", 0.0, 0.5, 1, 0),
                                   LaneInterval("gpu", "expert", 0.5, 1.0, 1, 1)])
    assert [(b[0], b[1], b[2], b[3]) for b in bars] == [("gpu", "expert", 0.0, 1.0), ("host", "token", 0.0, 1.0),
                                                        ("host", "token", 1.0, 2.0)]


def test_the_time_axes_say_whether_their_times_are_modeled_or_measured():
    """Review: the lane chart's and prefetch timeline's axes said "ms from the start of the run" with no timing mode
    (the numbers row and the banner say it)."""
    live = LiveRun(layers=(1,), n_experts=4, timing="measured")
    gantt = figures.lane_gantt([LaneInterval("gpu", "expert", 0.0, 1.0, 1, 0)], timing="modeled")
    assert gantt["layout"]["xaxis"]["title"]["text"] == "ms from the start of the run (modeled)"
    assert figures.prefetch_timeline(live)["layout"]["xaxis"]["title"]["text"].endswith("(measured)")
