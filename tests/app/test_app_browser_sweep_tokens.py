"""The sweep's Tokens per run in a real browser (the fake engine): a number typed into its box that the box does not
take is said under its label, with the value the box went to, which is the one a sweep then runs with. Regression:
the browser brought it into range without a word.

Waits are for the page's own state, never for a fixed time."""
from __future__ import annotations

import pytest

expect = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed").expect
pytestmark = pytest.mark.browser
NUMBER = "#sweep-tokens input[type=number]"
WAIT_MS = 20_000


def _leave(page, value: str, by: str) -> None:
    """Write ``value`` into the tokens box, then leave it: Tab, or a click on the element ``by`` names."""
    box = page.locator(NUMBER)
    box.fill(value)
    if by == "Tab":
        box.press("Tab")
    else:
        page.locator(by).click()


def test_a_tokens_count_the_box_does_not_take_is_said_under_the_slider_and_swept_at_the_value_it_went_to(browser,
                                                                                                          served):
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    try:
        page.goto(served.url.rstrip("/") + "/sweep", wait_until="load")
        tokens, box = page.locator("#sweep-tokens"), page.locator(NUMBER)
        box.wait_for(state="visible")
        expect(tokens).to_contain_text("4 to 128 here")
        for typed, said, went in (("500", "Tokens per run=500 is out of range: use a value from 4 to 128", "128"),
                                  ("7.5", "Tokens per run=7.5 must be a whole number from 4 to 128", "8")):
            _leave(page, typed, "Tab")
            expect(tokens).to_contain_text(said, timeout=WAIT_MS)
            expect(tokens).to_contain_text(f"The box went to {went}.", timeout=WAIT_MS)
            expect(box).to_have_value(went, timeout=WAIT_MS)
        _leave(page, "12", "Tab")       # a number it takes: the slider's own line comes back
        expect(tokens).to_contain_text("4 to 128 here", timeout=WAIT_MS)
        # Typed and straight on to Run: the click leaves the box, and the sweep runs at the value the note gives.
        page.locator("#sweep-prompts textarea").fill("Once upon a time")
        for policy in ("spice_prefetch", "spice"):
            page.locator("#sweep-policies label", has_text=policy).first.click()       # untick: lru stays
        before = len(served.engine.generations)
        _leave(page, "2", "#sweep-run")
        expect(tokens).to_contain_text("Tokens per run=2 is out of range", timeout=WAIT_MS)
        expect(page.locator("#sweep-status")).to_contain_text("Done", timeout=60_000)
        runs = served.engine.generations[before:]
        assert runs and {g.settings_log[0][1].max_new_tokens for g in runs} == {4}
    finally:
        page.close()
