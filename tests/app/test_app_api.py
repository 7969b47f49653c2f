"""The app through its API (gradio_client against the app launched in-process, fake engine)."""
from __future__ import annotations

import csv
import json
import threading
import time
import zipfile

import gradio as gr
import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from gradio_client.utils import Status

import fake_engine
from app_helpers import (CHAT_DEFAULTS, HeldReply, chat_inputs, content, last_notes, plot_json, serve, settings_inputs,
                         wait_for)
from fake_engine import FakeEngine


def _trace_types(fig: dict) -> set[str]:
    return {t.get("type", "scatter") for t in fig["data"]}


def _assistant_text(history) -> str:
    replies = [m for m in history if m["role"] == "assistant" and not (m.get("metadata") or {}).get("title")]
    return content(replies[-1]) if replies else ""


# --- a chat turn -----------------------------------------------------------------------------
def test_chat_streams_tokens_and_ends_with_plotly_panels(served, client):
    job = client.submit(*chat_inputs("Tell me a story", max_new_tokens=40), api_name="/chat")
    lengths, boxes = [], []
    for update in job:
        boxes.append(update[0])
        history = update[1]
        if isinstance(history, list) and history:
            lengths.append(len(_assistant_text(history)))
    final = job.result()
    text = _assistant_text(final[1])
    assert len(text.split()) >= 30, text
    assert len({n for n in lengths if n}) >= 3, f"the reply did not stream: lengths {lengths}"
    assert "" in boxes, "the textbox is cleared when the message is sent"
    assert final[0] != "", "and not cleared again when the reply ends (the user may be typing)"
    heatmap, prefetch, gantt = (plot_json(v) for v in final[3:6])
    assert "heatmap" in _trace_types(heatmap)
    assert "bar" in _trace_types(gantt) and "bar" in _trace_types(prefetch)
    gantt_bar = next(t for t in gantt["data"] if t["type"] == "bar")
    assert gantt_bar["orientation"] == "h" and len(gantt_bar["base"]) == len(gantt_bar["x"]) > 0
    assert min(gantt_bar["x"]) > 0 and "title" not in gantt["layout"]
    assert "TPOT" in final[2] and "run-" in final[2]
    notes = last_notes(final[1])
    assert any(n.startswith("Run run-") for n in notes), notes


def test_the_api_gives_and_takes_the_chat_as_typed_and_generated(served, client, monkeypatch):
    """Regression: /chat gave the conversation back as the chat stores it for display, escaped as Markdown ("\\*x\\*"
    for "*x*"), and read a history sent back as such (a backslash of the client's own was lost). An API client now
    gets its message as typed and the model's reply as generated, the app's notes as they are (Markdown), and a
    history it sends back reaches the model exactly."""
    monkeypatch.setattr(fake_engine, "WORDS", fake_engine.WORDS + ("*tea*", "<b>cat</b>", "a_b", "\\*", "[x](y)"))
    monkeypatch.setattr(served.engine, "eos_after", 30)           # the reply ends by itself: nothing trimmed
    typed = "*x* <b>y</b> a_b \\* [l](u) www.example.com\n1. `c`"
    out = client.predict(*chat_inputs(typed, max_new_tokens=40), api_name="/chat")
    reply = served.engine.get_summary(served.engine.generations[-1].run_id).text
    assert any(mark in reply for mark in ("*", "<", "_", "[")), f"the reply must hold markup to test this: {reply}"
    assert [content(m) for m in out[1] if m["role"] == "user"] == [typed]
    assert _assistant_text(out[1]) == reply
    run_note = next(n for n in last_notes(out[1]) if n.startswith("Run run-"))
    assert "Policy **" in run_note, run_note       # the app's own note keeps its Markdown
    client.predict(*chat_inputs("And then?", out[1], max_new_tokens=4), api_name="/chat")
    assert served.engine.generations[-1]._prompt == f"user: {typed}\nassistant: {reply}\nuser: And then?\nassistant:"


