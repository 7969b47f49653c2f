"""Typed settings in a real browser, on the real engine: a value applies when its box is done with.

A slider's number box takes typing key by key; the value applies when the box is left (Tab), on Enter, or
when the slider is let go or moved with an arrow key, never at each key (on the way to "1.5" the box holds
"1", a valid value that used to apply). A number beyond the slider's range is refused with a note naming
the control and the range, and the numbers row keeps saying what is in use.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


def _box(page, elem_id: str):
    return page.locator(f"#{elem_id} input[type=number]")


def _note(page) -> str:
    return page.locator("#spice-settings-note").inner_text()


def _head(page) -> str:
    return page.locator("#spice-stats").inner_text()


def _type(page, elem_id: str, value: str, then: str = "Enter") -> None:
    """Select the box's number and type ``value`` key by key, as a person does, then ``then``."""
    box = _box(page, elem_id)
    box.click()
    box.press("Control+A")
    box.press_sequentially(value, delay=60)
    box.press(then)


def _until(page, js: str, timeout_s: float = 20.0) -> None:
    try:
        page.wait_for_function(js, timeout=timeout_s * 1000, polling=100)
    except Exception:   # noqa: BLE001 - say what the page showed instead
        raise AssertionError(f"never true: {js}\nnote {_note(page)!r}\nhead {_head(page)!r}") from None


def _note_has(page, text: str) -> None:
    _until(page, f"() => document.querySelector('#spice-settings-note').innerText.includes({text!r})")


def _head_has(page, text: str) -> None:
    _until(page, f"() => document.querySelector('#spice-stats').innerText.includes({text!r})")


def test_typed_values_apply_when_done_and_out_of_range_ones_are_refused(browser, shipped_served):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    page.goto(shipped_served.url, wait_until="load")
    page.locator("#spice-msg textarea").wait_for(state="visible")
    assert _box(page, "ctl-cache").input_value() == "0.25"

    # Within the slider's range, then Enter: applies; the numbers row says what the next message uses.
    _type(page, "ctl-tau-approx", "0.05")
    _head_has(page, "approx 0.05")
    # Beyond the slider (the engine itself would take it): refused, with the slider's range.
    _type(page, "ctl-tau-approx", "0.9")
    _note_has(page, "Not applied")
    assert "τ_approx" in _note(page) and "[0, 0.2]" in _note(page), _note(page)
    assert "approx 0.05" in _head(page), _head(page)

    # Key by key, "1.5" passes through "1", a valid value: only the finished number counts, and it is refused.
    _type(page, "ctl-cache", "1.5")
    _note_has(page, "cache_frac=1.5")
    assert "cache 25%" in _head(page), f"a key on the way applied: {_head(page)}"

    # Cleared with Backspace and typed again, then left with Tab: the box shows what was typed, and it applies.
    box = _box(page, "ctl-cache")
    box.click()
    box.press("Control+A")
    box.press("Backspace")
    box.press_sequentially("0.75", delay=60)
    box.press("Tab")
    _head_has(page, "cache 75%")
    assert box.input_value() == "0.75", box.input_value()

    # From the keyboard on the slider itself: an arrow key applies a step.
    page.locator("#ctl-cache input[type=range]").focus()
    page.keyboard.press("ArrowLeft")
    _head_has(page, "cache 70%")
    page.close()
