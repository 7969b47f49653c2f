"""The tuner in the app (issue 25, item 3), on the shipped model and the real engine: the sweep page's budgeted
tune returns a pick that meets the budget, labels every point, sorts and flags its table; "use this setting in
chat" changes the chat session's applied settings through the chat's own settings path; the chat's "Auto
(within budget)" says which setting it picked and why; Stop ends a tune early; a budget out of range is refused
with a message naming the box."""
from __future__ import annotations

import re
import time
from types import SimpleNamespace

import gradio as gr
import pytest

from app_helpers import SHIPPED, TUNE_EVAL
from pages import chat, sweep
from pages.chat import ChatSession
from pages.common import AppContext
from pages.sweep_tune import TuneSession
from pages.tuning import TuneBook

pytestmark = pytest.mark.slow
VISITOR = SimpleNamespace(cookies={"spice_owner": "ab" * 16}, session_hash="tune-test-page")
TUNE_CONFIRM = {"max_tokens": 16, "n_prompts": 1, "prompts": "chat", "max_settings": 1}


@pytest.fixture(scope="module", autouse=True)
def small_evaluation():
    import pages.tuning

    with pytest.MonkeyPatch.context() as mp:
        # A smaller evaluation than the app's (the page is under test, not the pick's statistics; the app's own
        # confirmation is tested in test_app_tune_chat_replies.py).
        mp.setattr(pages.tuning, "APP_EVAL", TUNE_EVAL)
        mp.setattr(pages.tuning, "APP_CONFIRM", TUNE_CONFIRM)
        yield


@pytest.fixture(scope="module")
def pages(small_evaluation):
    if not (SHIPPED / "config.json").exists():
        pytest.skip("the shipped model is not in assets/spice-mini")
    from spice_core.engine import SpiceEngine

    ctx = AppContext.create(SpiceEngine.load(None, device="cpu"))
    tunes = TuneBook()
    with gr.Blocks():
        sweep_page = sweep.build(ctx, tunes)
        chat_page = chat.build(ctx, tunes)
    return SimpleNamespace(ctx=ctx, sweep=sweep_page, chat=chat_page)


def _tune(page, ppl=1.0, agreement=0.9, session=None, on_line=None):
    session = session or TuneSession()
    d = page.defaults
    out = None
    for out in page.tune.run(ppl, agreement, d.cache_frac, d.profile, d.shape, session, request=VISITOR):
        if on_line is not None:
            on_line(out[0], session)
    return out, session


def test_a_budget_out_of_range_is_refused_naming_the_box(pages):
    for ppl, agreement, words in (("150", 0.9, "Perplexity increase at most (%)"), (1, 1.5, "Greedy agreement at least"),
                                  (None, "", "both boxes are empty"), ("x", 0.9, "not a number")):
        (status, *_rest), _ = _tune(pages.sweep, ppl, agreement)
        assert status.startswith("⚠ Tune not started") and words in status, status
        assert "Traceback" not in status