def test_conversation_history_reaches_the_engine_without_app_notes(served, client):
    first = client.predict(*chat_inputs("My name is Ada.", max_new_tokens=5), api_name="/chat")
    client.predict(*chat_inputs("What is my name?", first[1], max_new_tokens=5), api_name="/chat")
    prompt = served.engine.generations[-1]._prompt
    assert "user: My name is Ada." in prompt and "user: What is my name?" in prompt
    assert "Run run-" not in prompt and "TPOT" not in prompt


# --- trace explorer and exports ---------------------------------------------------------------
def test_trace_download_is_valid_chrome_trace_json(served, client):
    client.predict(*chat_inputs("trace me", max_new_tokens=12), api_name="/chat")
    run_id = served.engine.generations[-1].run_id
    path = client.predict(run_id, "chrome", api_name="/export")
    trace = json.loads(open(path).read())
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert slices and all({"name", "ts", "dur", "pid", "tid"} <= e.keys() for e in slices)
    try:
        from spice_core.trace.chrome_schema import validate_chrome_trace
    except ImportError:
        return
    assert validate_chrome_trace(trace) == []


def test_gzipped_chrome_trace_opens_as_the_same_trace(served, client):
    import gzip
    client.predict(*chat_inputs("trace me gzipped", max_new_tokens=6), api_name="/chat")
    run_id = served.engine.generations[-1].run_id
    plain = json.loads(open(client.predict(run_id, "chrome", api_name="/export")).read())
    gz = client.predict(run_id, "chrome_gz", api_name="/export")
    assert str(gz).endswith(".json.gz")
    assert json.loads(gzip.decompress(open(gz, "rb").read())) == plain


def test_two_runs_compare_side_by_side(served, client):
    client.predict(*chat_inputs("first run", max_new_tokens=6, policy="lru"), api_name="/chat")
    first = served.engine.generations[-1].run_id
    client.predict(*chat_inputs("second run", max_new_tokens=6, policy="resident"), api_name="/chat")
    second = served.engine.generations[-1].run_id
    html, timeline, table = client.predict(first, second, 0, 16, api_name="/compare")
    assert "lru" in html and "resident" in html and "TPOT median" in html and "×" in html
    assert timeline["type"] == "plotly" if isinstance(timeline, dict) else timeline
    assert table["headers"][:3] == ["layer", "hit % (first)", "hit % (second)"] and table["data"]
    hits_second = [row[2] for row in table["data"]]
    assert all(h == 100.0 for h in hits_second)              # resident hits every selection


def test_tensorboard_zip_and_csv_exports_open(served, client):
    client.predict(*chat_inputs("export me", max_new_tokens=8), api_name="/chat")
    run_id = served.engine.generations[-1].run_id
    zpath = client.predict(run_id, "tensorboard", api_name="/export")
    with zipfile.ZipFile(zpath) as zf:
        assert any(n.endswith(".pt.trace.json.gz") for n in zf.namelist())
    rows = list(csv.reader(open(client.predict(run_id, "csv", api_name="/export"))))
    assert len(rows) == 1 + 8
    exports_root = served.ctx.exports.root
    assert (exports_root / run_id).is_dir(), "exports go into a per-run folder"


def test_export_of_unknown_run_or_kind_is_refused_with_a_message(served, client):
    with pytest.raises(AppError, match="unknown"):
        client.predict("run-9999", "chrome", api_name="/export")
    client.predict(*chat_inputs("x", max_new_tokens=2), api_name="/chat")
    run_id = served.engine.generations[-1].run_id
    with pytest.raises(AppError, match="export kind"):
        client.predict(run_id, "../../etc/passwd", api_name="/export")


