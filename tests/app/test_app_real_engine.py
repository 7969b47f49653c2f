"""The app driving the real engine (spice_core.engine.SpiceEngine) on CPU.

A tiny random DeepSeek-V2 checkpoint built in the test stands in for the shipped model, so
these run everywhere; the last test uses the shipped model and is skipped without it.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from gradio_client import Client

from app_helpers import ROOT, chat_inputs, content, last_notes, serve

engine_mod = pytest.importorskip("spice_core.engine", reason="the engine (spice_core/engine.py) is not in this tree")
from tiny_models import build_tiny

SHIPPED = ROOT / "assets" / "spice-mini"


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    model_dir = build_tiny("deepseek_v2", tmp_path_factory.mktemp("tiny") / "deepseek_v2")
    s = serve(engine_mod.SpiceEngine.load(model_dir, device="cpu"))
    yield s
    s.demo.close()
    s.ctx.exports.cleanup()


def _plot(value) -> dict:
    assert isinstance(value, dict) and value["type"] == "plotly"
    return json.loads(value["plot"])


def test_real_engine_chat_streams_and_its_trace_exports_as_valid_chrome_json(real):
    from spice_core.trace.chrome_schema import validate_chrome_trace

    c = Client(real.url, verbose=False)
    out = c.predict(*chat_inputs("tell me a story about the cat", max_new_tokens=16, policy="spice_prefetch",
                                 cache_frac=0.5), api_name="/chat")
    notes = last_notes(out[1])
    run_note = [n for n in notes if n.startswith("Run ")]
    assert run_note, notes
    run_id = run_note[0].split()[1]
    assert {t["type"] for t in _plot(out[3])["data"]} >= {"heatmap"}
    assert any(t["type"] == "bar" for t in _plot(out[5])["data"])
    trace = json.loads(Path(c.predict(run_id, "chrome", api_name="/export")).read_text())
    assert validate_chrome_trace(trace) == []
    table = c.predict(run_id, 0, 16, api_name="/trace_run")[4]
    assert [row[0] for row in table["data"]] == list(real.ctx.info.moe_layers)
    c.close()


def test_a_cache_below_the_models_smallest_is_refused_by_the_app_and_the_smallest_runs(real):
    """Regression (QA, defect 2): 0 was on the cache slider and the engine refused it, whatever the model, in GB to four
    decimals. The app's range starts at the smallest step that holds one layer's top-k experts (the engine's own
    bound, per model): below it the app says the range, and at it the engine runs."""
    from pages.limits import slider_ranges

    low = slider_ranges(real.ctx.info)["cache_frac"][0]
    assert 0 < low < 1
    c = Client(real.url, verbose=False)
    out = c.predict(*chat_inputs("the cat", max_new_tokens=4, policy="lru", cache_frac=0.0), api_name="/chat")
    notes = last_notes(out[1])
    assert any(n.startswith("⚠ Settings not applied: GPU cache size") and f"[{low:g}, 1]" in n for n in notes), notes
    for policy in ("lru", "spice"):
        out = c.predict(*chat_inputs("the cat", max_new_tokens=4, policy=policy, cache_frac=low), api_name="/chat")
        assert any(n.startswith("Run ") for n in last_notes(out[1])), last_notes(out[1])
    c.close()


def test_a_sweep_below_the_models_smallest_cache_is_refused_and_one_at_it_runs(real):
    """The sweep's cache check (pages.limits.cache_share) against the real engine's own bound: below the smallest
    step nothing runs and the page says the range; at it every run of the sweep finishes."""
    import gradio as gr

    from pages.limits import slider_ranges
    from pages.sweep import SweepPage
    from pages.sweep_run import SweepSession

    page = SweepPage(real.ctx)
    with gr.Blocks():
        page.build()
    low = slider_ranges(real.ctx.info)["cache_frac"][0]
    d = page.defaults
    sweep = lambda cache: page.run("the cat", ["lru"], "0.2", "0", cache, 4, d.profile, d.shape,  # noqa: E731
                                   SweepSession(), lambda *a, **k: None)
    refused = next(sweep(low / 2))[0]
    assert refused.startswith("⚠ Sweep not started: GPU cache size") and f"it takes {low:g} to 1" in refused, refused
    *_, last = sweep(low)
    assert last[0].startswith("Done"), last[0]


@pytest.mark.skipif(not (SHIPPED / "config.json").exists(),
                    reason="the shipped model (assets/spice-mini/) is not in this checkout yet")
def test_shipped_model_answers_in_english_through_the_app():
    s = serve(engine_mod.SpiceEngine.load(None, device="cpu"))
    try:
        c = Client(s.url, verbose=False)
        out = c.predict(*chat_inputs("Tell me a story about a cat.", max_new_tokens=32), api_name="/chat")
        replies = [content(m) for m in out[1] if m["role"] == "assistant" and not m.get("metadata")]
        assert replies and len(replies[-1].split()) >= 5, out[1]
        c.close()
    finally:
        s.demo.close()


def test_real_engine_run_compares_downloads_gzipped_and_sits_beside_its_baselines(real):
    """What a visitor touches in the trace explorer, on the real engine: the baseline cards, the gzipped
    Chrome trace and two runs side by side."""
    import gzip

    c = Client(real.url, verbose=False)
    ids = []
    for policy in ("lru", "spice_prefetch"):
        out = c.predict(*chat_inputs("tell me a story about the dog", max_new_tokens=8, policy=policy,
                                     cache_frac=0.5), api_name="/chat")
        ids.append(next(n for n in last_notes(out[1]) if n.startswith("Run ")).split()[1])
    summary_html = c.predict(ids[1], 0, 16, api_name="/trace_run")[1]
    assert "vs lru" in summary_html and "vs on_demand" in summary_html and "same routing" in summary_html
    plain = json.loads(Path(c.predict(ids[1], "chrome", api_name="/export")).read_text())
    gz = c.predict(ids[1], "chrome_gz", api_name="/export")
    assert json.loads(gzip.decompress(Path(gz).read_bytes())) == plain
    html, _timeline, table = c.predict(ids[0], ids[1], 0, 16, api_name="/compare")
    assert "lru" in html and "spice_prefetch" in html and "TPOT median" in html
    assert [row[0] for row in table["data"]] == list(real.ctx.info.moe_layers)
    c.close()


def test_trace_timeline_takes_any_window_a_visitor_types(real):
    """Out-of-range "From token" / "Tokens shown" draw the nearest window instead of an error box."""
    c = Client(real.url, verbose=False)
    out = c.predict(*chat_inputs("tell me a story about the owl", max_new_tokens=8, policy="lru", cache_frac=0.5),
                    api_name="/chat")
    run_id = next(n for n in last_notes(out[1]) if n.startswith("Run ")).split()[1]
    whole = _plot(c.predict(run_id, 0, 4096, api_name="/trace_run")[3])
    for first, count in ((-5, 16), (0, 100000), (0, 0), (None, None)):
        timeline = _plot(c.predict(run_id, first, count, api_name="/trace_run")[3])
        assert any(t["type"] == "bar" for t in timeline["data"]), (first, count, timeline["layout"].get("title"))
    assert _plot(c.predict(run_id, 0, 100000, api_name="/trace_run")[3])["data"] == whole["data"]
    c.close()


def test_api_chat_takes_a_history_written_as_plain_strings(real):
    """API clients write a message's content as a string (the usual chat format): the app takes it as the
    browser's list of parts, and the model sees the same conversation either way."""
    c = Client(real.url, verbose=False)
    plain = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once upon a time"}]
    parts = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in plain]
    replies = []
    for history in (plain, parts):
        out = c.predict(*chat_inputs("Go on.", history, max_new_tokens=6, policy="lru", cache_frac=0.5),
                        api_name="/chat")
        assert [content(m) for m in out[1][:2]] == ["Tell me a story.", "Once upon a time"], out[1][:2]
        replies.append([content(m) for m in out[1] if m["role"] == "assistant" and not m.get("metadata")][-1])
    assert replies[0] == replies[1]
    c.close()


