"""Stop's "Stopping after the current token…" note gives way to the settings hint once the stopped reply has ended,
whichever answer reaches the page last: on a loaded server Stop's answer could land after the reply's end had
already checked the note, and the note stayed for good (seen in the browser test on a busy machine). Stop's own
event chain waits for the reply to end (`after_stop`), then swaps the note in the page only if it still says
"Stopping…" (a note written meanwhile, e.g. a refused setting, stays)."""
import threading
import time
from types import SimpleNamespace

from pages.chat import ChatPage
from pages.chat_js import STOPPED_NOTE_JS, STOPPING_NOTE
from pages.chat_session import ChatSession
from pages.chat_text import settings_hint


def test_stop_waits_for_the_reply_to_end():
    stream = SimpleNamespace(done=False)
    session = ChatSession(stream=stream)
    threading.Timer(0.3, lambda: setattr(stream, "done", True)).start()
    t0 = time.monotonic()
    assert ChatPage.after_stop(None, session) is None
    assert time.monotonic() - t0 >= 0.25 and not session.streaming()


def test_a_reply_that_never_ends_is_waited_for_a_bounded_time(monkeypatch):
    import pages.chat as chat

    monkeypatch.setattr(chat, "STOP_WAIT_S", 0.1)
    stuck = ChatSession(stream=SimpleNamespace(done=False))
    t0 = time.monotonic()
    ChatPage.after_stop(None, stuck)
    assert time.monotonic() - t0 < 5


def test_the_page_swaps_only_a_stopping_note():
    import json

    assert json.dumps(STOPPING_NOTE) in STOPPED_NOTE_JS and json.dumps(settings_hint()) in STOPPED_NOTE_JS
    assert STOPPED_NOTE_JS.startswith("(n) => [n === ")       # any other note comes back as it was
