"""Driving the chat page in a real browser, shared by the browser tests that send a message and then reload.

A reply's end is not the moment the browser has kept it: the page keeps the conversation (this tab's entry in
localStorage) a moment after the reply's last update, and a reload before that brings back less. The page marks on
its body how many run notes this tab's kept conversation holds once the write is done (assets/static/spice_keep.js);
the tests wait for that mark instead of sleeping, so they pass on a slow machine and take no longer than they must
on a fast one."""
from __future__ import annotations

from page_js import text_js

KEPT_RUNS_JS = "() => +(document.body.dataset.spiceKeptRuns || 0)"


def open_chat(page, url: str) -> None:
    """Open the chat and wait until its page-load events have started: the load that brings back what the tab kept
    marks the tab's id on the body (assets/static/spice_keep.js). A box can show before the page's events are wired,
    and a key pressed then reaches no listener."""
    page.goto(url, wait_until="load")
    page.locator("#spice-msg textarea").wait_for(state="visible")
    page.wait_for_function("() => !!document.body.dataset.spiceTab", timeout=20_000, polling=50)


def ask_and_keep(page, text: str) -> None:
    """Send ``text`` and wait until its reply has ended and the browser has kept the conversation with the reply's
    run note (one run note more than before)."""
    kept_before = page.evaluate(KEPT_RUNS_JS)
    page.fill("#spice-msg textarea", text)
    page.press("#spice-msg textarea", "Enter")
    page.wait_for_function("() => document.body.classList.contains('spice-generating')", timeout=20_000, polling=50)
    page.wait_for_function("() => !document.body.classList.contains('spice-generating')", timeout=60_000,
                           polling=100)
    page.wait_for_function(f"() => ({KEPT_RUNS_JS})() > {kept_before}", timeout=20_000, polling=100)


class ServerCalls:
    """The page's calls to the server still in flight (Gradio's POSTs: a queued event's join, a direct event's run),
    as the browser reports them. A reply's end sets off more than the keep `ask_and_keep` waits for: the settings in
    use come back from the server and are kept again when they differ from what the page holds. A test that writes
    what the page keeps waits until those calls have ended (`wait_idle`), or a late one overwrites its write."""

    def __init__(self, page) -> None:
        self.page, self.pending = page, set()
        page.on("request", self._started)
        page.on("requestfinished", self._ended)
        page.on("requestfailed", self._ended)

    def _started(self, request) -> None:
        if request.method == "POST" and "/gradio_api/" in request.url:
            self.pending.add(request)

    def _ended(self, request) -> None:
        self.pending.discard(request)

    def wait_idle(self, timeout_s: float = 20.0) -> None:
        """Until no call is in flight (the browser's events are handled while waiting; no fixed sleep decides)."""
        waited_ms = 0
        while self.pending:
            assert waited_ms < timeout_s * 1000, f"server calls still in flight: {[r.url for r in self.pending]}"
            self.page.wait_for_timeout(50)
            waited_ms += 50


def reload_chat(page, text: str) -> None:
    """Reload and wait until the kept conversation holding ``text`` is back on screen."""
    page.reload(wait_until="load")
    page.locator("#spice-msg textarea").wait_for(state="visible")
    page.wait_for_function(f"() => {text_js('#spice-chat')}.includes({text!r})", timeout=20_000, polling=100)
