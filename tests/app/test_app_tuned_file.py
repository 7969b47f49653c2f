"""A tuned pick beside the model in the app (issue 25, item 2): the sweep page's "Save this pick beside the model"
writes spice-tuned.json where `python -m spice_core tune` writes it (the same function and format, so `generate
--tuned` reads it) and says where in one line; a folder it cannot write, a model without a folder or a file of
that name that is not a tuned-settings file is said in one line, and nothing is lost. A pick saved there that fits
the page's cache, profile and shape is offered on the sweep page and in the chat's side bar when the app loads
the model, and a tune with its budget and reply length reuses it without running; a lossy pick that was never
confirmed on replies as long as the chat's (a file written before the confirmation existed) is offered with that
caveat, and Auto tunes again rather than applying it as within the budget. The pages run on the fake engine, the
records are made up (no tune runs here: the tuner itself is tests/tune/test_tuner.py)."""
import errno
import json
from dataclasses import replace
from types import SimpleNamespace

import gradio as gr
import pytest

from fake_engine import FakeEngine
from pages import tuning
from pages.chat import ChatSession
from pages.chat_auto import AutoTune
from pages.common import DEFAULT_CHAT_TOKENS, SETTING_FIELDS, AppContext, default_settings
from pages.sweep import SweepPage
from pages.sweep_tune import TuneSection, TuneSession
from spice_core.api import TuneRecord, find_tuned, load_tuned, save_tuned, tuned_path
from spice_core.tools.generate import default_tuned_path

SETTING = {"tau_approx": 0.05, "tau_prefetch": 0.1, "max_lookahead": 2, "lore_rank": 4, "cpu_lane": True}


def _record(info, **kw) -> TuneRecord:
    d = default_settings(info)
    trials = [{**SETTING, "tau_approx": 0.0, "speed_ms": 20.0, "ppl_pct": 0.0, "agreement": 1.0, "stage": "exact",
               "met": True, "verdict": "exact"},
              {**SETTING, "speed_ms": 12.5, "ppl_pct": 0.6, "agreement": 1.0, "stage": "lossy", "met": True,
               "verdict": "held", "confirm_ppl_pct": 0.4, "confirm_agreement": 0.95}]
    return TuneRecord(**{"model": info.model_name, "policy": "spice", "profile": d.profile, "shape": d.shape,
                         "cache_frac": d.cache_frac, "budget": {"ppl_pct": 1.0, "agreement": 0.9},
                         "setting": dict(SETTING), "speed_ms": 12.5, "speed_timing": f"modeled (profile {d.profile})",
                         "ppl_pct": 0.4, "agreement": 0.95, "quality_measured_on": "64 teacher-forced tokens",
                         "reason": "the fastest setting within the budget", "trials": trials, "tune_s": 3.0,
                         "confirmed": True, "reply_tokens": DEFAULT_CHAT_TOKENS, **kw})


def _drain(gen):
    """Run a pages.tuning.run generator to its end: its (record | None, words)."""
    while True:
        try:
            next(gen)
        except StopIteration as end:
            return end.value


def _section(model_dir="", book=None) -> TuneSection:
    ctx = AppContext.create(FakeEngine(token_delay_s=0, model_dir=str(model_dir)))
    return TuneSection(SweepPage(ctx, book or tuning.TuneBook()))


def _one_line(text: str) -> str:
    assert "\n" not in text and "Traceback" not in text, text
    return text


def test_save_writes_the_pick_where_the_cli_saves_it_and_generate_tuned_reads_it(tmp_path):
    section = _section(tmp_path)
    record = _record(section.ctx.info)
    line = _one_line(section.save(TuneSession(record=record)))
    path = default_tuned_path(tmp_path)              # where `tune` writes and `generate --tuned` reads by default
    assert line.startswith(f"Saved beside the model: `{path}`"), line
    assert json.loads(path.read_text())["format"] == 1
    found = find_tuned(path, profile=record.profile, shape=record.shape, cache_frac=record.cache_frac)
    assert found.as_dict() == record.as_dict()
    # Saved again with another cache: both kept, one record per profile, shape and cache (as the CLI keeps them).
    section.save(TuneSession(record=replace(record, cache_frac=0.5)))
    assert sorted(r.cache_frac for r in load_tuned(path)) == [0.25, 0.5]


