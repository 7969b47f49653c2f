"""The trace explorer's Refresh redraws the run shown only when it, or what it is drawn from, changed.

Regression: Refresh redrew the run shown every time, and a redraw empties the Download box, so a link the visitor
had just made vanished on a Refresh that changed nothing. Refresh's views come from `TraceExplorer.refresh_view`,
which compares the run's signature now with the one kept (a gr.State) when its views were drawn."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest

from fake_engine import FakeEngine
from pages.common import AppContext
from pages.owners import OWNER_COOKIE
from pages.trace_explorer import TraceExplorer
from spice_core.api import RunSettings

ALICE = "a" * 32
OWNER = f"browser:{ALICE}"
FILE, SHARE, SIGNATURE = 5, 6, -1      # positions in the views' outputs (TraceExplorer._wire: shown + drawn)


def _request():
    return SimpleNamespace(query_params={}, cookies={OWNER_COOKIE: ALICE}, session_hash=ALICE[:8], headers={})


@pytest.fixture
def built():
    """The page built in its own Blocks (on the fake engine), and those Blocks."""
    ctx = AppContext.create(FakeEngine(token_delay_s=0))
    page = TraceExplorer(ctx)
    with gr.Blocks() as demo:
        page.build()
    yield page, demo
    ctx.exports.cleanup()


@pytest.fixture
def page(built):
    return built[0]


def _finished_run(page: TraceExplorer, prompt: str, label: str = "a story") -> str:
    gen = page.ctx.engine.start_prompt(prompt, RunSettings(policy="lru", max_new_tokens=6))
    for _ in gen:
        pass
    page.ctx.runs.add(gen.run_id, OWNER, label)
    return gen.run_id


def _drawn_with_a_link(page: TraceExplorer, run_id: str):
    """The run's views as the page draws them, then a CSV prepared in the Download box: the kept signature."""
    shown = page.show_drawn(run_id, 0, 16, _request())
    assert shown[0] == "" and shown[FILE] is None, shown[0]
    link, message = page.export_ui(run_id, "csv", _request())
    assert message == "" and Path(link).is_file()
    return shown[SIGNATURE]


def _refresh(page: TraceExplorer, shown_id: str, drawn):
    """Refresh as the page chains it: the run list (keeping the run shown when it is still there), then the views."""
    run_id = page.list_runs(shown_id, _request())["value"]
    return run_id, page.refresh_view(run_id, 0, 16, drawn, _request())


def test_a_refresh_that_changes_nothing_keeps_the_download_link_and_every_view(page):
    run_id = _finished_run(page, "Once upon a time, a fox found a drum.")
    drawn = _drawn_with_a_link(page, run_id)
    shown_id, out = _refresh(page, run_id, drawn)
    assert shown_id == run_id
    assert out[FILE] == gr.skip()                                   # the link prepared stays
    assert all(o == gr.skip() for i, o in enumerate(out[:-1]) if i != SHARE), out
    assert out[SHARE] == gr.update(value=False) and out[SIGNATURE] == drawn


def test_a_new_run_in_the_list_alone_keeps_the_link_of_the_run_shown(page):
    run_id = _finished_run(page, "Once upon a time, a fox found a drum.")
    drawn = _drawn_with_a_link(page, run_id)
    newer = _finished_run(page, "Once upon a time, a rabbit wanted a new hat.")
    choices = [v for _, v in page.list_runs(run_id, _request())["choices"]]
    assert choices[0] == newer and run_id in choices                # the picker lists it...
    shown_id, out = _refresh(page, run_id, drawn)
    assert shown_id == run_id and out[FILE] == gr.skip() and out[SIGNATURE] == drawn    # ...the views stay


def test_a_refresh_redraws_a_run_whose_numbers_or_label_changed(page, monkeypatch):
    run_id = _finished_run(page, "Once upon a time, a fox found a drum.")
    drawn = _drawn_with_a_link(page, run_id)

    page.ctx.runs.add(run_id, OWNER, "a new label")                 # its label
    _, out = _refresh(page, run_id, drawn)
    assert out[FILE] is None and "a new label" in out[1] and out[SIGNATURE] != drawn
    drawn = out[SIGNATURE]
    assert _refresh(page, run_id, drawn)[1][FILE] == gr.skip()      # drawn anew: the next Refresh keeps it

    engine = page.ctx.engine                                        # its numbers
    before = engine.get_summary(run_id)
    monkeypatch.setattr(engine, "get_summary", lambda rid: replace(before, n_tokens=before.n_tokens + 1))
    _, out = _refresh(page, run_id, drawn)
    assert out[FILE] is None and out[1] != gr.skip() and out[SIGNATURE] != drawn


def test_a_refresh_redraws_when_the_run_shown_is_gone_from_the_list(page):
    kept = _finished_run(page, "Once upon a time, a rabbit wanted a new hat.")
    run_id = _finished_run(page, "Once upon a time, a fox found a drum.")
    drawn = _drawn_with_a_link(page, run_id)
    del page.ctx.engine._runs[run_id]                               # the engine forgot it (as it does the oldest)
    shown_id, out = _refresh(page, run_id, drawn)
    assert shown_id == kept
    assert out[0] == "" and out[FILE] is None and out[SIGNATURE][:2] == ("run", kept)


def test_refresh_chains_refresh_view_with_the_kept_signature_and_the_download_box(built):
    """The wiring: Refresh's views come from refresh_view, which reads and writes the page's signature state."""
    page, demo = built
    deps = [d for d in demo.fns.values() if getattr(d.fn, "__func__", None) is TraceExplorer.refresh_view]
    assert len(deps) == 1, deps
    ids = lambda comps: [c._id for c in comps]              # noqa: E731
    assert page.drawn._id in ids(deps[0].inputs) and ids(deps[0].outputs)[-1] == page.drawn._id
    assert ids(deps[0].outputs)[FILE] == page.file._id
