"""Accessibility on the shipped model in a real browser (issue 24, defect 10). Secondary text is readable: card
labels and their lines, the numbers row's head, the settings note and the navigation's links measure at least
WCAG AA's 4.5:1 against what lies behind them, light and dark (they measured 2.45-2.56:1 in light mode and the
timing label 3.24:1 in dark). The message box has a name, a focused range a ring, and heatmap outcomes that
colour-blind eyes see alike carry different marks. One app serves every test here (it takes 10-20 s to start)."""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from app_helpers import close, serve_shipped
from page_js import text_js

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def shipped_served():
    served = serve_shipped()
    yield served
    close(served)


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
    page.wait_for_function(f"() => {text_js('#spice-stats')}.includes('TPOT')",
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


# Machado, Oliveira and Fernandes (2009), full severity, on linear RGB.
CVD = {"deuteranopia": np.array([[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                                 [-0.011820, 0.042940, 0.968881]]),
       "protanopia": np.array([[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
                               [-0.003882, -0.048116, 1.051998]]),
       "normal vision": np.eye(3)}
LIKE_DELTA_E = 25        # CIE76 distance under which two 10 px cells pass for one colour


def _lab(hex_colour: str, vision: str) -> np.ndarray:
    srgb = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    rgb = np.where(srgb <= 0.04045, srgb / 12.92, ((srgb + 0.055) / 1.055) ** 2.4)
    rgb = np.clip(CVD[vision] @ rgb, 0, 1)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ rgb
    f = lambda t: np.where(t > 0.008856, np.cbrt(t), 7.787 * t + 16 / 116)     # noqa: E731
    fx, fy, fz = f(xyz / np.array([0.95047, 1.0, 1.08883]))
    return np.array([116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)])


# What the page drew: the heatmap's colour per outcome code (its colour scale's stops), its legend, each cell of
# "this token" as [outcome, the mark's symbol over it or ""], how many marks the SVG holds over that grid, and each
# lane-chart trace's hatching.
DRAWN_JS = """() => {
  const heat = document.querySelector('#spice-heatmap .js-plotly-plot');
  const lanes = document.querySelector('#spice-gantt .js-plotly-plot');
  const [grid, , marks] = heat.data;
  const symbol = (k) => (Array.isArray(marks.marker.symbol) ? marks.marker.symbol[k] : marks.marker.symbol);
  const at = Object.fromEntries(marks.x.map((x, k) => [`${marks.y[k]}/${x}`, symbol(k)]));
  return {scale: grid.colorscale.filter((_, i) => i % 2 === 0).map(([_, c]) => c),
          legend: [...heat.querySelectorAll('.legendtext')].map((t) => t.textContent),
          cells: grid.text.flatMap((row, i) => row.map((name, j) => [name, at[`${grid.y[i]}/${j}`] || ''])),
          drawn: heat.querySelectorAll('.scatterlayer .trace')[0].querySelectorAll('.point').length,
          bars: Object.fromEntries(lanes.data.map((d) => [d.name, ((d.marker || {}).pattern || {}).shape || '']))};
}"""


def test_outcomes_that_colour_blind_eyes_see_alike_carry_different_marks(browser, shipped_served):
    """Regression (issue 24, defect 10): under deuteranopia hit and approximated cells (green, reddish purple)
    and CPU and copied ones (orange, vermillion) were one colour each, 10 px wide, with nothing else to tell
    them apart; so were the lane chart's routed experts and LoRE surrogates."""
    from pages.figures import CATEGORIES, OUTCOME_MARKS, SHORT_OUTCOMES

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    page.goto(shipped_served.url, wait_until="load")
    page.get_by_text("Timing model and generation").click()
    for box, value in (("#ctl-max-new", "12"), ("#ctl-tau-approx", "0.1")):       # a short reply, approximated
        page.locator(f"{box} input[type=number]").fill(value)
        page.locator(f"{box} input[type=number]").press("Tab")          # applied with the message it sends
    page.locator("#spice-msg textarea").fill("Tell me a story about a cat and a ball.")
    page.locator("#spice-msg textarea").press("Enter")
    page.wait_for_function(f"() => {text_js('#spice-chat')}.includes('TPOT')",
                           timeout=120_000)
    drawn = page.evaluate(DRAWN_JS)
    page.close()
    # An outcome's mark is its legend entry's first word when that is one character (the legend lists the
    # outcomes in code order); the cells draw it as the marker symbol OUTCOME_MARKS pairs with that character.
    legend = dict(zip(CATEGORIES, drawn["legend"]))
    marks = {name: (label.split()[0] if len(label.split()[0]) == 1 else "") for name, label in legend.items()}
    colours = {name: c for name, c in zip(CATEGORIES, drawn["scale"]) if re.fullmatch(r"#[0-9A-Fa-f]{6}", c)}
    alike = [(a, b, vision) for (a, ca), (b, cb) in itertools.combinations(colours.items(), 2) for vision in CVD
             if np.linalg.norm(_lab(ca, vision) - _lab(cb, vision)) < LIKE_DELTA_E]
    assert {(a, b) for a, b, _ in alike} >= {("hit", "approx"), ("cpu", "copy")}, alike   # what the marks are for
    assert not [(a, b, vision) for a, b, vision in alike if marks[a] == marks[b]], (alike, marks)
    # Each cell carries its outcome's mark, and the SVG draws them (this reply approximated some experts).
    symbol_of = {char: symbol for char, symbol in OUTCOME_MARKS.values()}
    by_name = dict(zip(SHORT_OUTCOMES, CATEGORIES))
    wrong = [(name, symbol) for name, symbol in drawn["cells"]
             if name and symbol != symbol_of.get(marks[by_name[name]], "")]
    assert not wrong, wrong[:5]
    marked = sum(1 for name, symbol in drawn["cells"] if symbol)
    assert marked and drawn["drawn"] == marked and any(name == "approx" for name, _ in drawn["cells"]), drawn["cells"]
    assert drawn["bars"].get("LoRE surrogate") and not drawn["bars"].get("routed expert"), drawn["bars"]