def test_trace_run_shows_timeline_overview_and_per_layer_table(served, client):
    client.predict(*chat_inputs("explore", max_new_tokens=10), api_name="/chat")
    run_id = served.engine.generations[-1].run_id
    out = client.predict(run_id, 0, 16, api_name="/trace_run")
    message, summary, overview, timeline, table = out[:5]
    assert message == "" and run_id in summary
    assert "bar" in _trace_types(plot_json(timeline)) and "bar" in _trace_types(plot_json(overview))
    assert table["headers"][0] == "layer" and len(table["data"]) == len(served.engine.moe_layers)
    shares = [sum(row[2:9]) for row in table["data"]]   # hit, prefetched, late prefetch, approx, CPU, CPU int8, copied %
    assert all(abs(s - 100) < 0.6 for s in shares), shares
    assert out[5] is None, "no export is written until one is asked for"


# --- bad input --------------------------------------------------------------------------------
BAD_MESSAGES = [
    ("", "Message not sent", "empty"),
    ("   \n\t  ", "Message not sent", "empty"),
    ("x" * 100_000, "Message not sent", "100,000 characters"),
    ("\x00\x01\x02\x7f", "Message not sent", "control characters"),
    (bytes(range(256)).decode("latin-1") * 4, "Message not sent", "binary"),
]
BAD_SETTINGS = [
    (dict(cache_frac=5.0), "cache_frac=5.0 is out of range"),
    (dict(tau_prefetch=-0.5), "tau_prefetch=-0.5 is out of range"),
    (dict(policy="turbo"), "policy='turbo' is unknown"),
    (dict(max_lookahead=2.5), "max_lookahead=2.5 is not a whole number: use an integer in [1, 16]"),
    (dict(max_new_tokens=100_000), "max_new_tokens=100000 is out of range"),
    (dict(temperature="hot"), "temperature='hot' is not a number"),
    (dict(profile="my-laptop"), "profile='my-laptop' is unknown"),
    (dict(lore_rank=0), "lore_rank=0 is out of range"),
    # Within the engine's range but beyond the slider's: a browser could not hold it, the API does not take it,
    # and the note names the slider's range.
    (dict(tau_approx=0.9), "τ_approx: tau_approx=0.9 is out of range: use a value in [0, 0.2]"),
    (dict(temperature=9.0), "Temperature: temperature=9.0 is out of range: use a value in [0, 2]"),
    (dict(max_lookahead=40), "max_lookahead=40 is out of range: use an integer in [1, 16]"),
    (dict(max_lookahead=0), "max_lookahead=0 is out of range: use an integer in [1, 16]"),
    (dict(max_new_tokens=0), "max_new_tokens=0 is out of range: use an integer in [1, 512]"),
    # Regression (review): 10**400 was "not a number", quoted cut to 20 digits (another number).
    (dict(max_new_tokens=10**400), "max_new_tokens=an integer of about 401 digits is out of range: use an integer"),
    (dict(max_new_tokens=10**30), "max_new_tokens=1000000000000000000000000000000 is out of range"),
    # Regression (review): "no" and "false" were true (an exact re-run nobody asked for, on the shared engine).
    (dict(check_exact="no"), "check_exact): 'no' is not true or false"),
    (dict(check_exact=0), "check_exact): 0 is not true or false: use true or false"),
    (dict(live_panels="yes"), "live_panels): 'yes' is not true or false"),
    (dict(cpu_lane="yes"), "cpu_lane: 'yes' is not true or false"),
]


def test_a_checkbox_sent_as_the_text_false_is_false(served, client):
    """Regression (review): check_exact="false" ran the exact re-run; "true"/"false" are read as the words say."""
    before = len(served.engine.generations)
    out = client.predict(*chat_inputs("hello", tau_approx=0.1, check_exact="false", cpu_lane="false",
                                      live_panels="false", max_new_tokens=3), api_name="/chat")
    assert len(served.engine.generations) == before + 1, "one reply, no exact re-run"
    assert not served.engine.generations[-1]._settings.cpu_lane
    assert _assistant_text(out[1])