def test_budgeted_tune_meets_the_budget_and_its_pick_applies_to_the_chat(pages):
    started = time.perf_counter()
    (status, plot, table, pick, use), session = _tune(pages.sweep)
    took_s = time.perf_counter() - started
    assert status.startswith("Done"), status
    record = session.record
    assert record is not None and not record.stopped
    assert record.ppl_pct <= 1.0 + 1e-9 and record.agreement >= 0.9 - 1e-9, record
    assert record.setting["tau_approx"] <= 0.2          # a value the chat takes
    # Within the budget on replies as long as the chat's: exact, or confirmed there.
    assert record.reply_tokens == pages.sweep.tune.reply_tokens == 192 and record.within_budget_for(192)
    assert "settings measured:" in status and "exact" in status
    print(f"one tune of the shipped model in the app: {took_s:.0f} s ({len(record.trials)} settings)")

    # The plot: every point carries its setting as text; the pick is marked.
    import json
    figure = json.loads(plot.plot)
    labelled = [t for t in figure["data"] if t["name"] in ("within the budget", "outside the budget",
                                                            "not confirmed (short screening only)")]
    assert sum(len(t["x"]) for t in labelled) >= 2 and all(len(t["text"]) == len(t["x"]) for t in labelled)
    unlabelled = [x for t in labelled for x, label in zip(t["x"], t["text"]) if not label]
    assert unlabelled in ([], [record.speed_ms]), "only the pick's own point may leave its label to the star"
    star = next(t for t in figure["data"] if t["name"] == "★ pick")
    assert star["x"] == [record.speed_ms] and star["text"][0].startswith("★ pick: ")
    # The table: fastest first, each row flagged, the pick marked once and within the budget.
    speeds = list(table["ms / token"])
    assert speeds == sorted(speeds) and len(table) == len(record.trials)
    assert set(table["within budget"]) <= {"✓ yes (exact)", "✓ yes (held on replies)", "✗ no (failed on replies)",
                                           "✗ no (ruled out)", "? not confirmed", "✗ no"}
    picked = table[table[""] == "★ pick"]
    assert len(picked) == 1 and picked["within budget"].iloc[0].startswith("✓ yes")
    assert "Picked:" in pick and "Why:" in pick and record.reason in pick

    # "Use this setting in chat": handed to this visitor's chat page, applied when it loads.
    note, url = pages.sweep.tune.use_in_chat(session, request=VISITOR)
    assert url == "./" and "Opening the chat" in note
    chat_session = ChatSession()
    auto_note, _settings_note, _banner, stats, *controls = pages.chat.auto.adopt(chat_session, request=VISITOR)
    applied = chat_session.settings
    assert applied is not None and applied.policy == "spice"
    for name, value in record.setting.items():
        assert getattr(applied, name) == value, name
    assert f"τ<sub>approx</sub> {record.setting['tau_approx']:g}" in stats       # the numbers row says so
    assert controls[3]["value"] == record.setting["tau_approx"]                   # and the τ_approx slider
    assert "Picked:" in auto_note and "Why:" in auto_note
    # Handed over once: a reload changes nothing more.
    assert all(o is gr.skip() or o == gr.skip() for o in pages.chat.auto.adopt(ChatSession(), request=VISITOR))

    # The chat's Auto with the same budget, model, cache, profile and shape reuses the pick, and says why.
    other = ChatSession()
    *_lines, last = pages.chat.auto.auto(1.0, 0.9, "", other, request=VISITOR)
    assert "reused" in last[0] and record.reason in last[0], last[0]
    assert other.settings.tau_approx == record.setting["tau_approx"]


def test_a_stopped_chat_auto_leaves_the_settings_as_they_were(pages):
    """Regression (review): Stop in the chat's Auto still applied the best setting measured so far (the user's
    τ_prefetch 0.2 became 0.05), and said "no LoRE factors for the model". The stopped pick is shown, not applied."""
    session = ChatSession()
    lines = []
    for out in pages.chat.auto.auto(0.3, 0.97, "", session, request=VISITOR):
        lines.append(out[0])
        measured = re.match(r"Tuning: (\d+) of", str(out[0]))
        if measured and int(measured.group(1)) >= 2:       # a setting or two measured: there is a best so far
            session.auto.stop = True
    last = lines[-1]
    assert session.settings is None, "a stopped Auto changed the chat's settings"
    assert last.startswith("■ Auto stopped: your settings are unchanged") and "Picked:" in last, last
    assert "no LoRE factors" not in last
    assert pages.ctx.runner.wait_idle(30)


