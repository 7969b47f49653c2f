"""One browser tab's chat state (`ChatSession`), and how Stop and New chat withdraw a message still waiting for the
engine (queued behind another visitor's reply):

- in the browser (`Withdraw`): when Stop or New chat finds nothing of this session streaming while the page still
  waits, the page clicks a hidden button whose event cancels its queued chat (or Auto tune) and ends its busy state,
  so the next Send is not skipped as a repeat of the waiting one;
- on the server, for a message the queue had already started: the page sends the session's gate it last heard with
  each message (a hidden box); Stop with nothing streaming and New chat bump it, so such a message does not run
  (`ChatSession.withdrawn`)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import gradio as gr

from spice_core.api import RunSettings
from pages import chat_settings
from pages.chat_auto import AutoState
from pages.chat_js import WITHDRAW_JS
from pages.runner import RunStream

# Stop with nothing streaming: what the side bar says, and what the chat says for a message withdrawn by it (the
# engine was still busy with another visitor's reply when Stop was pressed). The server cannot tell whether anything
# waits, and only the page's messages carry the gate that withdraws them: an API client's /chat waiting in the queue
# still runs, so the note claims no more than that.
WITHDRAWN_NOTE = ("Nothing was generating. A message this page sent that still waits for the engine will not run "
                  "(one sent through the API still runs: stop it once it streams).")
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
    # (`Withdraw.gate_box`), so a message sent before either, still waiting for the engine, is withdrawn (`withdrawn`).
    gate: int = 0
    cleared_gate: int = 0                               # `gate` as New chat left it
    withdrew: bool = False      # the last Stop or New chat found nothing streaming: the page withdraws what it queued
    last_run_id: str = ""
    last_view: dict = field(default_factory=dict)       # the numbers row of the last reply (re-drawn on settings)
    owner: str = ""                                     # who the runs belong to (pages.owners)
    requests: chat_settings.Requests = field(default_factory=chat_settings.Requests)   # the browser's, applied
    auto: AutoState = field(default_factory=AutoState)  # the side bar's "Auto (within budget)" tune

    def streaming(self) -> bool:
        return self.stream is not None and not self.stream.done

    def replying(self) -> bool:
        """A reply streams (not its exact re-run, which keeps its exact settings: a live change would make the run
        the greedy agreement is measured against lossy)."""
        stream = self.stream        # read once: the chat's thread sets it to None when the reply ends
        return stream is not None and not stream.done and stream.kind == "chat reply"

    def wait_until_idle(self, timeout_s: float) -> bool:
        """Wait until no reply streams (a stopped one ends at its next token); False if one still does after
        ``timeout_s``."""
        end = time.monotonic() + timeout_s
        while self.streaming():
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)
        return True

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


class Withdraw:
    """The page's hidden parts that take back a waiting message (see the module docstring). Built where it is made."""

    def __init__(self) -> None:
        # The session's gate as this page last heard it; sent with each message.
        self.gate_box = gr.Textbox("0", visible="hidden", show_label=False, container=False, interactive=False,
                                   elem_id="spice-gate")
        # "1" after a Stop or New chat that found nothing of this session streaming (`ChatSession.withdrew`).
        self.withdrawn_box = gr.Textbox("", visible="hidden", show_label=False, container=False, interactive=False,
                                        elem_id="spice-withdrawn")
        self.button = gr.Button("withdraw", visible="hidden", elem_id="spice-withdraw")

    @property
    def boxes(self) -> list:
        """What Stop's and New chat's handlers write: the gate, then the withdrawn flag."""
        return [self.gate_box, self.withdrawn_box]

    def after(self, event) -> None:
        """After ``event`` (Stop's gate update, or New chat) wrote `boxes`: withdraw what the page still waits for."""
        event.then(None, inputs=[self.withdrawn_box], js=WITHDRAW_JS, queue=False, api_visibility="private",
                   show_progress="hidden")

    def wire(self, waiting_events: list, busy_off_js: str) -> None:
        """The hidden button cancels ``waiting_events`` (those still queued) and ends the page's busy state."""
        self.button.click(None, js=busy_off_js, queue=False, cancels=waiting_events, api_visibility="private",
                          show_progress="hidden")
