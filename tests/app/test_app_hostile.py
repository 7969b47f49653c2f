"""The app under hostile or careless use by many visitors at once (a public Space).

Isolation (runs, labels, traces, exports belong to the visitor who made them), escaping of
visitor text, no pre-emption of someone else's reply, limits at the API, bounded disk and
memory, clean shutdown. Browser cases (escaping on every page) are in test_app_browser_hostile.py.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from app_helpers import ROOT, chat_inputs, last_notes, serve, wait_for
from fake_engine import FakeEngine, settings
from pages.common import ExportStore, spice_error_text
from pages.owners import RunBook, owner_of
from pages.runner import EngineRunner
from pages.trace_explorer import summary_html
from spice_core.errors import ConfigError, SpiceError

XSS = "<img src=x onerror=document.title='XSS-FIRED'>"


def _sweep_args(**over):
    args = dict(prompts="one prompt", policies=["lru"], tp="0.2", ta="0", cache=0.25, tokens=4,
                profile="rtx4090-pcie4x16", shape="deepseek-v2-lite")
    args.update(over)
    return list(args.values())


# --- 1. stored XSS -----------------------------------------------------------------------------
def test_regression_run_label_with_markup_is_escaped_in_the_trace_summary():
    engine = FakeEngine(token_delay_s=0)
    gen = engine.start_prompt("hi", settings(max_new_tokens=2))
    list(gen)
    html = summary_html(gen.summary(), "chat: " + XSS)
    assert "<img" not in html and "&lt;img src=x" in html


# --- 2. isolation ------------------------------------------------------------------------------
def test_a_second_visitor_cannot_list_open_or_export_the_first_visitors_runs(served):
    alice, bob = Client(served.url, verbose=False), Client(served.url, verbose=False)
    try:
        alice.predict(*chat_inputs("my secret plans", max_new_tokens=6), api_name="/chat")
        run_id = served.engine.generations[-1].run_id
        mine = alice.predict(None, api_name="/runs")
        assert run_id in str(mine) and "secret" in str(mine)
        theirs = bob.predict(None, api_name="/runs")
        assert run_id not in str(theirs) and "secret" not in str(theirs)
        out = bob.predict(run_id, 0, 16, api_name="/trace_run")
        assert out[0].startswith("⚠") and "not yours" in out[0] and run_id not in str(out[1])
        with pytest.raises(AppError, match="not yours"):
            bob.predict(run_id, "csv", api_name="/export")
        # the owner shares it: now its link opens for Bob (read-only), yet it is never listed to him
        assert "Anyone with this link" in alice.predict(run_id, True, api_name="/share")
        assert bob.predict(run_id, 0, 16, api_name="/trace_run")[0] == ""
        assert Path(bob.predict(run_id, "csv", api_name="/export")).exists()
        assert run_id not in str(bob.predict(None, api_name="/runs"))
        assert "Only the visitor" in bob.predict(run_id, False, api_name="/share")
    finally:
        alice.close()
        bob.close()
    assert served.wait_idle(10)


def test_owner_comes_from_the_browser_token_and_falls_back_to_the_session():
    token = "ab" * 16
    assert owner_of(SimpleNamespace(cookies={"spice_owner": token}, session_hash="s1")) == "browser:" + token
    assert owner_of(SimpleNamespace(cookies={"spice_owner": "forged<>"}, session_hash="s1")) == "session:s1"
    assert owner_of(None) == ""


def test_run_book_is_consistent_under_concurrent_writers_and_readers():
    book = RunBook(per_owner=50, total=400)
    errors = []

    def write(owner):
        for i in range(300):
            book.add(f"{owner}-{i}", owner, "label")

    def read():
        try:
            for _ in range(300):
                for e in book.list_for("w0"):
                    assert e.owner == "w0"
        except Exception as exc:      # a "dict changed size during iteration" would land here
            errors.append(exc)
    threads = [threading.Thread(target=write, args=(f"w{i}",)) for i in range(4)] + \
        [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(book.list_for("w0")) == 50


def test_engine_run_registry_is_locked_and_bounded_by_bytes():
    import spice_core.engine as eng
    engine = object.__new__(eng.SpiceEngine)            # only the registry, no model
    engine._runs, engine._runs_bytes, engine._runs_lock = eng.OrderedDict(), {}, threading.Lock()
    big = [None] * (eng.MAX_RETAINED_BYTES // eng.ITEM_BYTES_ESTIMATE // 3 + 1)
    for i in range(5):
        engine._register(eng.RunRecord(f"r{i}", settings(), events=big, summary=SimpleNamespace(run_id=f"r{i}")))
    kept = [s.run_id for s in engine.list_runs()]
    assert kept == ["r4", "r3"], kept       # at most the budget (two of these), newest first
    with pytest.raises(SpiceError, match="unknown"):
        engine.get_summary("x" * 5000)


# --- 3. no pre-emption; sweeps stop when abandoned --------------------------------------------
def test_a_reply_someone_is_reading_is_never_pre_empted_by_another_visitor():
    engine = FakeEngine(token_delay_s=0.01)
    runner = EngineRunner(orphan_after_s=1.0, join_timeout_s=0.3)
    s = settings(max_new_tokens=400)
    first = runner.start("alice", s, lambda: engine.start_prompt("one", s))
    stop = threading.Event()
    reader = threading.Thread(target=lambda: [first.take(0.05) for _ in iter(stop.is_set, True)])
    reader.start()
    try:
        with pytest.raises(SpiceError, match="busy with another visitor's reply"):
            runner.start("bob", s, lambda: engine.start_prompt("two", s))
        assert not first.cancelled
    finally:
        stop.set()
        reader.join()
    time.sleep(1.1)
    # once nobody reads it, the next visitor gets the engine and the reason is recorded
    second = runner.start("bob", settings(max_new_tokens=3), lambda: engine.start_prompt("two", settings(max_new_tokens=3)))
    assert first.cancel_reason == "orphaned" and engine.concurrent_violations == 0
    while not second.take(0.5)[1]:
        pass


def test_an_abandoned_sweep_stops_between_tokens_and_starts_no_further_run():
    from pages.common import AppContext
    from pages.sweep import SweepPage
    from pages.sweep_run import SweepSession
    engine = FakeEngine(token_delay_s=0.03)
    ctx = AppContext.create(engine)
    page = SweepPage(ctx)
    gen = page.run("a b c\nd e f", ["lru", "spice"], "0.2", "0, 0.3", 0.25, 60, "rtx4090-pcie4x16",
                   "deepseek-v2-lite", SweepSession(), lambda *a, **k: None)
    status = next(gen)[0]                      # the sweep yields while its first run streams
    assert status.startswith("Running 1 of"), status
    gen.close()                                # what Gradio does when the visitor leaves
    assert ctx.runner.wait_idle(5)
    time.sleep(0.3)
    assert len(engine.generations) == 1
    assert engine.generations[0].summary().finish_reason == "cancelled"


def test_waiting_visitors_are_told_what_the_engine_is_busy_with_and_its_owner_is_not(served):
    import app
    assert app.busy_text(served.ctx) == ""
    c = Client(served.url, verbose=False)
    try:
        job = c.submit(*chat_inputs("keep going", max_new_tokens=300), api_name="/chat")
        assert wait_for(lambda: served.ctx.runner.active is not None, 5)
        other = Client(served.url, verbose=False)
        try:
            text = other.predict(api_name="/engine_status")
        finally:
            other.close()
        assert "busy" in text and "chat reply" in text and "of at most 300" in text
        assert c.predict(api_name="/engine_status") == "", "the visitor whose reply it is was told to wait for it"
        c.predict(api_name="/stop")
        job.result(timeout=10)
    finally:
        c.close()


# --- 4. limits at the API, long histories ------------------------------------------------------
def test_chat_history_of_400_exchanges_is_trimmed_without_stalling(served):
    """The bound is generous (trimming takes ~10 ms on a 2-core machine): it catches a stall, not a slow machine."""
    from pages.chat import ChatPage, ChatSession
    page = ChatPage(served.ctx)
    history = []
    for i in range(400):
        history += [{"role": "user", "content": f"question {i} " + "word " * 30},
                    {"role": "assistant", "content": f"answer {i} " + "word " * 30}]
    t0 = time.perf_counter()
    out = None
    gen = page.chat("and now?", history, *chat_inputs("", max_new_tokens=1)[2:-2], False, False, ChatSession())
    first = next(gen)
    elapsed = time.perf_counter() - t0
    for out in gen:
        pass
    assert elapsed < 15.0, f"{elapsed:.2f} s to fit 400 exchanges"
    notes = last_notes(first[1])
    assert any("Kept the newest" in n for n in notes) and any("Left out the" in n for n in notes)


@pytest.mark.parametrize("over, words", [
    (dict(tokens=4096), "Tokens per run"),
    (dict(tokens="1e999"), "Tokens per run"),
    (dict(cache="nan"), "GPU cache size"),
    (dict(prompts="\n".join(f"p{i}" for i in range(8)), policies=["lru", "spice_prefetch", "spice"],
          tp="0.1,0.4,0.7", ta="0,0.1,0.3,0.6"), "the limit is 120"),
    (dict(prompts="\n".join("abcdefgh"), policies=["lru", "spice"], ta="0,0.1,0.3,0.6", tokens=128),
     "allows 4,096 per sweep"),
    (dict(ta="<b>x</b>"), "&lt;b&gt;"),
    # Regression: Gradio's own choice check answered with "Value: ... is not in the list of choices" and logged a
    # traceback; a bad profile or shape did not say which of the two was wrong.
    (dict(policies=["lru", "bogus"]), "Policies: 'bogus' is unknown"),
    (dict(profile="no-such-gpu"), "Hardware profile: 'no-such-gpu' is unknown"),
    (dict(shape="no-such-shape"), "Model shape: 'no-such-shape' is unknown"),
])
def test_sweep_limits_hold_at_the_api_with_messages_naming_the_control(served, client, over, words):
    status = client.predict(*_sweep_args(**over), api_name="/sweep")[0]
    assert status.startswith("⚠ Sweep not started") and words in status, status


def test_chat_max_new_tokens_beyond_the_slider_is_refused_by_name(client):
    out = client.predict(*chat_inputs("hi", max_new_tokens=4096), api_name="/chat")
    assert any("Max new tokens" in n and "[1, 512]" in n for n in last_notes(out[1]))
    out = client.predict(*chat_inputs("hi", max_new_tokens="1e999"), api_name="/chat")
    assert any("Max new tokens" in n for n in last_notes(out[1]))


def test_engine_messages_name_the_ui_control_not_the_command_line_flag():
    text = spice_error_text(ConfigError("cache budget 0.0077 GB leaves room for 0 experts: raise --cache-frac to "
                                        ">= 0.3125 or --cache-gb to >= 0.0100"))
    assert "--" not in text and "GPU cache size to >= 0.3125" in text


# --- 5. disk and memory ------------------------------------------------------------------------
def test_disk_use_stays_bounded_over_20_trace_views_and_exports(tmp_path):
    engine = FakeEngine(token_delay_s=0)
    served = serve(engine, export_root=tmp_path / "exports")
    served.ctx.exports._budget = 200_000
    c = Client(served.url, verbose=False)
    try:
        run_ids = []
        for i in range(5):
            c.predict(*chat_inputs(f"run {i}", max_new_tokens=8), api_name="/chat")
            run_ids.append(engine.generations[-1].run_id)
        for i in range(20):                           # 20 views, 40 export requests over 10 distinct exports
            run_id = run_ids[i % 5]
            c.predict(run_id, 0, 16, api_name="/trace_run")
            assert i or not any((tmp_path / "exports").iterdir()), "viewing a run writes no export"
            c.predict(run_id, "chrome", api_name="/export")
            c.predict(run_id, "csv", api_name="/export")
        used = served.ctx.exports.used_bytes()
        assert used <= 200_000 + 100_000, used        # the budget, plus at most the newest file
        # a refused export leaves nothing behind
        before = sorted(p.name for p in (tmp_path / "exports").iterdir())
        for bad in ("x" * 5000, "../etc", "run-9999"):
            with pytest.raises(AppError):
                c.predict(bad, "chrome", api_name="/export")
        assert sorted(p.name for p in (tmp_path / "exports").iterdir()) == before
    finally:
        c.close()
        served.demo.close()
        served.ctx.exports.cleanup()


def test_exports_of_runs_the_engine_forgot_are_deleted(tmp_path):
    runs = ["a1", "b2"]

    class Engine:
        def list_runs(self):
            return [SimpleNamespace(run_id=r) for r in runs]

        def export_csv(self, run_id, out_dir):
            path = out_dir / "x.csv"
            path.write_text("t\n" * 100)
            return path
    store = ExportStore(Engine(), tmp_path)
    store.get("a1", "csv")
    store.get("b2", "csv")
    runs.remove("a1")
    store.get("b2", "csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b2"]


def test_uploads_beyond_the_size_cap_are_refused(served):
    r = httpx.post(served.url.rstrip("/") + "/gradio_api/upload",
                   files={"files": ("big.bin", b"\0" * (3 * 2**20))}, timeout=20)
    assert r.status_code == 413, r.status_code


def test_sigterm_removes_the_export_folder(tmp_path):
    script = (
        "import sys, time; sys.path[:0] = [%r, %r]\n"
        "import app_helpers, app\n"
        "from fake_engine import FakeEngine\n"
        "demo, ctx = app.build_app(FakeEngine(token_delay_s=0))\n"
        "app.install_sigterm_cleanup(ctx)\n"
        "(ctx.exports.root / 'probe').mkdir()\n"
        "print(ctx.exports.root, flush=True)\n"
        "while True: time.sleep(0.1)\n") % (str(ROOT), str(Path(__file__).parent))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        root = Path(proc.stdout.readline().strip())
        assert root.is_dir()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert not root.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
