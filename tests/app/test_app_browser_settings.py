"""Typed settings in a real browser, on the real engine: what a box shows is what the next reply uses.

A slider's number box takes any typed number. One outside the slider's range (or the setting's) is refused
with a note naming the control, and the box goes back to the value in use at once: left in the box, the
browser would clamp it to the slider's end on the next change and apply that without a word.
"""
from __future__ import annotations

import pytest

from app_helpers import ROOT, serve
from fake_engine import FakeEngine

pytestmark = pytest.mark.browser

SHIPPED = ROOT / "assets" / "spice-mini"


@pytest.fixture
def app_server():
    if (SHIPPED / "config.json").exists():
        from spice_core.engine import SpiceEngine
        served = serve(SpiceEngine.load(None, device="cpu"))
    else:
        served = serve(FakeEngine(token_delay_s=0.02))
    yield served
    served.demo.close()
    served.ctx.exports.cleanup()


def _box(page, elem_id: str):
    return page.locator(f"#{elem_id} input[type=number]")


def _type(page, elem_id: str, value: str) -> None:
    box = _box(page, elem_id)
    box.fill(value)
    box.press("Enter")


def _until(page, js: str, timeout_s: float = 20.0) -> None:
    page.wait_for_function(js, timeout=timeout_s * 1000, polling=100)


def _note(page) -> str:
    return page.locator("#spice-settings-note").inner_text()


def test_a_refused_typed_value_goes_back_and_is_never_applied_later(browser, app_server):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    page.goto(app_server.url, wait_until="load")
    page.locator("#spice-msg textarea").wait_for(state="visible")
    cache_before = _box(page, "ctl-cache").input_value()
    approx_before = _box(page, "ctl-tau-approx").input_value()

    # Within the slider's range: taken, and the next message will use it.
    _type(page, "ctl-tau-approx", "0.05")
    _until(page, "() => document.querySelector('#spice-settings-note').innerText.length > 0 && "
                 "!document.querySelector('#spice-settings-note').innerText.includes('Not applied')")
    # Beyond the slider (the setting itself would allow it): refused, and the box shows 0.05 again.
    _type(page, "ctl-tau-approx", "0.9")
    _until(page, "() => document.querySelector('#spice-settings-note').innerText.includes('Not applied')")
    assert "τ_approx" in _note(page) and "slider" in _note(page), _note(page)
    _until(page, "() => document.querySelector('#ctl-tau-approx input[type=number]').value === '0.05'")
    # Beyond the setting's own range: refused, the box goes back.
    _type(page, "ctl-cache", "5")
    _until(page, "() => document.querySelector('#spice-settings-note').innerText.includes('GPU cache size')")
    _until(page, f"() => document.querySelector('#ctl-cache input[type=number]').value === {cache_before!r}")
    assert "Not applied" in _note(page), _note(page)

    # Another change later applies the values the boxes show, not the refused ones clamped: the numbers row
    # says what the next message uses.
    page.locator("#ctl-cpu input[type=checkbox]").click()
    _until(page, "() => !document.querySelector('#spice-settings-note').innerText.includes('Not applied')")
    assert _box(page, "ctl-cache").input_value() == cache_before
    assert _box(page, "ctl-tau-approx").input_value() == "0.05" != approx_before
    head = page.locator("#spice-stats").inner_text()
    assert f"cache {float(cache_before):.0%}" in head and "approx 0.05" in head, head
    page.close()