@pytest.mark.parametrize("case", ["read-only", "not a folder", "no folder", "not a tuned file", "stopped", "none"])
def test_a_pick_that_cannot_be_saved_is_said_in_one_line_and_nothing_is_lost(tmp_path, monkeypatch, case):
    model_dir = {"not a folder": tmp_path / "weights.bin", "no folder": ""}.get(case, tmp_path)
    if case == "not a folder":
        model_dir.write_text("a file where a folder was expected")
    section = _section(model_dir)
    record = _record(section.ctx.info, stopped=case == "stopped")
    path = tuned_path(tmp_path)
    before = {"read-only": None, "not a tuned file": "not json\n"}
    if case == "read-only":
        save_tuned(replace(_record(section.ctx.info), cache_frac=0.75), path)      # a pick saved before
        before[case] = path.read_text()

        def read_only(*_args, **_kw):
            raise PermissionError(errno.EROFS, "Read-only file system")
        monkeypatch.setattr(tuning, "save_tuned", read_only)
    elif case == "not a tuned file":
        path.write_text(before[case])
    session = TuneSession(record=None if case == "none" else record)
    line = _one_line(section.save(session))
    expected = {"read-only": "not writable here", "not a folder": "Not a directory", "no folder": "no folder",
                "not a tuned file": "is not a tuned-settings file", "stopped": "stopped tune",
                "none": "Nothing to save yet"}[case]
    assert line.startswith("⚠ ") and expected in line, line
    if before.get(case) is not None:
        assert path.read_text() == before[case]                       # the file as it was
    elif case != "not a folder":
        assert not path.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".part")) == []
    assert session.record is (None if case == "none" else record)      # the pick stays on the page
    assert section.book.saved_for(section.ctx.key, section.page.defaults) is None


def test_a_saved_pick_that_fits_is_offered_on_both_pages_and_reused_without_a_tune(tmp_path):
    info = FakeEngine(model_dir=str(tmp_path)).info()
    record = _record(info)
    save_tuned(record, tuned_path(tmp_path))
    save_tuned(replace(record, cache_frac=0.75, speed_ms=9.0), tuned_path(tmp_path))
    book = tuning.TuneBook()
    section = _section(tmp_path, book)             # the app loads the model: the sweep page reads the file
    ctx = section.ctx
    # The sweep page shows it as a tune's result, ready to use in chat.
    session = TuneSession()
    status, _plot, table, pick, use = section.offer(session)
    assert "Saved beside the model" in status and "perplexity +1 % at most" in status, status
    assert session.record.as_dict() == record.as_dict() and use["interactive"] is True
    assert len(table) == len(record.trials) and "Picked:" in pick and str(tuned_path(tmp_path)) in pick
    # The chat's side bar offers it on load, and says how to use it.
    page = SimpleNamespace(ctx=ctx, defaults=default_settings(ctx.info), controls=[None] * len(SETTING_FIELDS))
    note, *rest = AutoTune(page, book).adopt(ChatSession())
    assert "Saved beside the model" in note and "Auto (within budget)" in note, note
    # A tune with its budget, cache, profile, shape and reply length reuses it at once (nothing runs on the engine).
    gen = tuning.run(ctx, book, "visitor", page.defaults, tuning.budget(1.0, 0.9), lambda: False)
    with pytest.raises(StopIteration) as end:
        next(gen)
    got, how = end.value.value
    assert got.as_dict() == record.as_dict() and "saved beside the model" in how
    assert ctx.engine.generations == [] and ctx.runner.active is None
    # Another cache gets its own saved pick; one nothing was saved for gets none; another budget is not reused.
    assert book.saved_for(ctx.key, replace(page.defaults, cache_frac=0.75)).record.speed_ms == 9.0
    assert book.saved_for(ctx.key, replace(page.defaults, cache_frac=0.5)) is None
    assert book.find(tuning.pick_key(ctx.key, page.defaults, tuning.budget(0.5, 0.95))) is None
    # Replies longer than it was confirmed on: not reused.
    longer = replace(page.defaults, max_new_tokens=DEFAULT_CHAT_TOKENS + 1)
    assert book.find(tuning.pick_key(ctx.key, longer, tuning.budget(1.0, 0.9))) is None


