"""The chat's greedy agreement: a lossy reply generated again with exact settings, their greedy tokens compared.

    ChatPage._finish ──► check_exact(ctx, turns, settings, live, session) ──► runner.start (the reply's owner)
                         ──► the exact re-run's token ids ──► chat_text.agreement_value: (value, detail)

The re-run is the session's stream while it lasts, so Stop, New chat and a closed tab end it as they end a
reply. Knows nothing of the page's layout.
"""
from __future__ import annotations

from dataclasses import replace

from spice_core.api import RunSettings
from spice_core.errors import SpiceError
from pages import chat_text as text
from pages.common import AppContext, spice_error_text
from pages.live import LiveRun
from pages.runner import CANCEL_REASONS


def check_exact(ctx: AppContext, turns, settings: RunSettings, live: LiveRun, session,
                reply_owner: str = "") -> tuple[str, str]:
    """Generate the same reply with exact settings and compare greedy tokens: (value, detail), the value the
    project's one greedy agreement (spice_core.api.greedy_agreement). ``session``: the chat's ChatSession."""
    exact = replace(settings, tau_approx=0.0, max_new_tokens=max(1, live.n_tokens))
    # The reply's owner and the session's stream: Stop, New chat and a closed tab (unload) end the check as
    # they end a reply (it had an owner of its own, so nothing could stop it and the next visitor waited).
    owner = reply_owner or f"exact-check-{id(session)}"
    try:
        stream = ctx.runner.start(owner, exact, lambda: ctx.engine.start_chat(turns, exact), kind="exact check")
    except SpiceError as exc:
        return "not measured", spice_error_text(exc)
    session.stream = stream
    ctx.label_run(stream.run_id, f"exact check of {session.last_run_id}", session.owner)
    ids: list[int] = []
    while True:
        steps, ended = stream.take(1.0)
        ids += [s.token_id for s in steps]
        if ended:
            break
    if session.stream is stream:
        session.stream = None
    if stream.error:
        return "not measured", stream.error
    if stream.cancel_reason:
        return "not measured", ("stopped before the exact re-run ended" if stream.cancel_reason == "stop"
                                else f"the exact re-run was stopped: {CANCEL_REASONS.get(stream.cancel_reason, '')}")
    return text.agreement_value(ids, live.token_ids)
