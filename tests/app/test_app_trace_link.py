"""A trace link (`/trace?run=<id>`) to a run the visitor may not open says so. Regression: the page dropped the id
and opened the visitor's own newest run, or "No finished runs yet", as if the link had worked."""
from __future__ import annotations

from types import SimpleNamespace

from app_helpers import chat_inputs
from pages.trace_explorer import TraceExplorer

ALICE, BOB = "a" * 32, "b" * 32


def _request(token: str, run: str | None):
    from pages.owners import OWNER_COOKIE
    return SimpleNamespace(query_params={"run": run} if run else {}, cookies={OWNER_COOKIE: token},
                           session_hash=token[:8], headers={})


def test_a_link_to_an_unshared_or_unknown_run_stays_selected_and_says_why(served, client):
    client.predict(*chat_inputs("a short one", max_new_tokens=3), api_name="/chat")
    run_id = served.engine.generations[-1].run_id
    served.ctx.runs.add(run_id, f"browser:{ALICE}", "alice's")
    page = TraceExplorer(served.ctx)

    mine = page.on_load(_request(ALICE, run_id))
    assert mine["value"] == run_id and not any("not available" in label for label, _ in mine["choices"])
    assert page.show(run_id, 0, 16, _request(ALICE, run_id))[0] == ""

    for wanted in (run_id, "r-no-such-run"):             # another's unshared run; an id nobody has
        got = page.on_load(_request(BOB, wanted))
        assert got["value"] == wanted
        assert (f"{wanted} · from the link: not available to you", wanted) in got["choices"]
        message = page.show(wanted, 0, 16, _request(BOB, wanted))[0]
        assert message.startswith("⚠") and "unknown, expired or not yours" in message, message

    served.ctx.runs.set_shared(run_id, f"browser:{ALICE}", True)      # shared: the same link now opens it
    got = page.on_load(_request(BOB, run_id))
    assert got["value"] == run_id and not any("not available" in label for label, _ in got["choices"])
    assert page.show(run_id, 0, 16, _request(BOB, run_id))[0] == ""


def test_a_link_with_a_malformed_run_id_stays_selected_and_says_it_is_not_a_run_id(served):
    """Regression: `/trace?run=<not an id>` (a space, a quote, a cut or mangled link) dropped the id and showed the
    visitor's own runs or "No finished runs yet" with no word about the link; an unknown id said why."""
    page = TraceExplorer(served.ctx)
    for asked in ("bo gus!", "03c3b90521'", "x" * 300):
        got = page.on_load(_request(ALICE, asked))
        kept = got["value"]
        assert kept and asked.startswith(kept) and len(kept) <= 80
        assert (f"{kept} · from the link: not a run id", kept) in got["choices"]
        message = page.show(kept, 0, 16, _request(ALICE, asked))[0]
        assert message.startswith("⚠") and "not a run id" in message and "check the link" in message, message
    empty = page.on_load(_request(ALICE, "   "))            # an empty ?run= is no link at all
    assert not any("from the link" in label for label, _ in empty["choices"])
