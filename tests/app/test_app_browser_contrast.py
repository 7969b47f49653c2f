"""Secondary text is readable (issue 24, defect 10, its contrast part): card labels and their lines, the
numbers row's head, the settings note and the navigation's links measure at least WCAG AA's 4.5:1 against
what lies behind them, light and dark, in a real browser on the real engine (they measured 2.45-2.56:1 in
light mode and the timing label 3.24:1 in dark)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser

MEASURE_JS = """(selectors) => {
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
                               return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
  const behind = (el) => { for (let p = el; p; p = p.parentElement) { const b = getComputedStyle(p).backgroundColor;
                             const v = rgb(b); if (v.length >= 3 && (v.length < 4 || v[3] > 0.5)) return v; }
                           return [255, 255, 255]; };
  const out = [];
  for (const sel of selectors) {
    for (const el of Array.from(document.querySelectorAll(sel)).slice(0, 3)) {
      if (!el.innerText.trim() || !el.offsetParent) continue;
      const a = lum(rgb(getComputedStyle(el).color)), b = lum(behind(el));
      out.push([sel, el.innerText.trim().slice(0, 24), (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)]);
    }
  }
  return out;
}"""
SELECTORS = [".spice-stats .card .k", ".spice-stats .card .s", ".spice-stats .head", ".spice-stats .head .timing",
             "#spice-settings-note", ".nav-holder a"]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_secondary_text_meets_wcag_aa(browser, shipped_served, scheme):
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, color_scheme=scheme)
    page.set_default_timeout(60_000)
    page.goto(shipped_served.url + ("?__theme=dark" if scheme == "dark" else ""), wait_until="load")
    page.locator("#spice-msg textarea").fill("Tell me a story about a cat and a ball.")
    page.locator("#spice-msg textarea").press("Enter")
    page.wait_for_function("() => (document.querySelector('#spice-stats') || {}).innerText.includes('TPOT')",
                           timeout=60_000)
    found = page.evaluate(MEASURE_JS, SELECTORS)
    assert {sel for sel, _, _ in found} >= set(SELECTORS) - {".spice-stats .head .timing"}, found
    low = [(sel, text, round(ratio, 2)) for sel, text, ratio in found if ratio < 4.5]
    assert not low, low
    page.close()


def test_the_message_box_has_a_name_and_a_focused_range_shows_a_ring(browser, shipped_served):
    """Regression (issue 24, defect 10): the message box was named "Textbox"; range sliders showed no focus."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(shipped_served.url, wait_until="load")
    box = page.locator("#spice-msg textarea")
    box.wait_for(state="visible")
    name = box.evaluate("(el) => el.getAttribute('aria-label') || (el.labels && el.labels[0] && el.labels[0].innerText)")
    assert name == "Message", name
    page.locator("#ctl-cache input[type=number]").focus()
    for _ in range(3):                                       # from its box (past ↺) to its range, by keyboard
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.type") == "range":
            break
    style = page.evaluate("() => { const el = document.activeElement; const cs = getComputedStyle(el);"
                          " return [el.type, cs.outlineStyle, cs.outlineWidth]; }")
    assert style[0] == "range" and style[1] != "none" and style[2] != "0px", style
    page.close()
