"""The tuner from a visitor's browser, on the real engine (issue 25, item 3): on the sweep page a budget out of
range is refused in words; a budgeted tune of the shipped model runs with progress and Stop in the place of its
button, ends within a bounded time, labels every point of its plot and flags its table; "Use this setting in
chat" opens the chat with the pick applied (the numbers row and the side bar say so), and the next reply runs
with it. Waits for states, never for a machine's speed: the timeouts only bound a hung page."""
from __future__ import annotations

import re
import time

import pytest

from page_js import text_js

pytestmark = pytest.mark.browser

TUNE_TIMEOUT_S = 900      # one tune measured 95-160 s on a loaded 2-core machine; this bounds a hung one
REPLY_TIMEOUT_S = 300
REPLY_TOKENS = 16


def _text(page, selector: str) -> str:
    return page.evaluate(f"() => (document.querySelector({selector!r}) || {{}}).innerText || ''")


def _until(page, js: str, timeout_s: float, what: str) -> None:
    try:
        page.wait_for_function(js, timeout=timeout_s * 1000, polling=200)
    except Exception:   # noqa: BLE001 - say what the page showed instead
        raise AssertionError(f"{what} never happened; tune status {_text(page, '#tune-status')!r}, "
                             f"numbers row {_text(page, '#spice-stats')!r}") from None


def _has(selector: str, text: str) -> str:
    return f"() => {text_js(selector)}.includes({text!r})"


def test_a_budgeted_tune_applies_its_pick_to_the_chat_and_the_next_reply_runs_with_it(browser, shipped_served,
                                                                                     monkeypatch):
    import pages.tuning
    from app_helpers import SHIPPED, TUNE_EVAL
    # A smaller evaluation than the app's (the page is under test, not the pick's statistics; the app's own
    # confirmation is tested in test_app_tune_chat_replies.py).
    monkeypatch.setattr(pages.tuning, "APP_EVAL", TUNE_EVAL)
    monkeypatch.setattr(pages.tuning, "APP_CONFIRM", {"max_tokens": 16, "n_prompts": 1, "prompts": "chat",
                                                      "max_settings": 1})
    if not (SHIPPED / "config.json").exists():
        pytest.skip("the shipped model is not in assets/spice-mini: this test is for the real engine")
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(60_000)
    page = context.new_page()
    page.goto(shipped_served.url + "sweep", wait_until="load")
    page.locator("#tune-run").wait_for(state="visible")
    ppl = page.locator("#tune-ppl input")
    assert ppl.input_value() == "1" and page.locator("#tune-agreement input").input_value() == "0.9"
    assert "Tell me" not in _text(page, "#sweep-prompts") and "Once upon a time" in \
        page.locator("#sweep-prompts textarea").input_value()
    assert page.locator("#sweep-ta textarea").input_value() == "0, 0.05, 0.1, 0.2"

    # A budget out of range: refused in words, nothing runs.
    ppl.fill("150")
    page.locator("#tune-run").click()
    _until(page, _has("#tune-status", "Tune not started"), 60, "the refusal")
    assert "out of range" in _text(page, "#tune-status") and "Traceback" not in page.content()
    ppl.fill("1")

    # The tune: Stop shows in the place of the button while it runs, progress is shown, it ends.
    started = time.monotonic()
    page.locator("#tune-run").click()
    _until(page, "() => document.body.classList.contains('spice-tuning')", 30, "Stop showing")
    assert page.locator("#tune-stop").is_visible() and not page.locator("#tune-run").is_visible()
    _until(page, _has("#tune-status", "settings measured"), 120, "progress")
    _until(page, f"() => {text_js('#tune-status')}.match(/^(Done|⚠)/)",
           TUNE_TIMEOUT_S, "the tune's end")
    took_s = time.monotonic() - started
    status = _text(page, "#tune-status")
    assert status.startswith("Done") and "within the budget" in status, status
    _until(page, "() => !document.body.classList.contains('spice-tuning')", 30, "the button coming back")
    print(f"a tune in the browser: {took_s:.0f} s")

    # Every point labelled on the plot (text, not hover), the pick marked; the table flagged, fastest first.
    page.locator("#tune-pareto .js-plotly-plot").wait_for()
    labels = page.evaluate("() => [...document.querySelectorAll('#tune-pareto .textpoint')].map(t => t.textContent)")
    assert any(t.startswith("★ pick") for t in labels), labels
    assert len([t for t in labels if t.startswith(("τa", "exact"))]) >= 2, labels
    _until(page, _has("#tune-table", "★ pick"), 30, "the table's pick")
    table = _text(page, "#tune-table")
    assert "✓ yes" in table and "within budget" in table, table
    pick = _text(page, "#tune-pick")
    assert "Picked:" in pick and "Why:" in pick, pick
    tau = float(re.search(r"τ_approx ([0-9.]+)", pick).group(1))
    assert 0 <= tau <= 0.2

    # Use it in the chat: the chat page opens with the pick applied through its own settings path.
    page.locator("#tune-use").click()
    page.wait_for_url(re.compile(r"/(\?.*)?$"), timeout=60_000)
    page.locator("#spice-msg textarea").wait_for(state="visible")
    _until(page, _has("#spice-stats", f"approx {tau:g}"), 60, "the numbers row showing the pick")
    _until(page, _has("#ctl-auto-note", "Why:"), 30, "the side bar saying why")
    assert page.locator("#ctl-tau-approx input[type=number]").input_value() == f"{tau:g}"

    # The next reply runs with it (a short one: "Max new tokens" set on the page, as a person does; nothing of
    # the pick's).
    page.get_by_role("button", name="Timing model and generation").click()
    max_new = page.locator("#ctl-max-new input[type=number]")
    max_new.wait_for(state="visible")
    max_new.click()
    max_new.press("Control+A")
    max_new.press_sequentially(str(REPLY_TOKENS))
    max_new.press("Enter")
    runs_before = {s.run_id for s in shipped_served.engine.list_runs()}
    page.fill("#spice-msg textarea", "Tell me a story about a cat and a ball.")
    page.press("#spice-msg textarea", "Enter")
    _until(page, "() => document.body.classList.contains('spice-generating')", 30, "the reply starting")
    _until(page, "() => !document.body.classList.contains('spice-generating')", REPLY_TIMEOUT_S, "the reply's end")
    stats = _text(page, "#spice-stats")
    assert f"approx {tau:g}" in stats and "Next message" not in stats, stats
    new = [s for s in shipped_served.engine.list_runs() if s.run_id not in runs_before]
    assert len(new) == 1 and new[0].policy == "spice" and 0 < new[0].n_tokens <= REPLY_TOKENS
    if tau > 0:
        assert new[0].miss_split.get("approx", 0) > 0, new[0].miss_split    # it approximated: lossy, as tuned
    context.close()
