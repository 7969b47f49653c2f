"""The sweep's Tokens per run in a real browser (the fake engine): a number typed into its box that the box does not
take is said under its label, with the value the box went to, which is the one a sweep then runs with. Regression:
the browser brought it into range without a word.

Waits are for the page's own state, never for a fixed time."""
from __future__ import annotations

import pytest

from sweep_browser import WAIT_MS, SweepBox

expect = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed").expect
pytestmark = pytest.mark.browser


def test_a_tokens_count_the_box_does_not_take_is_said_under_the_slider_and_swept_at_the_value_it_went_to(browser,
                                                                                                          served):
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    try:
        tokens = SweepBox(page, served.url, "sweep-tokens")
        expect(tokens.slider).to_contain_text("4 to 128 here")
        tokens.says_it_went(expect, "500", "Tokens per run=500 is out of range: use a value from 4 to 128", "128")
        tokens.says_it_went(expect, "7.5", "Tokens per run=7.5 must be a whole number from 4 to 128", "8")
        tokens.leave("12")       # a number it takes: the slider's own line comes back
        expect(tokens.slider).to_contain_text("4 to 128 here", timeout=WAIT_MS)
    finally:
        page.close()


@pytest.mark.parametrize("typed, said, runs_at", [("2", "Tokens per run=2 is out of range", 4),
                                                  ("7.5", "Tokens per run=7.5 must be a whole number", 8)])
def test_a_sweep_started_straight_from_the_tokens_box_runs_at_the_value_its_note_gives(browser, served, typed, said,
                                                                                      runs_at):
    """Typed, then a click on Run: the click leaves the box, and the sweep runs at the value the note says the box
    went to. Regression: 7.5 was said to go to 8, and the sweep refused 7.5 (the click sent it before the box's
    update landed)."""
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    try:
        tokens = SweepBox(page, served.url, "sweep-tokens")
        runs = tokens.sweep_typed(expect, served.engine, typed, said)
        assert runs and {g.settings_log[0][1].max_new_tokens for g in runs} == {runs_at}
    finally:
        page.close()