@pytest.mark.parametrize("message,title,words", BAD_MESSAGES, ids=["empty", "whitespace", "100k", "controls",
                                                                   "binary"])
def test_bad_message_gets_a_note_in_the_chat_and_starts_nothing(served, client, message, title, words):
    before = len(served.engine.generations)
    out = client.predict(*chat_inputs(message), api_name="/chat")
    notes = last_notes(out[1])
    assert len(notes) == 1 and notes[0].startswith(f"⚠ {title}") and words in notes[0], notes
    assert len(served.engine.generations) == before
    assert not [m for m in out[1] if m["role"] == "user"], "a refused message is not shown as sent"


@pytest.mark.parametrize("overrides,words", BAD_SETTINGS, ids=[str(o) for o, _ in BAD_SETTINGS])
def test_out_of_range_setting_via_api_gets_a_note_naming_the_field(served, client, overrides, words):
    before = len(served.engine.generations)
    out = client.predict(*chat_inputs("hello", **overrides), api_name="/chat")
    notes = last_notes(out[1])
    assert len(notes) == 1 and "Settings not applied" in notes[0] and words in notes[0], notes
    assert len(served.engine.generations) == before


def test_out_of_range_setting_through_the_settings_endpoint_is_reported(served, client):
    note, _banner, _stats = client.predict(*settings_inputs(cache_frac=1.5), api_name="/settings")
    assert "Not applied" in note and "cache_frac=1.5" in note


def test_next_message_works_after_every_kind_of_bad_input(served, client):
    history = []
    for message, _, _ in BAD_MESSAGES:
        history = client.predict(*chat_inputs(message, history), api_name="/chat")[1]
    history = client.predict(*chat_inputs("now a real question", history, max_new_tokens=6), api_name="/chat")[1]
    assert _assistant_text(history), history


def test_control_characters_are_removed_and_the_rest_is_sent(served, client):
    out = client.predict(*chat_inputs("hi\x00 there\x07", max_new_tokens=3), api_name="/chat")
    users = [content(m) for m in out[1] if m["role"] == "user"]
    assert users == ["hi there"]
    assert any("Removed 2 control characters" in n for n in last_notes(out[1]))
    assert "hi there" in served.engine.generations[-1]._prompt


def test_prompt_longer_than_the_context_drops_the_oldest_exchanges(served, client):
    long_turn = "word " * 1200                      # ~1500 fake tokens per exchange; context is 1024
    history = [{"role": role, "content": [{"type": "text", "text": text}]}        # Gradio's message format
               for role, text in [("user", long_turn), ("assistant", "ok"), ("user", "short"), ("assistant", "fine")]]
    out = client.predict(*chat_inputs("and now?", history, max_new_tokens=3), api_name="/chat")
    assert any("Left out the 1 oldest exchange" in n for n in last_notes(out[1])), last_notes(out[1])
    assert _assistant_text(out[1])


def test_engine_failure_mid_reply_is_reported_and_the_next_message_works():
    s = serve(FakeEngine(token_delay_s=0.002, fail_at_token=3))
    try:
        c = Client(s.url, verbose=False)
        out = c.predict(*chat_inputs("break", max_new_tokens=10), api_name="/chat")
        assert any("The reply stopped early" in n and "simulated engine bug" in n for n in last_notes(out[1]))
        s.engine.fail_at_token = None
        out = c.predict(*chat_inputs("again", out[1], max_new_tokens=4), api_name="/chat")
        assert _assistant_text(out[1])
        c.close()
    finally:
        s.demo.close()


# --- concurrency: stop, second message, closed browser, busy queue ------------------------------
def _submit_and_wait(served, client, inputs: list, n_tokens: int = 5):
    """Submit /chat and wait until *this* generation has produced ``n_tokens``."""
    before = len(served.engine.generations)
    job = client.submit(*inputs, api_name="/chat")
    assert wait_for(lambda: len(served.engine.generations) > before), "the chat never started"
    gen = served.engine.generations[before]
    assert wait_for(lambda: len(gen._run.steps) >= n_tokens), "no tokens"
    return job, gen


