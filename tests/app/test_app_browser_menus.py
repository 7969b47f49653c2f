"""The chat's menus and checkbox apply from the page (regression: every change of Policy, LoRE rank, CPU lane,
Hardware profile or Model shape raised a NameError in its handler since the settings events moved to
pages/chat_settings.py: the note said "Error", the menu showed the new choice and replies ran on the old one; the
/settings API, which every other test used, takes another path)."""
from __future__ import annotations

import pytest

from page_js import text_js

pytestmark = pytest.mark.browser


def _until(page, js: str, what: str, timeout_s: float = 20.0) -> None:
    try:
        page.wait_for_function(js, timeout=timeout_s * 1000, polling=100)
    except Exception:   # noqa: BLE001 - say what the page showed instead
        raise AssertionError(f"{what}: note {page.inner_text('#spice-settings-note')!r}, "
                             f"numbers {page.inner_text('#spice-stats')!r}") from None


def test_a_policy_picked_and_the_cpu_lane_unticked_apply_and_the_reply_runs_on_them(browser, shipped_served):
    served = shipped_served         # the real engine on the shipped model (the fake where it is absent)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(30_000)
    errors = []
    page.on("response", lambda r: errors.append(r.url) if r.status >= 500 else None)
    try:
        page.goto(served.url, wait_until="load")
        page.wait_for_selector("#spice-msg textarea")
        stats = text_js("#spice-stats")
        assert "CPU lane on" in page.inner_text("#spice-stats")

        page.click("#ctl-policy input")
        page.click("#ctl-policy [role=option]:has-text('SPICE without LoRE')")   # a policy with a CPU lane
        _until(page, f"() => {stats}.includes('SPICE without LoRE')", "the policy picked never applied")
        page.click("#ctl-cpu input[type=checkbox]")
        _until(page, f"() => {stats}.includes('CPU lane off')", "the unticked CPU lane never applied")
        assert "Error" not in page.inner_text("#spice-settings-note")
        assert not errors, errors

        page.locator("#spice-msg textarea").fill("Tell me a story about a cat.")
        page.locator("#spice-msg textarea").press("Enter")
        page.wait_for_function("() => document.body.classList.contains('spice-generating')", timeout=10_000,
                               polling=50)
        _until(page, "() => !document.body.classList.contains('spice-generating')", "the reply never ended", 240)
        head = page.inner_text("#spice-stats")
        assert "SPICE without LoRE" in head and "CPU lane off" in head, head
    finally:
        page.close()
