"""pages.chat_fit: which exchanges a chat sends, so that the reply has room in the model's context.

Regression (review): the app left out only enough old exchanges for the prompt itself to fit, so after ~25
exchanges a reply stopped at 2 to 11 tokens ("Reached the model's context")."""
from __future__ import annotations

from dataclasses import replace

import pytest

from fake_engine import FakeEngine
from pages.chat_fit import FittedStart, reply_room
from spice_core.api import RunSettings
from spice_core.errors import PromptError

SETTINGS = RunSettings(policy="lru", max_new_tokens=200)


def _chat(n_exchanges: int, turn_chars: int = 120) -> list[dict]:
    turns = []
    for i in range(n_exchanges):
        turns += [{"role": "user", "content": f"question {i} " + "q" * turn_chars},
                  {"role": "assistant", "content": f"answer {i} " + "a" * turn_chars}]
    return turns + [{"role": "user", "content": "and now?"}]


def _prompt_tokens(engine: FakeEngine) -> int:
    return engine.generations[-1]._prompt_tokens


def test_a_long_chat_leaves_out_enough_exchanges_for_the_reply_to_have_its_room():
    engine = FakeEngine(max_context_tokens=1024)
    turns = _chat(12)                     # ~1,000 fake tokens: fits the context, with almost no room to answer
    fit = FittedStart(engine, turns, SETTINGS, engine.max_context_tokens)
    fit()
    assert fit.dropped > 0 and fit.room == 200
    assert engine.max_context_tokens - _prompt_tokens(engine) >= 200
    assert fit.turns[-1] == turns[-1] and fit.turns == turns[2 * fit.dropped:]
    # the fewest dropped: one exchange fewer would not leave that room
    with pytest.raises(PromptError, match="fewer than 200 for the reply"):
        engine.start_chat(turns[2 * (fit.dropped - 1):], SETTINGS, min_reply_tokens=200)


def test_a_short_chat_is_sent_whole_and_the_room_is_at_most_half_the_context():
    engine = FakeEngine(max_context_tokens=1024)
    fit = FittedStart(engine, _chat(2), replace(SETTINGS, max_new_tokens=512), 1024)
    fit()
    assert fit.dropped == 0 and len(fit.turns) == 5
    assert reply_room(replace(SETTINGS, max_new_tokens=512), 1024) == 512
    assert reply_room(replace(SETTINGS, max_new_tokens=512), 600) == 300
    assert reply_room(replace(SETTINGS, max_new_tokens=1), 600) == 1


def test_a_new_message_too_long_for_the_room_goes_alone_with_the_most_room_there_is():
    engine = FakeEngine(max_context_tokens=1024)
    turns = _chat(3)[:-1] + [{"role": "user", "content": "x" * 3400}]      # ~850 tokens: fits, but not with 200 free
    fit = FittedStart(engine, turns, SETTINGS, 1024)
    fit()
    assert fit.turns == turns[-1:] and fit.dropped == 3


def test_a_new_message_past_the_context_is_refused_as_before():
    engine = FakeEngine(max_context_tokens=1024)
    fit = FittedStart(engine, _chat(1)[:-1] + [{"role": "user", "content": "x" * 6000}], SETTINGS, 1024)
    with pytest.raises(PromptError, match="at most 1024"):
        fit()
    assert not engine.generations


def test_a_refusal_that_is_not_about_length_drops_nothing_and_reaches_the_visitor():
    """Regression (review of this module): every PromptError was taken for "too long", so an old message the engine
    refused for another reason (a lone surrogate) made the search drop every exchange up to it, and the note said
    they were left out to fit the context."""
    from spice_core.errors import PromptError

    class Refusing(FakeEngine):
        def start_chat(self, messages, settings, *, min_reply_tokens=1):
            if any("\ud800" in m["content"] for m in messages):
                raise PromptError("message holds a lone surrogate")
            return super().start_chat(messages, settings, min_reply_tokens=min_reply_tokens)

    engine = Refusing(max_context_tokens=4096)
    turns = _chat(6)
    turns[6] = dict(turns[6], content="bad \ud800 text")
    with pytest.raises(PromptError, match="lone surrogate"):
        FittedStart(engine, turns, SETTINGS, 4096)()
    assert not engine.generations
