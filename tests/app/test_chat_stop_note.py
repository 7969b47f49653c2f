"""Stop's "Stopping after the current token…" note gives way to the settings hint once the stopped reply has ended,
whichever answer reaches the page last: on a loaded server Stop's answer could land after the reply's end had
already checked the note, and the note stayed for good (seen in the browser test on a busy machine)."""
import threading
import time
from types import SimpleNamespace

from pages.chat import ChatPage
from pages.chat_js import STOPPING_NOTE
from pages.chat_session import ChatSession
from pages.chat_text import settings_hint


def test_stops_note_waits_for_the_reply_to_end_then_gives_way():
    stream = SimpleNamespace(done=False)
    session = ChatSession(stream=stream)
    threading.Timer(0.3, lambda: setattr(stream, "done", True)).start()
    t0 = time.monotonic()
    assert ChatPage.after_stop(None, session, STOPPING_NOTE) == settings_hint()
    assert time.monotonic() - t0 >= 0.25                   # it waited for the reply's end


def test_another_note_is_left_as_it_is_and_a_reply_that_never_ends_keeps_the_note(monkeypatch):
    import pages.chat as chat

    assert ChatPage.after_stop(None, ChatSession(), "something else") == "something else"
    monkeypatch.setattr(chat, "STOP_WAIT_S", 0.1)
    stuck = ChatSession(stream=SimpleNamespace(done=False))
    assert ChatPage.after_stop(None, stuck, STOPPING_NOTE) == STOPPING_NOTE
