"""A message waiting for the engine (another visitor's reply runs) is withdrawn by Stop and by New chat, in a real
browser on the fake engine (pages.chat: the session's gate sent with each message).

Regression (review): Stop answered "Nothing is generating right now" and the waiting message ran anyway once the
engine was free, a whole reply; after New chat it ran too and brought the cleared conversation back. The other
visitor's reply is held until the test releases it, and every wait is for the page's own state, never a fixed time."""
from __future__ import annotations

import threading

import pytest
from gradio_client import Client

from app_helpers import chat_inputs, close, serve, wait_for
from chat_browser import ask_and_keep, open_chat
from fake_engine import FakeEngine
from page_js import text_js

pytestmark = pytest.mark.browser
HOLD = "HOLD the engine with a long story."
FOX = "Tell me a story about a fox and a drum."
DOG = "Tell me a story about a dog."
CAT = "Tell me a story about a cat."
GENERATING = "() => document.body.classList.contains('spice-generating')"


class _Held:
    """Wraps a generation: each token waits until the test releases the engine."""

    def __init__(self, gen, release: threading.Event) -> None:
        self._gen, self._release = gen, release
        self.run_id = gen.run_id

    def __iter__(self):
        for step in self._gen:
            self._release.wait(60)
            yield step

    def cancel(self) -> None:
        self._gen.cancel()
        self._release.set()

    def __getattr__(self, name):
        return getattr(self._gen, name)


class HoldingEngine(FakeEngine):
    """A fake engine whose replies to a prompt holding HOLD wait for `release`."""

    def __init__(self) -> None:
        super().__init__(token_delay_s=0.002)
        self.release = threading.Event()
        self.prompts: list[str] = []

    def start_prompt(self, prompt, settings):
        gen = super().start_prompt(prompt, settings)
        self.prompts.append(prompt)
        return _Held(gen, self.release) if "HOLD" in prompt else gen


@pytest.fixture
def holding():
    s = serve(HoldingEngine())
    yield s
    s.engine.release.set()
    close(s)


def _hold(served) -> tuple[Client, object]:
    """Another visitor's reply, through the API (the same queue as the page's Send), holding the engine."""
    served.engine.release.clear()
    client = Client(served.url, verbose=False)
    job = client.submit(*chat_inputs(HOLD, max_new_tokens=8), api_name="/chat")
    assert wait_for(lambda: any("HOLD" in p for p in served.engine.prompts), 30), "the other reply never started"
    return client, job


def _send_and_wait_queued(page, text: str) -> None:
    page.fill("#spice-msg textarea", text)
    page.press("#spice-msg textarea", "Enter")
    page.wait_for_function(GENERATING, timeout=20_000, polling=50)


def _release(served, client, job, page) -> None:
    served.engine.release.set()
    job.result(timeout=60)
    client.close()
    page.wait_for_function(f"() => !({GENERATING})()", timeout=60_000, polling=100)
    assert served.wait_idle(10)


def _chat(page) -> str:
    return page.evaluate("() => " + text_js("#spice-chat"))


def test_stop_withdraws_a_message_still_waiting_for_the_engine_and_the_next_send_runs(browser, holding):
    """The page leaves its busy state at once (the other reply still runs), and a Send then is not skipped as a
    repeat of the withdrawn one (regression, review: the page stayed "generating" and ignored Enter until the other
    visitor's whole reply had ended)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(30_000)
    try:
        open_chat(page, holding.url)
        client, job = _hold(holding)
        _send_and_wait_queued(page, FOX)
        page.click("#spice-stop")
        page.wait_for_function(f"() => !({GENERATING})()", timeout=20_000, polling=50)
        assert not job.done(), "the other visitor's reply ended: the page's idle state proves nothing"
        assert page.input_value("#spice-msg textarea") == FOX, "the withdrawn message left the box"
        # Sent again while the other reply still holds the engine: it waits, then runs.
        _send_and_wait_queued(page, FOX)
        _release(holding, client, job, page)
        page.wait_for_function(f"() => {text_js('#spice-chat')}.includes('Run ')", timeout=30_000, polling=100)
        assert sum("fox" in p for p in holding.engine.prompts) == 1, holding.engine.prompts
    finally:
        page.close()


def test_new_chat_withdraws_a_waiting_message_and_the_cleared_conversation_stays_gone(browser, holding):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(30_000)
    try:
        open_chat(page, holding.url)
        ask_and_keep(page, DOG)
        client, job = _hold(holding)
        _send_and_wait_queued(page, FOX)
        page.click("#spice-new")
        page.wait_for_function(f"() => !{text_js('#spice-chat')}.includes('dog')", timeout=20_000, polling=100)
        page.wait_for_function(f"() => !({GENERATING})()", timeout=20_000, polling=50)
        assert not job.done()
        # A message typed after New chat, while the other reply still runs, waits and then runs (regression,
        # review: it was skipped as a repeat of the withdrawn one).
        _send_and_wait_queued(page, CAT)
        _release(holding, client, job, page)
        page.wait_for_function(f"() => {text_js('#spice-chat')}.includes('Run ')", timeout=30_000, polling=100)
        assert not any("fox" in p for p in holding.engine.prompts), "the withdrawn message ran"
        assert sum("cat" in p for p in holding.engine.prompts) == 1, holding.engine.prompts
        text = _chat(page)
        assert "dog" not in text and "fox" not in text and "cat" in text, text
    finally:
        page.close()
