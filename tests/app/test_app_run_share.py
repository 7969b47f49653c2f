"""One visitor's kept runs stay within a share of the engine's run budget, so that their long replies cannot
expire another visitor's (issue: fair and bounded under many visitors, defect 5). On the real engine."""
from __future__ import annotations

import pytest

from app_helpers import ROOT

engine_mod = pytest.importorskip("spice_core.engine")
SHIPPED = ROOT / "assets" / "spice-mini"


@pytest.fixture(scope="module")
def engine():
    if not SHIPPED.is_dir():
        pytest.skip("the shipped model is not in this tree")
    return engine_mod.SpiceEngine.load(SHIPPED, device="cpu")


def _run(ctx, engine, owner, tokens=6):
    from spice_core.api import RunSettings

    run = engine.start_prompt("Once upon a time", RunSettings(policy="lru", max_new_tokens=tokens))
    ctx.label_run(run.run_id, "chat", owner)
    for _ in run:
        pass
    return run.run_id


def test_one_visitor_cannot_expire_another_visitors_run(engine, monkeypatch):
    from pages.common import OWNER_MIN_RUNS, OWNER_SHARE_DIVISOR, AppContext

    ctx = AppContext.create(engine)
    bobs = _run(ctx, engine, "browser:bob")
    one = engine.run_bytes(bobs)
    assert one > 0
    # A budget of 12 such runs: Alice's share is 3 of them, so she keeps her newest 3 and Bob keeps his.
    monkeypatch.setattr(engine, "max_retained_bytes", 12 * one * 1.05)
    alices = [_run(ctx, engine, "browser:alice") for _ in range(8)]
    _run(ctx, engine, "browser:alice")          # her next start bounds what she holds
    kept = [r for r in alices if r in {s.run_id for s in engine.list_runs()}]
    assert engine.get_summary(bobs) is not None
    assert kept == alices[-len(kept):] and OWNER_MIN_RUNS <= len(kept) < len(alices)
    held = sum(engine.run_bytes(r) for r in kept[1:])       # the newest may be the one just started
    assert held <= engine.max_retained_bytes / OWNER_SHARE_DIVISOR
    listed = {e.run_id for e in ctx.runs.list_for("browser:alice")}
    assert not listed & (set(alices) - set(kept))       # what the engine dropped is no longer listed to her


def test_forget_run_drops_a_kept_run_and_says_so(engine):
    from spice_core.api import RunSettings
    from spice_core.errors import SpiceError

    run = engine.start_prompt("Once", RunSettings(policy="lru", max_new_tokens=3))
    for _ in run:
        pass
    assert engine.run_bytes(run.run_id) > 0 and engine.forget_run(run.run_id)
    assert engine.run_bytes(run.run_id) == 0 and not engine.forget_run(run.run_id)
    with pytest.raises(SpiceError, match="unknown or expired"):
        engine.get_summary(run.run_id)


def test_a_visitors_many_small_runs_cannot_expire_another_visitors_run(engine, monkeypatch):
    """Regression (review): the per-visitor share counted bytes only, so a 40-run sweep of small runs (far under its
    byte share) pushed everyone else's runs out of the engine's 32 kept runs. The share counts runs too."""
    from pages.common import OWNER_MIN_RUNS, OWNER_SHARE_DIVISOR, AppContext

    ctx = AppContext.create(engine)
    monkeypatch.setattr(engine, "max_runs_kept", 8)
    bobs = _run(ctx, engine, "browser:bob", tokens=2)
    alices = [_run(ctx, engine, "browser:alice", tokens=2) for _ in range(10)]
    kept = {s.run_id for s in engine.list_runs()}
    assert bobs in kept
    mine = [r for r in alices if r in kept]
    assert mine == alices[-len(mine):] and len(mine) <= max(OWNER_MIN_RUNS, 8 // OWNER_SHARE_DIVISOR)