def test_stop_ends_a_tune_between_settings(pages):
    def stop_at_first_line(line, session):
        if line.startswith("Tuning"):
            session.stop = True

    # A budget of its own: not reused from the test above.
    started = time.perf_counter()
    (status, *_rest), session = _tune(pages.sweep, 0.5, 0.95, on_line=stop_at_first_line)
    assert time.perf_counter() - started < 60
    assert status.startswith(("Stopped early", "⚠ No pick")), status
    if session.record is not None:
        assert session.record.stopped and "stopped early" in session.record.reason
        assert pages.sweep.tunes.find(("", session.record.cache_frac, session.record.profile, session.record.shape,
                                       0.5, 0.95)) is None, "a stopped tune must not be reused"
    assert pages.ctx.runner.wait_idle(30)


def test_a_saved_pick_tuned_with_since_rebuilt_artifacts_is_not_offered(tmp_path):
    """The app offered a pick saved beside the model after `calibrate` rebuilt its draft heads and LoRE, quoting the
    old artifacts' measured quality; a pick of the current artifacts (or of unknown ones) is offered as before."""
    from types import SimpleNamespace

    from spice_core.api import RunSettings, TuneRecord, save_tuned, tuned_path

    def record(cache_frac, calibration):
        return TuneRecord(model="m", policy="spice", profile="rtx4090-pcie4x16", shape="deepseek-v2-lite",
                          cache_frac=cache_frac, budget={"ppl_pct": 1.0, "agreement": 0.9},
                          setting={"tau_approx": 0.05, "tau_prefetch": 0.2, "max_lookahead": 4, "lore_rank": 4,
                                   "cpu_lane": True}, speed_ms=1.0, speed_timing="modeled", ppl_pct=0.1,
                          agreement=0.95, quality_measured_on="t", reason="r", calibration=calibration)

    for frac, cal in ((0.25, "aaaaaaaaaaaaaaaa"), (0.5, "bbbbbbbbbbbbbbbb"), (0.75, "")):
        save_tuned(record(frac, cal), tuned_path(tmp_path))
    book = TuneBook()
    book.offer_saved("m", SimpleNamespace(model_dir=str(tmp_path), model_name="m", calibration="aaaaaaaaaaaaaaaa"))
    offered = {frac: book.saved_for("m", RunSettings(policy="spice", cache_frac=frac)) is not None
               for frac in (0.25, 0.5, 0.75)}
    assert offered == {0.25: True, 0.5: False, 0.75: True}


def test_raising_max_new_tokens_past_an_applied_picks_confirmation_warns():
    """Regression (review): after Auto applied a lossy pick confirmed on 16-token replies, raising Max new tokens to
    192 kept it without a word (the README promises a warning). The settings note warns while the pick's knobs are
    the chat's; moving one of them forgets the pick."""
    from spice_core.api import RunSettings, TuneRecord
    from pages import tuning

    record = TuneRecord(model="m", policy="spice", profile="rtx4090-pcie4x16", shape="deepseek-v2-lite",
                        cache_frac=0.25, budget={"ppl_pct": 1.0, "agreement": 0.9},
                        setting={"tau_approx": 0.1, "tau_prefetch": 0.2, "max_lookahead": 4, "lore_rank": 2,
                                 "cpu_lane": True}, speed_ms=1.0, speed_timing="modeled", ppl_pct=0.1,
                        agreement=0.95, quality_measured_on="t", reason="r", confirmed=True, reply_tokens=16)
    session = ChatSession()
    session.auto.applied = record
    picked = RunSettings(policy="spice", tau_approx=0.1, lore_rank=2, max_new_tokens=16)
    assert tuning.in_use_caveat(session, picked) == ""
    longer = tuning.in_use_caveat(session, RunSettings(**{**picked.__dict__, "max_new_tokens": 192}))
    assert "Not known to be within the budget" in longer and "confirmed on replies of 16 tokens" in longer
    assert "Press Auto again" in longer
    moved = RunSettings(**{**picked.__dict__, "max_new_tokens": 192, "tau_approx": 0.05})
    assert tuning.in_use_caveat(session, moved) == "" and session.auto.applied is None
