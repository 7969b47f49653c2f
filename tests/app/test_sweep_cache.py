"""The sweep page's GPU cache size (and the tune's, which reads the same slider) takes the chat's range for the
page's model: from the smallest step that holds one layer's top-k experts, below which the engine refuses to run.

Regression: the sweep's slider and its check ran from 0 to 1 after the chat's had been fixed, so a sweep could be
asked at a cache the model cannot run with, and each of its runs failed with the engine's error."""
from __future__ import annotations

from dataclasses import replace

import gradio as gr
import pytest

import app
from fake_engine import FakeEngine
from pages.common import AppContext
from pages.limits import slider_ranges
from pages.sweep import SweepPage
from pages.sweep_inputs import TypedData
from pages.sweep_run import SweepSession
from pages.sweep_tune import TuneSession

PROFILE, SHAPE = "rtx4090-pcie4x16", "deepseek-v2-lite"


class NamedFake(FakeEngine):
    """A fake engine under a name of its own (the app tells models apart by name)."""

    def __init__(self, name: str, **kw) -> None:
        super().__init__(token_delay_s=0, **kw)
        self.name = name

    def info(self):
        return replace(super().info(), model_name=self.name)


def small() -> FakeEngine:
    return FakeEngine(token_delay_s=0, n_layers=8, n_experts=16, top_k=4)      # 4 of 112 experts: from 0.05


def large_k() -> FakeEngine:
    return FakeEngine(token_delay_s=0, n_layers=3, n_experts=8, top_k=4)       # 4 of 16 experts: from 0.25


def _page(engine: FakeEngine) -> SweepPage:
    page = SweepPage(AppContext.create(engine))
    with gr.Blocks():
        page.build()
    return page


def _sweep_status(page: SweepPage, cache) -> str:
    gen = page.run("one prompt", ["lru"], "0.2", "0", cache, 4, PROFILE, SHAPE, SweepSession(),
                   lambda *a, **k: None)
    first = next(gen)[0]
    gen.close()
    return first


def test_the_sweep_cache_slider_starts_where_the_chats_does_for_each_model():
    for engine, low in ((small(), 0.05), (large_k(), 0.25)):
        page = _page(engine)
        assert (page.cache_frac.minimum, page.cache_frac.maximum, page.cache_frac.step) == \
            slider_ranges(engine.info())["cache_frac"] == (low, 1.0, 0.05)
        assert page.cache_frac.value >= low and page.defaults.cache_frac >= low
        assert f"from {low:g} for this model" in page.cache_frac.info


def test_the_cache_minimum_follows_the_model_picked():
    """Each model's sweep page (the picker opens it) is built with that model's minimum."""
    demo, ctx = app.build_app([NamedFake("small-moe", n_layers=8, n_experts=16, top_k=4),
                               NamedFake("wide-moe", n_layers=3, n_experts=8, top_k=4)])
    try:
        sliders = [c for c in demo.blocks.values() if getattr(c, "elem_id", None) == "sweep-cache"]
        assert sorted(s.minimum for s in sliders) == [0.05, 0.25]
    finally:
        ctx.exports.cleanup()


@pytest.mark.parametrize("cache, words", [
    (0, "GPU cache size: 0 is out of range; it takes 0.25 to 1 for this model (0.25 is the first step that holds "
        "one layer's top-4 experts)"),
    (0.2, "0.2 is out of range; it takes 0.25 to 1"),
    (1.5, "1.5 is out of range; it takes 0.25 to 1"),
    ("nan", "nan is not a number; it takes 0.25 to 1"),
    ("", "the box is empty; it takes 0.25 to 1"),
])
def test_a_sweep_or_tune_at_a_cache_the_model_cannot_run_with_is_refused_before_any_run(cache, words):
    engine = large_k()
    page = _page(engine)
    status = _sweep_status(page, cache)
    assert status.startswith("⚠ Sweep not started: ") and words in status, status
    tune = next(page.tune.run(1.0, 0.9, cache, PROFILE, SHAPE, TuneSession()))[0]
    assert tune.startswith("⚠ Tune not started: ") and words in tune, tune
    assert engine.generations == []


def test_a_sweep_at_the_models_smallest_cache_runs():
    engine = large_k()
    status = _sweep_status(_page(engine), 0.25)
    assert not status.startswith("⚠"), status
    assert engine.generations and engine.generations[0].settings_log[0][1].cache_frac == 0.25


def test_a_cache_between_two_steps_is_swept_as_typed():
    page = _page(large_k())
    gen = page.run("one prompt", ["lru"], "0.2", "0", 0.33, 4, PROFILE, SHAPE, SweepSession(), lambda *a, **k: None)
    *_, last = gen
    assert last[0].startswith("Done"), last[0]
    assert page.ctx.engine.generations[-1].settings_log[0][1].cache_frac == 0.33


@pytest.mark.parametrize("typed, went", [(0, 0.25), ("0.1", 0.25), (5, 1.0), ("1e9", 1.0), (None, 0.25)])
def test_a_number_typed_beyond_the_cache_slider_is_said_under_its_label(typed, went):
    """The browser brings it to the slider's nearest end without a word; the note says what was typed, the
    model's range and the value the box went to."""
    page = _page(large_k())
    update = page.on_cache_typed(TypedData(page.cache_frac, typed))
    assert update["value"] == went
    said = "the box is empty" if typed is None else f"{typed} is out of range"
    assert update["info"].startswith(f"⚠ GPU cache size: {said}; it takes 0.25 to 1"), update["info"]
    assert update["info"].endswith(f"The box went to {went:g}."), update["info"]


def test_a_number_the_cache_slider_takes_brings_its_own_line_back():
    page = _page(large_k())
    for typed in (0.25, 0.5, "0.33", 1):
        update = page.on_cache_typed(TypedData(page.cache_frac, typed))
        assert update == gr.update(info=page.cache_info), update


def test_a_sweeps_runs_are_labelled_by_their_setting_and_prompt_and_counted_in_words():
    """Regression (review): every run of a sweep was labelled "sweep spice" in the trace explorer (grid points could
    not be told apart), and the status said "1 runs"."""
    page = _page(large_k())
    gen = page.run("one prompt", ["lru"], "0.2", "0", 0.25, 4, PROFILE, SHAPE, SweepSession(), lambda *a, **k: None)
    *_, last = gen
    assert last[0].startswith("Done: 1 setting, 2 runs in"), last[0]
    runs = [page.ctx.runs.get(g._run.run_id) for g in page.ctx.engine.generations]
    labels = [e.label for e in runs if e is not None]
    assert "sweep lru τp=0.2 τa=0 · prompt 1" in labels and "sweep reference 1" in labels, labels


def test_a_stopped_sweep_does_not_count_the_run_it_cut_short():
    """Regression (review): Stop during a run counted that cancelled run as done ("1 runs")."""
    session = SweepSession()
    page = _page(FakeEngine(token_delay_s=0.05, n_layers=3, n_experts=8, top_k=4))
    gen = page.run("one prompt", ["lru"], "0.2", "0", 0.25, 128, PROFILE, SHAPE, session, lambda *a, **k: None)
    first = next(gen)            # a progress line while the reference run streams (it takes ~6 s)
    session.stop = True
    *_, last = gen
    assert last[0].startswith("Stopped") and "0 runs in" in last[0], (first[0], last[0])
