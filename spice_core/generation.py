"""Token-level generation helpers: prompt building, sampling, stop strings, text streaming.

Pure functions over tensors and strings; the decode loop itself lives in engine.py.
"""
from __future__ import annotations

import numbers
import re

import torch

from spice_core.errors import PromptError


def build_prompt_ids(tokenizer, *, prompt: str | None = None, messages: list[dict] | None = None) -> list[int]:
    """Token ids for a plain prompt or a chat (the tokenizer's chat template when it has one)."""
    if tokenizer is None:
        raise PromptError("this model has no tokenizer files: copy its tokenizer (tokenizer.json, tokenizer_config.json) "
                          "into the checkpoint's folder, or pass token ids to the Python API's start_ids")
    if messages is not None:
        msgs = _chat_messages(messages)
        if not msgs or not any(m["content"].strip() for m in msgs if m["role"] == "user"):
            raise PromptError("the message is empty: type some text")
        for i, m in enumerate(msgs, 1):
            _check_unicode(m["content"], f"message {i}")
        if _spells_a_marker(tokenizer, msgs):
            return _chat_ids_literal(tokenizer, msgs)
        text = _chat_text(tokenizer, msgs)
        templated = bool(getattr(tokenizer, "chat_template", None))
    else:
        if prompt is not None and not isinstance(prompt, str):
            raise PromptError(f"the prompt is not text ({type(prompt).__name__}): pass a str, or token ids to start_ids")
        if prompt is None or not prompt.strip():
            raise PromptError("the prompt is empty: pass some text with --prompt")
        _check_unicode(prompt, "the prompt")
        text, templated = prompt, False
    # A chat template writes the special tokens it wants (its {{ bos_token }}); plain text gets the tokenizer's own,
    # as `tokenizer(prompt)` before `generate` does (a BOS for Mixtral's and DeepSeek-V2's base tokenizers).
    # verbose=False: a prompt past the model's length is refused by the engine in its own words, without
    # transformers' "indexing errors" warning first.
    ids = tokenizer(text, add_special_tokens=not templated, verbose=False)["input_ids"]
    if not ids:
        raise PromptError("the prompt produced no tokens: pass some text")
    return list(ids)


def _check_unicode(text: str, what: str) -> None:
    """PromptError for text that is not valid Unicode (a lone surrogate, e.g. from a bad decode): the tokenizer
    cannot encode it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PromptError(f"{what} holds {e.object[e.start]!r} at character {e.start}, a lone surrogate that is not "
                          "text: decode the input as UTF-8 (errors='replace') or remove it") from None


def prompt_id_list(input_ids) -> list:
    """Token ids as a list: a list or tuple, or a 1-D numpy array or torch tensor (what tokenizers return).
    PromptError for anything else (a generator, a 2-D batch, a string)."""
    if hasattr(input_ids, "tolist") and not isinstance(input_ids, (list, tuple)):
        if getattr(input_ids, "ndim", 1) != 1:
            raise PromptError(f"input_ids has {input_ids.ndim} dimensions: pass one prompt's ids (1-D), e.g. "
                              "tokenizer(text)['input_ids'] or ids[0] of a batch")
        input_ids = input_ids.tolist()
    if isinstance(input_ids, (str, bytes)) or not isinstance(input_ids, (list, tuple)):
        raise PromptError(f"input_ids is a {type(input_ids).__name__}: pass a list of token ids (start_prompt takes "
                          "text)")
    return list(input_ids)


def _chat_text(tokenizer, msgs: list[dict]) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    return "\n".join(m["content"] for m in msgs)


def _spells_a_marker(tokenizer, msgs: list[dict]) -> bool:
    """Does a message's text spell one of the tokenizer's added tokens (e.g. "<|assistant|>")?"""
    markers = [t for t in getattr(tokenizer, "get_added_vocab", dict)() if t]
    return any(t in m["content"] for m in msgs for t in markers)


def _chat_ids_literal(tokenizer, msgs: list[dict]) -> list[int]:
    """A chat whose messages spell added tokens: only the template's own markers become those tokens; what a user
    typed stays text (typing "<|assistant|>" would otherwise open an assistant turn of the user's writing). The
    template is rendered around placeholders, cut at its markers, and each stretch between two markers, with the
    messages' text put back, is tokenized as the tokenizer tokenizes any such stretch (added tokens are cut out
    first), with added tokens not recognised in it."""
    marks = [f"\ue000{i}\ue001" for i in range(len(msgs))]       # private-use characters: in no message
    text = _chat_text(tokenizer, [dict(m, content=mark) for m, mark in zip(msgs, marks)])
    added = sorted((t for t in tokenizer.get_added_vocab() if t), key=len, reverse=True)
    ids = []
    for k, piece in enumerate(re.split("(" + "|".join(map(re.escape, added)) + ")", text)):
        if k % 2:                              # one of the template's markers
            ids.append(tokenizer.convert_tokens_to_ids(piece))
        elif piece:
            for m, mark in zip(msgs, marks):
                piece = piece.replace(mark, m["content"])
            ids += tokenizer(piece, add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"]
    return ids


def check_prompt_ids(input_ids, vocab: int) -> None:
    """PromptError naming the first of ``input_ids`` that is not a token id of a ``vocab``-token model."""
    bad = next((i for i, t in enumerate(input_ids) if isinstance(t, bool) or not isinstance(t, numbers.Integral)
                or not 0 <= t < vocab), None)
    if bad is not None:
        raise PromptError(f"token {bad} of the prompt is {str(input_ids[bad])[:20]!r}: token ids are integers in "
                          f"[0, {vocab})")


CHAT_ROLES = ("system", "user", "assistant")


def _chat_messages(messages) -> list[dict]:
    """``messages`` as {"role", "content": str} dicts; PromptError naming the first that is not a chat message."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, (list, tuple)):
        raise PromptError(f"messages is a {type(messages).__name__}: pass a list of "
                          '{"role": "user", "content": "..."} dicts')
    out = []
    for i, m in enumerate(messages, 1):
        if not isinstance(m, dict):
            raise PromptError(f"message {i} is a {type(m).__name__}: each is a "
                              '{"role": "user"|"assistant"|"system", "content": "..."} dict')
        if m.get("role") not in CHAT_ROLES:
            raise PromptError(f"message {i} has role {str(m.get('role'))[:20]!r}: use one of {', '.join(CHAT_ROLES)}")
        out.append({"role": m["role"], "content": _content_text(m.get("content"))})
    return out


