"""Chat messages: cleaning what users type, and turning the chat history into the engine's turns.

The chat shows three kinds of messages: the user's, the model's, and the app's own notes
(notices such as "message not sent", and run statistics). The app's notes carry
``metadata.title`` and never reach the model. History arrives from Gradio (content as a list of
parts, FACTS.md) or from API clients (plain strings); both are accepted.

Why the user's and the model's text are escaped in the chat (`shown_text`): Gradio's chat renders every
message as Markdown with HTML (sanitised, but an <img> stays an image and loads its src), with no option per
message (`render_markdown=False` is the whole chat's, and still renders HTML), and the app's own notes need
Markdown (bold, links). So a message's text is stored in the chat as Markdown that shows it literally, and
`typed_text` gives back exactly what was typed (or generated) wherever the text leaves the chat: the model's turns,
a retry's message box, a run's label, the /chat API (which takes and gives plain text: `as_shown`, `as_typed`).
In the browser, Gradio's copy button, edit box and message labels read the stored text themselves; the page's
script gives them the text as typed through its twin of `typed_text` (assets/static/spice_chat_text.js). Only the characters that can start Markdown or HTML are escaped, so an
ordinary sentence is stored unchanged.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from pages.owners import valid_run_id

KEEP_CONTROLS = {"\n", "\t"}
BINARY_SHARE = 0.1   # more than this share of control / replacement characters (and at least
BINARY_MIN = 8       # this many): it is binary data, not text


@dataclass(frozen=True)
class CleanMessage:
    text: str
    removed: int            # control / unprintable characters dropped
    example: str            # first one dropped, as U+XXXX ("" if none)


def clean_message(raw) -> CleanMessage:
    """Drop control characters (keeping newlines and tabs), lone surrogates and non-characters."""
    text = raw if isinstance(raw, str) else ("" if raw is None else str(raw))
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    kept, removed, example = [], 0, ""
    for ch in text:
        cat = unicodedata.category(ch)
        bad = (cat == "Cc" and ch not in KEEP_CONTROLS) or cat == "Cs" or ch in "\ufffe\uffff\ufeff"
        if bad:
            removed += 1
            example = example or f"U+{ord(ch):04X}"
        else:
            kept.append(ch)
    return CleanMessage("".join(kept), removed, example)


def problem_with(message: CleanMessage, raw_len: int, max_chars: int, max_context_tokens: int) -> str:
    """Why a cleaned message cannot be sent ("" if it can)."""
    if raw_len > max_chars:
        return (f"Your message is {raw_len:,} characters long; this demo accepts up to {max_chars:,} "
                f"(the model reads at most {max_context_tokens:,} tokens). Shorten it and send again: "
                f"it is still in the box.")
    suspicious = message.removed + message.text.count("\ufffd")
    if suspicious >= BINARY_MIN and suspicious > BINARY_SHARE * max(raw_len, 1):
        return (f"That looks like binary data ({suspicious:,} of {raw_len:,} characters are control or "
                f"undecodable characters, e.g. {message.example or 'U+FFFD'}). Paste text instead.")
    if not message.text.strip():
        if message.removed:
            return "Your message only had control characters, so there is nothing to send. Type some text."
        return "Nothing to send: the message is empty. Type a question and press Enter."
    return ""


# --- the user's and the model's text in the chat ---------------------------------------------------------------
# Escaped wherever they are: they start HTML, an entity, code, emphasis, links, tables, headings, strike-through, LaTeX.
_ALWAYS = frozenset("\\`*_[]<>&#|~$@")
_PUNCT = r"!-/:-@\[-`{-~"                         # ASCII punctuation: what a Markdown backslash escapes
_UNESCAPE = re.compile(rf"\\([{_PUNCT}])")
_LINE_START = re.compile(r"^([ \t]*)([-+=]|\d{1,9}[.)])")  # a list item, a setext underline or a rule at a line's start
_AUTOLINK = re.compile(r"(?i)(?<=www)\.|:(?=//)")      # www. and scheme:// (marked links them without brackets)
_INDENT_COLUMNS = 4                                       # an indented code block, where nothing is interpreted


def _code_lines(lines: list[str]) -> list[bool]:
    """Which lines an indented code block holds (shown as typed, so left as they are): indented 4 columns or more
    and not continuing a paragraph. With every list and quote marker escaped, no other block can hold them."""
    out, prev_code, prev_blank = [], False, True
    for line in lines:
        blank = not line.strip()
        indent = len(line.expandtabs(_INDENT_COLUMNS)) - len(line.expandtabs(_INDENT_COLUMNS).lstrip())
        code = not blank and indent >= _INDENT_COLUMNS and (prev_blank or prev_code)
        out.append(code or (blank and prev_code))
        prev_code, prev_blank = code or (blank and prev_code), blank
    return out


def shown_text(text: str) -> str:
    """``text`` as Markdown that the chat shows literally (no HTML, no Markdown); `typed_text` undoes it."""
    lines = text.split("\n")
    out = []
    for line, code in zip(lines, _code_lines(lines)):
        if code:
            out.append(line)
            continue
        start = _LINE_START.match(line)
        marks = {start.end(2) - 1} if start else set()
        marks |= {m.start() for m in _AUTOLINK.finditer(line)}
        out.append("".join("\\" + ch if ch in _ALWAYS or i in marks else ch for i, ch in enumerate(line)))
    return "\n".join(out)


def typed_text(shown: str) -> str:
    """The text `shown_text` was given: every backslash before punctuation dropped, outside code lines."""
    lines = shown.split("\n")
    return "\n".join(line if code else _UNESCAPE.sub(r"\1", line) for line, code in zip(lines, _code_lines(lines)))


def as_typed(history: list[dict]) -> list[dict]:
    """``history`` (as the chat holds it) with the user's and the model's text as typed or generated (`typed_text`),
    the app's notes as they are: what the /chat API gives back, so that an API client reads plain text."""
    return _with_text(history, typed_text)