def test_stop_cancels_between_tokens_and_says_so(served, client):
    job, gen = _submit_and_wait(served, client, chat_inputs("go on forever", max_new_tokens=512))
    client.predict(api_name="/stop")
    final = job.result(timeout=10)
    assert len(gen._run.steps) < 512
    assert any(n.startswith("■ Stopped after") for n in last_notes(final[1]))
    assert gen.summary().finish_reason == "cancelled"


def test_second_message_in_the_same_session_waits_its_turn(served, client):
    job1, _ = _submit_and_wait(served, client, chat_inputs("first", max_new_tokens=120), 3)
    job2 = client.submit(*chat_inputs("second", max_new_tokens=5), api_name="/chat")
    first, second = job1.result(timeout=20), job2.result(timeout=20)
    assert _assistant_text(first[1]) and _assistant_text(second[1])
    assert served.engine.concurrent_violations == 0


def test_busy_note_reaches_the_streaming_chat(served):
    """What the browser does when a second message is sent while a reply streams (see chat.note_if_busy)."""
    from pages.chat import ChatPage, ChatSession
    page = ChatPage(served.ctx)
    session = ChatSession()
    gen = page.chat("first", [], *settings_inputs(max_new_tokens=200), True, False, session)
    outputs = [next(gen) for _ in range(3)]
    assert session.streaming()
    page.note_if_busy(session)
    page.note_if_busy(session)                       # a second press adds no second note
    history = outputs[-1][1]
    for out in gen:
        history = out[1] if isinstance(out[1], list) else history
    notes = [m["metadata"]["title"] for m in history if m.get("metadata")]
    assert sum(n.startswith("⚠ Still answering your previous message") for n in notes) == 1, notes


@pytest.mark.parametrize("when", ["mid-reply", "during the exact check"])
def test_new_chat_while_a_reply_runs_ends_that_reply_on_the_emptied_page(served, when):
    """Regression: after New chat mid-reply the old conversation (and a panel's figure) came back about once in
    ten: the reply's outputs already under way reached the browser after New chat's own. The reply's last output
    is now the emptied page, so it wins whatever the order (and the textbox keeps what was typed since)."""
    from pages.chat import ChatPage, ChatSession
    page = ChatPage(served.ctx)
    session = ChatSession()
    if when == "mid-reply":
        gen = page.chat("a story", [], *settings_inputs(max_new_tokens=200), True, False, session)
        now = lambda out: isinstance(out[1], list) and len(_assistant_text(out[1])) > 20   # noqa: E731
    else:                                   # a lossy reply, checked against exact settings once it ends
        gen = page.chat("a story", [], *settings_inputs(max_new_tokens=8, tau_approx=0.1), True, True, session)
        now = lambda out: "checking…" in str(out[2])                                       # noqa: E731
    assert any(now(out) for out in gen), f"the reply ended before New chat could be pressed {when}"
    emptied = page.clear(session)
    rest = list(gen)
    assert rest, "the reply stopped without a last word: what it sent before New chat could land after it"
    last = rest[-1]
    assert last[1] == [] and last[2:] == emptied[2:7], last
    assert last[0] == gr.skip() and emptied[0] == "" and emptied[7] == str(session.gate)
    assert session.last_view == {}, "the numbers row would show the cleared reply again"
    assert served.wait_idle(10)