def _content_text(content) -> str:
    """Gradio-style content may be a string or a list of parts ({'type': 'text', 'text': ...})."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and p.get("type", "text") == "text":
                parts.append(str(p.get("text", "")))
        return "".join(parts)
    return str(content)


# The checkpoint's generation_config fields that change a greedy token and that the engine does not apply (it applies
# repetition_penalty, `checkpoint_repetition_penalty`): a run on a checkpoint that sets one says so.
UNAPPLIED_GENERATION_FIELDS = ("no_repeat_ngram_size", "bad_words_ids", "min_new_tokens", "min_length",
                               "suppress_tokens", "begin_suppress_tokens", "sequence_bias", "forced_bos_token_id",
                               "forced_eos_token_id")


def checkpoint_repetition_penalty(generation_config) -> float:
    """The repetition penalty `generate` applies by default for this checkpoint (1.0: none)."""
    value = getattr(generation_config, "repetition_penalty", None)
    return float(value) if isinstance(value, numbers.Real) and value > 0 else 1.0


def unapplied_generation_fields(generation_config) -> list[str]:
    """``name=value`` of each field of `UNAPPLIED_GENERATION_FIELDS` the checkpoint sets to something active."""
    out = []
    for name in UNAPPLIED_GENERATION_FIELDS:
        value = getattr(generation_config, name, None)
        if value is None or value is False or value == 0 or value == [] or value == {}:
            continue
        out.append(f"{name}={value!r}")
    return out


class RepetitionPenalty:
    """transformers' `RepetitionPenaltyLogitsProcessor` for one sequence: each token id seen so far (prompt and
    generated) has its logit divided by ``penalty`` where positive, multiplied where negative, in float32 as
    `generate` scores. Seen ids are kept as a mask on the logits' device, one write per token."""

    def __init__(self, penalty: float, ids) -> None:
        self.penalty = float(penalty)
        self._ids = list(ids)
        self._seen: torch.Tensor | None = None      # made at the first logits: their size and device

    def saw(self, token: int) -> None:
        if self._seen is None:
            self._ids.append(int(token))
        elif 0 <= token < self._seen.numel():
            self._seen[token] = True

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [V] (any float dtype) -> penalised float32 logits [V]."""
        scores = logits.float()
        if self._seen is None:
            self._seen = torch.zeros(scores.numel(), dtype=torch.bool, device=scores.device)
            ids = [i for i in self._ids if 0 <= i < scores.numel()]     # ids past the logits are not scored
            if ids:
                self._seen[torch.tensor(ids, device=scores.device)] = True
            self._ids = []
        penalised = torch.where(scores < 0, scores * self.penalty, scores / self.penalty)
        return torch.where(self._seen, penalised, scores)


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> int:
    """logits [V] -> token id. temperature 0 is greedy (argmax, ties to the lowest id, like transformers)."""
    if temperature <= 0.0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        keep = cum - sorted_p < top_p          # always keeps the most likely token
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        probs = probs / probs.sum()
    return int(torch.multinomial(probs.cpu(), 1, generator=generator).item())


class TextStreamer:
    """Turns generated ids into text deltas, holding back what could still become a stop
    string or is an incomplete UTF-8 sequence."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.emitted = 0
        self.text = ""
        self.stopped = False

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        for s in self.stop:
            i = text.find(s)
            if i >= 0:
                text, self.stopped = text[:i], True
        self.text = text
        safe = len(text)
        if not self.stopped:
            if text.endswith("\ufffd"):
                safe = len(text.rstrip("\ufffd"))
            for s in self.stop:
                for k in range(min(len(s) - 1, len(text)), 0, -1):
                    if text.endswith(s[:k]):
                        safe = min(safe, len(text) - k)
                        break
        delta = text[self.emitted:safe] if safe > self.emitted else ""
        self.emitted = max(self.emitted, safe)
        return delta

    def flush(self) -> str:
        delta = self.text[self.emitted:]
        self.emitted = len(self.text)
        return delta