def as_shown(history: list[dict]) -> list[dict]:
    """An API client's ``history`` of plain text (`as_typed`'s) as the chat holds it (`shown_text`), so that the text
    it sends back, backslashes and all, reaches the model as it was typed or generated."""
    return _with_text(history, shown_text)


def _with_text(history: list[dict], convert) -> list[dict]:
    """New messages, ``convert`` applied to the content of each that is not an app note; ``history`` is left as is
    (the chat goes on writing into it)."""
    return [m if is_app_note(m) else {**m, "content": convert(m["content"])} for m in normalize_history(history)]


def content_text(content) -> str:
    """Text of a chat message's content: a string, a list of parts, or a single part dict."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return str(content.get("text") or content.get("value") or "") if content.get("type", "text") == "text" else ""
    if isinstance(content, (list, tuple)):
        return "".join(content_text(part) for part in content)
    return ""


def is_app_note(message: dict) -> bool:
    meta = message.get("metadata") or {}
    return isinstance(meta, dict) and bool(meta.get("title"))


def normalize_history(history) -> list[dict]:
    """Chat history as a list of {"role", "content": str, ["metadata"]} dicts; drops what isn't a message. An
    app note keeps its metadata, a reply in flight its run tag (`reply`), nothing else does."""
    out = []
    if not isinstance(history, (list, tuple)):
        return out
    for m in history:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            continue
        msg = {"role": m["role"], "content": content_text(m.get("content"))}
        meta = m.get("metadata")
        if isinstance(meta, dict) and meta.get("title"):
            msg["metadata"] = {k: v for k, v in meta.items() if v is not None}
        elif run_of(m):
            msg["metadata"] = {"id": meta["id"]}
        out.append(msg)
    return out


# A reply in flight (streaming, or waiting for its exact re-run) carries the id of the run that produces it, as its
# metadata id (Gradio's chat shows a message whose metadata has no title as a plain message); once the reply has
# ended, its run note carries the id instead (`run_note`) and the reply is a plain message again. So the conversation
# the browser keeps names the run whose panels a reload brings back (pages.chat_reload), however it was left.
RUN_TAG = "run:"


def reply(content: str, run_id: str = "") -> dict:
    """The model's reply in the chat, tagged with its run while in flight (plain without ``run_id``)."""
    message = {"role": "assistant", "content": content}
    if run_id:
        message["metadata"] = {"id": RUN_TAG + run_id}
    return message


def run_note(title: str, body: str, run_id: str) -> dict:
    """The note under an ended reply (its run's numbers and link), tagged with the run."""
    message = note(title, body)
    message["metadata"]["id"] = RUN_TAG + run_id
    return message


def untag_replies(history: list[dict]) -> None:
    """The replies in ``history`` as plain messages again (their run notes keep the tag)."""
    for m in history:
        if run_of(m) and not is_app_note(m):
            del m["metadata"]


def run_of(message) -> str:
    """The run id a reply or run note is tagged with ("" for any other message, or a malformed tag)."""
    meta = message.get("metadata") if isinstance(message, dict) else None
    tag = meta.get("id") if isinstance(meta, dict) else None
    if not isinstance(tag, str) or not tag.startswith(RUN_TAG) or message.get("role") != "assistant":
        return ""
    return valid_run_id(tag[len(RUN_TAG):])