def test_closed_connection_mid_reply_frees_the_engine(served):
    """A browser that goes away mid-stream: the run is cancelled and the next user is served."""
    fn_index = next(i for i, fn in served.demo.fns.items() if fn.api_name == "chat")
    session_hash = "closed-tab-test"
    before = len(served.engine.generations)
    payload = {"data": [*chat_inputs("never read", max_new_tokens=512), None], "fn_index": fn_index,
               "session_hash": session_hash, "trigger_id": None, "event_data": None}
    base = served.url.rstrip("/") + "/gradio_api"
    r = httpx.post(f"{base}/queue/join", json=payload, timeout=10)
    assert r.status_code == 200, r.text
    with httpx.stream("GET", f"{base}/queue/data", params={"session_hash": session_hash}, timeout=10) as stream:
        for i, _line in enumerate(stream.iter_lines()):
            if i > 20:
                break                                 # read a little, then drop the connection
    assert wait_for(lambda: len(served.engine.generations) > before)
    gen = served.engine.generations[-1]
    assert wait_for(lambda: gen.summary().finish_reason == "cancelled" if gen._run.summary else False, 8), \
        "the abandoned run kept going"
    assert len(gen._run.steps) < 3000
    c = Client(served.url, verbose=False)
    out = c.predict(*chat_inputs("next user", max_new_tokens=4), api_name="/chat")
    assert _assistant_text(out[1])
    c.close()


def test_api_cancel_mid_reply_frees_the_engine(served, client):
    job, gen = _submit_and_wait(served, client, chat_inputs("cancel me", max_new_tokens=512))
    job.cancel()
    assert wait_for(lambda: gen._run.summary is not None, 8)
    assert len(gen._run.steps) < 3000


def test_slider_moved_mid_stream_applies_from_the_next_token(served, client):
    job, gen = _submit_and_wait(served, client, chat_inputs("slide", max_new_tokens=150), 10)
    note, _, _ = client.predict(*settings_inputs(tau_prefetch=0.9, policy="lru", max_new_tokens=150),
                             api_name="/settings")
    assert "tau_prefetch" in note and "next token" in note and "policy" in note
    final = job.result(timeout=20)
    applied = [(i, s) for i, s in gen.settings_log if s.tau_prefetch == 0.9]
    assert applied and 0 < applied[0][0] < 150, gen.settings_log
    assert all(s.policy == "spice" for _, s in gen.settings_log), "policy waits for the next message"
    changed = [n for n in last_notes(final[1]) if n.startswith("Settings changed")]
    assert changed and "tau_prefetch" in changed[0] and "policy: applies from your next message" in changed[0]


def test_full_queue_answers_busy():
    s = serve(FakeEngine(token_delay_s=0.01), max_queue=1)
    clients = [Client(s.url, verbose=False) for _ in range(3)]
    try:
        running = clients[0].submit(*chat_inputs("one", max_new_tokens=150), api_name="/chat")
        assert wait_for(lambda: s.engine.generations, 5)
        waiting = clients[1].submit(*chat_inputs("two", max_new_tokens=2), api_name="/chat")
        # the server has queued it (a fixed sleep raced with the client's join on a loaded machine)
        assert wait_for(lambda: waiting.status().code == Status.IN_QUEUE, 20), waiting.status()
        with pytest.raises(Exception, match="(?i)queue is full|busy"):
            clients[2].predict(*chat_inputs("three", max_new_tokens=2), api_name="/chat")
        assert _assistant_text(running.result(timeout=20)[1]) and _assistant_text(waiting.result(timeout=20)[1])
    finally:
        for c in clients:
            c.close()
        s.demo.close()


def test_many_sessions_never_run_the_engine_concurrently(served):
    results, errors = [], []

    def one(i):
        try:
            c = Client(served.url, verbose=False)
            results.append(c.predict(*chat_inputs(f"user {i}", max_new_tokens=15), api_name="/chat"))
            c.close()
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and len(results) == 4
    assert served.engine.concurrent_violations == 0


