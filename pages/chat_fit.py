"""Which of a chat's exchanges go to the engine: the newest that fit the model's context with room to reply.

    turns ──► drop what cannot fit by length alone (one pass, no tokenizer)
          ──► the fewest oldest exchanges dropped so that the prompt leaves the reply `reply_room` tokens
              (binary search; the engine counts the tokens and refuses with ContextError)
          ──► none does (the new message alone is that long): every earlier exchange dropped, the most room there is

The room asked for is the reply's token limit, capped at half the context, so a long chat keeps its newest
half of the context instead of answering in a handful of tokens (a prompt that only just fitted left the reply
2 to 11 tokens), and a limit as large as the context does not drop the whole history. The new message always
stays.
"""
from __future__ import annotations

from spice_core.api import RunSettings
from spice_core.errors import ContextError
from pages.messages import drop_oldest_exchanges, n_exchanges

# Without asking the tokenizer, history beyond this many characters per context token cannot fit
# (a byte-level BPE token of the shipped tokenizer covers far fewer): dropped up front, in one pass.
MAX_CHARS_PER_TOKEN = 16


def reply_room(settings: RunSettings, max_context_tokens: int) -> int:
    """Tokens of the context kept free for the reply when old exchanges must go."""
    return max(1, min(settings.max_new_tokens, max_context_tokens // 2))


class FittedStart:
    """``start_fn`` for the runner: starts the engine on the fitted turns and keeps what it chose (``turns``,
    ``dropped``: how many oldest exchanges were left out, ``room``: the reply room asked for)."""

    def __init__(self, engine, turns: list[dict], settings: RunSettings, max_context_tokens: int) -> None:
        self.engine, self.settings = engine, settings
        self.turns, self.dropped = drop_oldest_exchanges(turns, max_chars=MAX_CHARS_PER_TOKEN * max_context_tokens)
        self.room = reply_room(settings, max_context_tokens)

    def _attempt(self, k: int, room: int):
        candidate, _ = drop_oldest_exchanges(self.turns, count=k)
        try:
            return candidate, self.engine.start_chat(candidate, self.settings, min_reply_tokens=room)
        except ContextError as exc:     # too long: fewer exchanges may fit. Any other refusal is the visitor's to see.
            return candidate, exc

    def __call__(self):
        """Linear in the history: O(log n) asks of the engine, each tokenising the already bounded turns once."""
        candidate, result = self._attempt(0, self.room)
        k = 0
        if isinstance(result, ContextError):
            lo, hi = 1, n_exchanges(self.turns) - 1          # the last exchange (the new message) always stays
            best = None
            while lo <= hi:
                mid = (lo + hi) // 2
                c, r = self._attempt(mid, self.room)
                if isinstance(r, ContextError):
                    lo = mid + 1
                else:
                    best, hi = (mid, c, r), mid - 1
            if best is None:           # no drop leaves that room: the most there is, if the message fits at all
                alone = max(0, n_exchanges(self.turns) - 1)
                c, r = self._attempt(alone, 1)
                if isinstance(r, ContextError):
                    raise r
                best = (alone, c, r)
            k, candidate, result = best
        self.turns, self.dropped = candidate, self.dropped + k
        return result