def restore_kept(saved, cursor: str) -> list[dict]:
    """The conversation a browser kept (a reload or another page must not lose it); [] when it kept none. A reply
    that was streaming when the page went away ended there (the engine stops a reply nobody reads): it keeps
    its text, without the ``cursor``, and a note says so."""
    history = without_transient(normalize_history(saved))
    if not history:
        return []
    last = history[-1]
    if last["role"] == "assistant" and not is_app_note(last) and last["content"].endswith(cursor):
        last["content"] = last["content"].rstrip()[:-1].rstrip()
        if not last["content"]:
            history.pop()
        history.append(note("■ This reply ended when the page was left while it streamed"))
    return history


def engine_turns(history: list[dict]) -> list[dict]:
    """The turns the model sees: user and assistant text as typed or generated (`typed_text`), without the app's
    notes or empty turns, cleaned as a new message is (`clean_message`: an API client's history may hold control
    characters or lone surrogates, which the engine would refuse)."""
    turns = [{"role": m["role"], "content": clean_message(typed_text(m["content"])).text} for m in history
             if not is_app_note(m)]
    return [t for t in turns if t["content"].strip()]


def note(title: str, body: str = "", status: str = "done") -> dict:
    """An app note in the chat (not sent to the model)."""
    return {"role": "assistant", "content": body, "metadata": {"title": title, "status": status}}


# A note about the last action only (a message not sent, a reply still streaming): the next action replaces it, and the
# browser does not keep it (pages.chat_js). Sending an empty message twice used to add two identical notes, kept
# across reloads.
TRANSIENT_TAG = "notice:"


def transient_note(title: str, body: str = "", kind: str = "last-action") -> dict:
    message = note(title, body)
    message["metadata"]["id"] = TRANSIENT_TAG + kind
    return message


def is_transient(message) -> bool:
    meta = message.get("metadata") if isinstance(message, dict) else None
    tag = meta.get("id") if isinstance(meta, dict) else None
    return isinstance(tag, str) and tag.startswith(TRANSIENT_TAG)


def without_transient(history: list[dict]) -> list[dict]:
    return [m for m in history if not is_transient(m)]


def cut_at_last_user(history, index: int | None = None) -> tuple[list[dict], int] | None:
    """(the history, the index of its last user message, at or before ``index`` when given), for a retry or an
    edit; None when there is none."""
    history = normalize_history(history)
    users = [i for i, m in enumerate(history) if m["role"] == "user" and not is_app_note(m)]
    if index is not None:
        users = [i for i in users if i <= index]
    return (history, users[-1]) if users else None


def drop_oldest_turn(turns: list[dict]) -> list[dict] | None:
    """The turns without the oldest exchange (keeping system prompts); None when only the last message is left."""
    system = [t for t in turns if t["role"] == "system"]
    rest = [t for t in turns if t["role"] != "system"]
    if len(rest) <= 1:
        return None
    rest = rest[1:]
    while len(rest) > 1 and rest[0]["role"] != "user":   # start again on a user turn
        rest = rest[1:]
    return system + rest


def keep_newest(history: list[dict], max_messages: int) -> tuple[list[dict], int]:
    """The newest ``max_messages`` messages (starting on a user turn when possible); and how many were cut."""
    if len(history) <= max_messages:
        return history, 0
    kept = history[-max_messages:]
    first_user = next((i for i, m in enumerate(kept) if m.get("role") == "user"), 0)
    kept = kept[first_user:]
    return kept, len(history) - len(kept)


def _exchanges(rest: list[dict]) -> list[list[dict]]:
    """Non-system turns grouped into exchanges, each starting at a user turn (a leading reply forms its own)."""
    groups: list[list[dict]] = []
    for t in rest:
        if t["role"] == "user" or not groups:
            groups.append([t])
        else:
            groups[-1].append(t)
    return groups


def n_exchanges(turns: list[dict]) -> int:
    return len(_exchanges([t for t in turns if t["role"] != "system"]))


def drop_oldest_exchanges(turns: list[dict], *, count: int = 0, max_chars: int | None = None) -> tuple[list[dict], int]:
    """The turns without their ``count`` oldest exchanges, then without the oldest ones beyond
    ``max_chars`` characters in all; system turns and the newest exchange always stay. One pass."""
    system = [t for t in turns if t["role"] == "system"]
    groups = _exchanges([t for t in turns if t["role"] != "system"])
    if not groups:
        return list(turns), 0
    keep_from = min(max(0, count), len(groups) - 1)
    if max_chars is not None:
        total = sum(len(t["content"]) for t in system)
        start = len(groups)
        for i in range(len(groups) - 1, keep_from - 1, -1):
            total += sum(len(t["content"]) for t in groups[i])
            if total > max_chars and i < len(groups) - 1:
                break
            start = i
        keep_from = start
    return system + [t for g in groups[keep_from:] for t in g], keep_from
