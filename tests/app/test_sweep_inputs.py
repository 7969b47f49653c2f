"""The sweep's inputs: its threshold lists take the engine's range for each threshold (spice_core.api.SETTING_RANGES,
the one source that RunSettings checks too), and a number typed into Tokens per run's box that the box does not take
is said under its label, with the value the box went to (as GPU cache size's is: test_sweep_cache.py).

Regressions: the lists' range was a literal [0, 1] of the page's own, beside the engine's literal [0, 1] in
RunSettings; Tokens per run's box was brought into range by the browser without a word."""
from __future__ import annotations

import inspect
from types import MappingProxyType

import gradio as gr
import pytest

from fake_engine import FakeEngine
from pages.common import AppContext
from pages.limits import SLIDER_RANGES, slider_ranges
from pages.sweep import SweepPage
from pages.sweep_inputs import TypedData, parse_values, values_range
from pages.sweep_run import SweepSession
from spice_core import config
from spice_core.api import SETTING_RANGES, RunSettings
from spice_core.errors import ConfigError

THRESHOLDS = {"tau_prefetch": "τ_prefetch", "tau_approx": "τ_approx"}


def _page() -> SweepPage:
    page = SweepPage(AppContext.create(FakeEngine(token_delay_s=0)))
    with gr.Blocks():
        page.build()
    return page


@pytest.mark.parametrize("field", THRESHOLDS)
def test_a_threshold_list_takes_the_engines_range_and_says_it(field):
    low, high = SETTING_RANGES[field]
    assert parse_values(f"{high}, {low}", field) == [low, high]
    for bad in (low - 0.5, high + 0.5):
        with pytest.raises(ConfigError, match=rf"{THRESHOLDS[field]}={bad:g} is out of range: use values in "
                                              rf"\[{low:g}, {high:g}\]"):
            parse_values(str(bad), field)
        with pytest.raises(ConfigError, match=f"{field}={bad!r} is out of range"):
            RunSettings(**{field: bad})
    box = {"tau_prefetch": _page().tau_prefetch, "tau_approx": _page().tau_approx}[field]
    assert box.info.endswith(f"each from {low:g} to {high:g}"), box.info


def test_the_threshold_lists_read_the_engines_range_where_they_check_it(monkeypatch):
    """One source: the range table changed is the sweep's range changed (and RunSettings'). The engine's table is
    read-only and shared by every test, so a narrowed copy is handed to the lists (their table defaults to the
    engine's) and put in place of config's module attribute for RunSettings; the shared table is never written."""
    narrowed = MappingProxyType({**SETTING_RANGES, "tau_approx": (0.0, 0.5)})
    assert inspect.signature(parse_values).parameters["ranges"].default is SETTING_RANGES
    assert inspect.signature(values_range).parameters["ranges"].default is SETTING_RANGES
    with pytest.raises(ConfigError, match=r"τ_approx=0.6 is out of range: use values in \[0, 0.5\]"):
        parse_values("0.1, 0.6", "tau_approx", narrowed)
    assert values_range("tau_approx", narrowed) == "each from 0 to 0.5"
    monkeypatch.setattr(config, "SETTING_RANGES", narrowed)
    with pytest.raises(ConfigError, match=r"tau_approx=0.6 is out of range: use a value in \[0.0, 0.5\]"):
        RunSettings(tau_approx=0.6)
    assert SETTING_RANGES["tau_approx"] == (0.0, 1.0)


def test_the_chats_sliders_offer_no_more_than_the_engine_takes():
    assert set(SLIDER_RANGES) <= set(SETTING_RANGES)
    for name, (low, high, _step) in slider_ranges(FakeEngine().info()).items():
        if name in SETTING_RANGES:
            assert SETTING_RANGES[name][0] <= low <= high <= SETTING_RANGES[name][1], name


@pytest.mark.parametrize("typed, went, said", [
    (500, 128, "Tokens per run=500 is out of range: use a value from 4 to 128"),
    ("1e9", 128, "Tokens per run=1e9 is out of range: use a value from 4 to 128"),
    (0, 4, "Tokens per run=0 is out of range: use a value from 4 to 128"),
    (12.5, 13, "Tokens per run=12.5 must be a whole number from 4 to 128"),
    ("nan", 4, "Tokens per run=nan is out of range: use a value from 4 to 128"),
    (None, 4, "Tokens per run: the box is empty; use a value from 4 to 128"),
])
def test_a_number_the_tokens_box_does_not_take_is_said_under_its_label(typed, went, said):
    page = _page()
    update = page.on_tokens_typed(TypedData(page.max_new_tokens, typed))
    assert update["value"] == went and update["info"] == f"⚠ {said}. The box went to {went}.", update


def test_a_number_the_tokens_box_takes_brings_its_own_line_back():
    page = _page()
    assert page.max_new_tokens.info == page.tokens_info == "tokens each run generates; 4 to 128 here"
    for typed in (4, 24, "64", 128.0):
        assert page.on_tokens_typed(TypedData(page.max_new_tokens, typed)) == gr.update(info=page.tokens_info)


def test_a_sweep_of_a_tokens_count_the_box_does_not_take_is_refused_in_the_notes_words():
    page = _page()
    gen = page.run("one prompt", ["lru"], "0.2", "0", 0.25, 500, "rtx4090-pcie4x16", "deepseek-v2-lite",
                   SweepSession(), lambda *a, **k: None)
    status = next(gen)[0]
    gen.close()
    assert status == "⚠ Sweep not started: Tokens per run=500 is out of range: use a value from 4 to 128", status
    assert page.ctx.engine.generations == []


def _plan(prompts="a\nb", policies=("spice",), tp="0.2", ta="0.05", **kw):
    from pages.limits import Limits
    from pages.sweep_inputs import plan_sweep

    info = FakeEngine(token_delay_s=0).info()
    return plan_sweep(info, Limits(), RunSettings(), 2048, prompts, list(policies), tp, ta, kw.get("cache_frac", 0.25),
                      kw.get("tokens", 8), "rtx4090-pcie4x16", "deepseek-v2-lite")


def test_a_sweep_too_large_is_refused_before_its_grid_is_built(monkeypatch):
    """Regression (review): 1,200 values in each τ box (22 kB) built a 1.44-million-setting grid on the engine's queue,
    53 s, before the size check refused it; the cost grows with the square of the values."""
    from pages import sweep_inputs

    def no_grid(*_a, **_k):
        raise AssertionError("the grid was built before the size was checked")

    monkeypatch.setattr(sweep_inputs, "grid", no_grid)
    values = ", ".join(f"{i / 10_000:.4f}" for i in range(1, 1201))
    with pytest.raises(ConfigError, match=r"it would make at least 2,880,000 runs \(1,440,000 settings × 2 prompts\); "
                                          r"the limit is 120"):
        _plan(tp=values, ta=", ".join(f"{i / 10_000:.4f}" for i in range(1, 1201)).replace("0.1200", "0.0000"))


def test_sweep_inputs_an_api_client_could_send_by_mistake_are_refused_by_name():
    """Regression (review): a list for Prompts ran as the one literal prompt "['a', 'b']", "0_1" was read as 1.0, and
    a policy ticked twice counted twice."""
    with pytest.raises(ConfigError, match="Prompts: send them as text, one per line, not as a list"):
        _plan(prompts=["a", "b"])
    with pytest.raises(ConfigError, match="'0_1' is not a number"):
        parse_values("0_1", "tau_prefetch")
    assert len(_plan(policies=("lru", "lru")).settings) == 1