def test_api_chat_takes_odd_histories_without_an_error(real):
    """Pairs of the older tuple format, a message without content, a non-message: the chat answers (the pairs
    become messages, the rest is left out) instead of raising before the handler."""
    c = Client(real.url, verbose=False)
    for history in ([["Tell me a story.", "Once upon a time"]], [{"role": "user", "content": None}],
                    [{"role": "user", "content": ["Tell me a story."]}], [42, "hello", {"content": "x"}]):
        out = c.predict(*chat_inputs("Go on.", history, max_new_tokens=4, policy="lru", cache_frac=0.5),
                        api_name="/chat")
        assert any(n.startswith("Run ") for n in last_notes(out[1])), (history, out[1])
    c.close()


def test_a_long_chat_leaves_the_real_engines_reply_its_room(real):
    """The chat's history fitting (pages/chat_fit.py) on the real engine's own token count: a chat longer than the
    context loses its oldest exchanges until the prompt leaves the reply its room, and no more than that."""
    from pages.chat_fit import FittedStart
    from spice_core.api import RunSettings
    from spice_core.errors import ContextError

    engine = real.engine
    ctx = engine.info().max_context_tokens
    settings = RunSettings(policy="lru", max_new_tokens=min(32, ctx // 4))
    turn = "tell me more about the cat and the dog " * 3
    turns = []
    while True:
        turns += [{"role": "user", "content": turn}, {"role": "assistant", "content": turn}]
        try:
            engine.start_chat(turns + [{"role": "user", "content": "and now?"}], settings, min_reply_tokens=1)
        except ContextError:
            break
    turns.append({"role": "user", "content": "and now?"})
    fit = FittedStart(engine, turns, settings, ctx)
    run = fit()
    assert fit.dropped > 0 and ctx - len(run.input_ids) >= fit.room == settings.max_new_tokens
    with pytest.raises(ContextError):         # one exchange fewer dropped would not leave that room
        engine.start_chat(turns[2 * (fit.dropped - 1):], settings, min_reply_tokens=fit.room)
    assert len(list(run)) == settings.max_new_tokens or run.summary().finish_reason in ("eos", "stop")