def test_an_old_saved_pick_never_confirmed_is_offered_with_a_caveat_and_never_applied_as_within_budget(tmp_path):
    """Regression: a lossy pick saved before the confirmation existed (screened on 2 prompts x 8 greedy tokens) was
    offered and applied by Auto as within the budget; on chat replies its agreement was far below it."""
    info = FakeEngine(model_dir=str(tmp_path)).info()
    old = _record(info).as_dict()
    for key in ("confirmed", "reply_tokens"):            # the file's format before them
        del old[key]
    for trial in old["trials"]:
        trial.pop("verdict"), trial.pop("confirm_ppl_pct", None), trial.pop("confirm_agreement", None)
    tuned_path(tmp_path).write_text(json.dumps({"format": 1, "records": [old]}))
    [record] = load_tuned(tuned_path(tmp_path))
    assert not record.confirmed and not record.within_budget_for(1)
    assert [TuneRecord.verdict(t) for t in record.trials] == ["exact", "unconfirmed"]
    book = tuning.TuneBook()
    section = _section(tmp_path, book)
    status, _plot, table, pick, _use = section.offer(TuneSession())
    assert "Not known to be within the budget" in status and "never confirmed" in status, status
    assert "tunes again" in status and "Not known to be within the budget" in pick
    assert list(table["within budget"]) == ["? not confirmed", "✓ yes (exact)"]
    page = SimpleNamespace(ctx=section.ctx, defaults=default_settings(section.ctx.info),
                           controls=[None] * len(SETTING_FIELDS))
    note, *_rest = AutoTune(page, book).adopt(ChatSession())
    assert "Not known to be within the budget" in note and "does not apply it" in note, note
    # Auto with its budget does not reuse it: a tune starts (on the fake engine it cannot run, and says so).
    got, how = _drain(tuning.run(section.ctx, book, "visitor", page.defaults, tuning.budget(1.0, 0.9), lambda: False))
    assert got is None and "reused" not in how


def test_a_saved_file_that_cannot_be_read_offers_nothing_and_breaks_no_page(tmp_path):
    tuned_path(tmp_path).write_text("{not json")
    section = _section(tmp_path)
    session = TuneSession()
    assert section.offer(session) == (gr.skip(),) * 5 and session.record is None
    assert section.book.saved_for(section.ctx.key, section.page.defaults) is None


def test_a_pick_used_for_longer_replies_than_it_was_confirmed_on_says_so():
    record = _record(FakeEngine().info())
    assert "Not known to be within the budget" not in tuning.pick_markdown(record, "tuned", DEFAULT_CHAT_TOKENS)
    longer = tuning.pick_markdown(record, "tuned", 512)
    assert f"confirmed on replies of {DEFAULT_CHAT_TOKENS} tokens, shorter than yours (512 tokens)" in longer, longer
    exact = replace(record, setting={**SETTING, "tau_approx": 0.0}, confirmed=False, reply_tokens=0)
    assert "Not known" not in tuning.pick_markdown(exact, "tuned", 512) and "nothing approximated" in \
        tuning.pick_markdown(exact, "tuned", 512)
