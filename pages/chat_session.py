"""One browser tab's chat state (`ChatSession`), and the gate that lets Stop and New chat withdraw a message still
waiting for the engine: the page sends the session's gate it last heard with each message (a hidden box,
`ChatPage.gate_box`); Stop with nothing streaming and New chat bump it, so a message sent before either does not run
when the engine frees up (`ChatSession.withdrawn`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from spice_core.api import RunSettings
from pages import chat_settings
from pages.chat_auto import AutoState
from pages.runner import RunStream

# Stop with nothing streaming: what the side bar says, and what the chat says for a message withdrawn by it (the
# engine was still busy with another visitor's reply when Stop was pressed).
WITHDRAWN_NOTE = "Nothing was generating: a message of yours still waiting for the engine is withdrawn."
WITHDRAWN_CHAT_NOTE = ("■ Not sent: Stop was pressed while your message waited for the engine (busy with another "
                       "visitor's reply). It is still in the box: send it again when you want it.")


@dataclass
class ChatSession:
    """One browser tab's state. Mutated in place by the page's events."""

    settings: RunSettings | None = None
    stream: RunStream | None = None
    notices: list[dict] = field(default_factory=list)   # notes to show in the chat at the next refresh
    epoch: int = 0                                      # bumped by "New chat": older streams stop writing
    # Bumped by New chat and by a Stop with nothing streaming; the page sends the value it showed with each message
    # (`ChatPage.gate_box`), so a message sent before either, still waiting for the engine, is withdrawn (`withdrawn`).
    gate: int = 0
    cleared_gate: int = 0                               # `gate` as New chat left it
    last_run_id: str = ""
    last_view: dict = field(default_factory=dict)       # the numbers row of the last reply (re-drawn on settings)
    owner: str = ""                                     # who the runs belong to (pages.owners)
    requests: chat_settings.Requests = field(default_factory=chat_settings.Requests)   # the browser's, applied
    auto: AutoState = field(default_factory=AutoState)  # the side bar's "Auto (within budget)" tune

    def streaming(self) -> bool:
        return self.stream is not None and not self.stream.done

    def withdrawn(self, sent_gate: int | None) -> str:
        """Why a message the page sent with ``sent_gate`` must not run: "cleared" (New chat was pressed since),
        "stopped" (Stop was pressed since, nothing streaming) or "" (it runs; also when the caller sent no gate: the
        API)."""
        if sent_gate is None or sent_gate >= self.gate:
            return ""
        return "cleared" if self.cleared_gate > sent_gate else "stopped"


def gate_of(value) -> int | None:
    """The gate the page sent (a hidden box's text), or None when there is none to check."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