# --- sweep and about -------------------------------------------------------------------------
def test_sweep_plots_speed_against_quality_for_each_policy(served, client):
    out = client.predict("Once upon a time\nThe cache", ["lru", "spice"], "0.2, 0.6", "0, 0.5", 0.25, 12,
                         "rtx4090-pcie4x16", "deepseek-v2-lite", api_name="/sweep")
    status, pareto, bars, table = out
    assert status.startswith("Done"), status
    fig = plot_json(pareto)
    names = {t["name"] for t in fig["data"]}
    assert {"lru", "spice", "Pareto front"} <= names
    assert len(table["data"]) == 1 + 2 * 2                       # lru once; spice over τ_prefetch × τ_approx
    exact = [r for r in table["data"] if r[2] == 0.0]
    assert all(r[3] == 100.0 for r in exact), "exact settings agree with the reference"
    assert "bar" in _trace_types(plot_json(bars))


@pytest.mark.parametrize("args,words", [
    (("", ["lru"], "0.2", "0"), "write at least one prompt"),
    (("p", [], "0.2", "0"), "tick at least one policy"),
    (("p", ["spice"], "0.2, banana", "0"), "'banana' is not a number"),
    (("p", ["spice"], "0.2", "1.5"), "τ_approx=1.5 is out of range"),
    (("p\n" * 3, ["spice"], "0.1 0.2 0.3 0.4 0.5 0.6", "0 0.1 0.2 0.3 0.4 0.5 0.6 0.7"), "the limit is"),
])
def test_bad_sweep_input_is_reported(served, client, args, words):
    status = client.predict(*args, 0.25, 8, "rtx4090-pcie4x16", "deepseek-v2-lite", api_name="/sweep")[0]
    assert status.startswith("⚠ Sweep not started") and words in status, status


def test_about_shows_the_latest_benchmark_table_with_its_source(served, client):
    pick, table = client.predict(api_name="/benchmarks")
    if "No benchmark results" in table:
        pytest.skip("no docs/benchmarks/*.md with a table in this checkout")
    assert "|" in table and "Source: `docs/benchmarks/" in table


def test_about_quotes_the_measured_headline(served, client):
    text = client.predict(api_name="/headline")
    if "No measured headline" in text:
        pytest.skip("no docs/benchmarks/headline/results.json in this checkout")
    assert "**measured**" in text and "| PCIe 5.0 x16 (native) |" in text and "headline/results.json" in text


def test_settings_defaults_match_the_run_settings_contract():
    from spice_core.api import RunSettings
    fields = set(RunSettings.__dataclass_fields__)
    assert set(list(CHAT_DEFAULTS)[:11]) <= fields


def _notes(history) -> list[str]:
    return [m["metadata"]["title"] for m in history if m.get("metadata")]


@pytest.mark.parametrize("pressed", ["stop", "new chat"])
def test_a_message_waiting_for_the_engine_is_withdrawn_by_stop_or_new_chat_before_it_starts(served, pressed):
    """Regression (review): a message queued behind another visitor's reply ignored Stop ("Nothing is generating")
    and New chat: it ran once the engine was free, a whole reply, and after New chat it brought the cleared
    conversation back. The page sends the session's gate it showed with the message; Stop (nothing streaming) and
    New chat bump it, so the waiting message runs nothing: Stop's leaves a note (the text stays in the box), New
    chat's writes nothing over the emptied page."""
    from pages.chat import WITHDRAWN_CHAT_NOTE, WITHDRAWN_NOTE, ChatPage, ChatSession
    page, session = ChatPage(served.ctx), ChatSession()
    before = [{"role": "user", "content": "a dog story"}, {"role": "assistant", "content": "Once, a dog."}]
    sent_gate = str(session.gate)                       # what the page showed when Send was pressed
    if pressed == "stop":
        assert page.stop_reply(session) == WITHDRAWN_NOTE
        assert page.gate_now(session) == (str(session.gate), "1") and str(session.gate) != sent_gate
    else:
        assert page.clear(session)[7:] == (str(session.gate), "1") and str(session.gate) != sent_gate
    started = len(served.engine.generations)
    outs = list(page.chat_browser("a fox story", before, "", False, False, sent_gate, session))
    assert len(served.engine.generations) == started, "the withdrawn message reached the engine"
    assert len(outs) == 1 and outs[0][0] == gr.skip()   # the box keeps the text (or New chat's emptied box)
    if pressed == "stop":
        assert outs[0][1][:2] == before and _notes(outs[0][1]) == [WITHDRAWN_CHAT_NOTE]
        assert all(o == gr.skip() for o in outs[0][2:])
    else:
        assert all(o == gr.skip() for o in outs[0]), "New chat's emptied page would be overwritten"
    # The page heard the new gate: its next message runs.
    outs = list(page.chat_browser("a fox story", before, "", False, False, str(session.gate), session))
    assert len(served.engine.generations) == started + 1 and "Run " in str(outs[-1][1])
    assert served.wait_idle(10)


