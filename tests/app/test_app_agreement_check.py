"""The chat's greedy agreement check through the API (fake engine): a lossy reply is generated again with exact
settings (pages/chat_check.py), and nothing the visitor does meanwhile makes that re-run lossy."""
from __future__ import annotations

import re

from app_helpers import chat_inputs, settings_inputs, wait_for


def test_lossy_reply_is_checked_against_exact_settings_when_asked(served, client):
    before = len(served.engine.generations)
    out = client.predict(*chat_inputs("check me", max_new_tokens=20, tau_approx=0.15, check_exact=True),
                         api_name="/chat")
    assert len(served.engine.generations) == before + 2, "the exact re-run did not happen"
    exact = served.engine.generations[-1]
    assert exact.settings_log[0][1].tau_approx == 0.0 and exact.settings_log[0][1].max_new_tokens == 20
    stats = out[2]
    assert "greedy agreement" in stats and re.search(r"\d+ of 20 tokens match", stats), stats


def test_a_setting_moved_during_the_exact_rerun_leaves_that_run_exact(served, client, monkeypatch):
    """Regression (review): any control moved while the reply's exact re-run ran (even Max new tokens) sent the
    session's settings, the reply's tau_approx among them, to that re-run, which then approximated: the agreement
    was measured against a lossy run while the side bar called it "the running reply". The re-run keeps its exact
    settings, and the change is for the next message."""
    monkeypatch.setattr(served.engine, "token_delay_s", 0.1)       # a re-run of 40 tokens lasts ~4 s
    before = len(served.engine.generations)
    job = client.submit(*chat_inputs("check me", max_new_tokens=40, tau_approx=0.15, check_exact=True),
                        api_name="/chat")
    assert wait_for(lambda: len(served.engine.generations) == before + 2
                    and len(served.engine.generations[-1]._run.steps) >= 1, 20), "no exact re-run started"
    note, _, _ = client.predict(*settings_inputs(tau_approx=0.15, max_new_tokens=32), api_name="/settings")
    assert "exact re-run" in note and "keeps its exact settings" in note and "running reply" not in note, note
    job.result(timeout=30)
    exact = served.engine.generations[-1]
    assert [s.tau_approx for _, s in exact.settings_log] == [0.0], exact.settings_log


def test_exact_settings_need_no_check(served, client):
    before = len(served.engine.generations)
    out = client.predict(*chat_inputs("exact", max_new_tokens=5, tau_approx=0.0, check_exact=True), api_name="/chat")
    assert len(served.engine.generations) == before + 1
    assert "identical by design" in out[2]