def test_stop_while_the_message_waits_inside_the_engine_queue_cancels_it_before_a_token_is_read(served):
    """The message got past the gate and waits for another visitor's reply to end (the runner's join): Stop then
    withdraws it as soon as the engine takes it, before any token reaches the page, and frees the engine."""
    from pages.chat import WITHDRAWN_CHAT_NOTE, ChatPage, ChatSession
    from spice_core.api import RunSettings
    page, session = ChatPage(served.ctx), ChatSession()
    held = HeldReply()
    served.ctx.runner.start("another visitor", RunSettings(max_new_tokens=100), lambda: held)
    outs: list = []
    gen = page.chat_browser("a fox story", [], "", False, False, str(session.gate), session)
    waiter = threading.Thread(target=lambda: outs.append(next(gen)), daemon=True)
    try:
        waiter.start()
        assert wait_for(lambda: session.owner != "", 10), "the message never reached the engine's queue"
        page.stop_reply(session)                       # nothing of this session streams yet
    finally:
        held.release.set()
    waiter.join(30)
    assert outs and _notes(outs[0][1]) == [WITHDRAWN_CHAT_NOTE] and outs[0][1][:-1] == [], outs
    assert list(gen) == []
    assert served.wait_idle(10)


def test_an_api_historys_control_characters_and_lone_surrogates_are_cleaned_as_a_new_message_is(served, client):
    """An API client's old turns are not the browser's: they are cleaned as the new message is (a lone surrogate,
    which raw JSON can carry as an escape, was the engine's refusal of the whole message)."""
    from pages.messages import engine_turns

    history = [{"role": "user", "content": "first question\x00\x07"}, {"role": "assistant", "content": "ok"}]
    out = client.predict(*chat_inputs("and now?", history, max_new_tokens=3), api_name="/chat")
    assert _assistant_text(out[1]), last_notes(out[1])
    prompt = served.engine.generations[-1]._prompt
    assert "first question" in prompt and "\x00" not in prompt and "\x07" not in prompt
    assert engine_turns([{"role": "user", "content": "a\ud800b"}]) == [{"role": "user", "content": "ab"}]


def test_too_few_inputs_are_refused_naming_the_hidden_state_the_api_page_leaves_out(served):
    """Review: "takes 15 inputs" beside an API page listing one fewer (the page's gr.State, which gradio_client sends
    by itself) read as a contradiction; the refusal says which input is hidden and what to send there."""
    fn_index = next(i for i, fn in served.demo.fns.items() if fn.api_name == "chat")
    n = len(served.demo.fns[fn_index].inputs)
    payload = {"data": ["hi"], "fn_index": fn_index, "session_hash": "too-few", "trigger_id": None, "event_data": None}
    r = httpx.post(served.url.rstrip("/") + "/gradio_api/queue/join", json=payload, timeout=10)
    assert r.status_code == 400, r.text
    assert f"This endpoint takes {n} inputs (1 of them the page's hidden state, which the API page leaves out: send " \
           "null there) and 1 came" in r.text, r.text
