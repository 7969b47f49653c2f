"""The chat page's browser side: Stop in Send's place while a reply streams, the side bar closed on a narrow
screen, what the browser keeps per tab (the calls to assets/static/spice_keep.js), the text as typed where Gradio
gives back the chat's stored text (assets/static/spice_chat_text.js), and the message box: a sent message leaves it
when its reply starts, and what was typed since stays.

The server used to empty the box with the reply's first update, and keys typed between Send and that update
(a fraction of a second, or as long as the message waits for the engine behind another visitor's reply)
went with it. Now the browser remembers the text it sent (SENT_JS, the chat listener's own js, which hands
the inputs on unchanged) and, at the first chat update that shows the reply started, takes exactly that
text off the front of the box (STARTED_JS). A message the server refuses starts no reply, so it stays in
the box to be fixed; a box edited meanwhile is left as the visitor made it.
"""
from __future__ import annotations

import json
from pathlib import Path

from pages.chat_text import settings_hint
from pages.messages import RUN_TAG, TRANSIENT_TAG

STATIC = Path(__file__).resolve().parents[1] / "assets" / "static"
# The visitor's and the model's text as typed: copy, edit box and aria-labels (one script per page, installed on load).
TYPED_TEXT_JS = (STATIC / "spice_chat_text.js").read_text()

# Stop's note says what is about to happen; once the reply has ended (`ChatPage._after_reply`) it is out of date
# and the settings hint comes back.
STOPPING_NOTE = "Stopping after the current token…"
STOPPED_NOTE_JS = f"(n) => [n === {json.dumps(STOPPING_NOTE)} ? {json.dumps(settings_hint())} : n]"
# The conversation and settings the browser keeps, per tab and model: localStorage, one entry per tab that only that
# tab writes (assets/static/spice_keep.js says how, and why not one value for all tabs as before). A new tab starts
# from the newest kept conversation and its settings (the last used), under its own id. Every keep writes both the
# history and the settings from the page (the settings the server applied, as JSON in a hidden box,
# `ChatPage.kept_settings`), never one of them from what was kept: two keeps triggered together each write the page
# as it is. A note about the last action only (pages.messages.transient_note) is not kept.
KEEP_PREFIX = "spice-chat-v2"
LEGACY_KEY = "spice-chat-v1"        # the one value of before (Gradio's BrowserState, unreadable after a restart)
KEEP_STORE_JS = f"<script>\n{(STATIC / 'spice_keep.js').read_text()}</script>"     # the page's head (app.py)


def _keep_config(key: str) -> str:
    return json.dumps({"prefix": KEEP_PREFIX + key, "legacy": LEGACY_KEY + key, "transient": TRANSIENT_TAG,
                       "run": RUN_TAG})


def keep_js(key: str, non_empty: bool = False) -> str:
    """(history, settings JSON) -> []: this tab keeps the page's conversation and settings (for the model pages
    ``key``); with ``non_empty``, an empty history leaves what was kept as it is (the page's first, empty chat must
    not overwrite what `pages.chat_keep.KeptChat.restore` is about to read)."""
    return f"(h, s) => {{ window.spiceKeep.keep({_keep_config(key)}, h, s, {json.dumps(non_empty)}); return []; }}"


def pick_kept_js(key: str) -> str:
    """(anything) -> [JSON text {"h": history, "s": settings}]: this tab's kept conversation and settings, else the
    newest kept, else none; what `pages.chat_keep.KeptChat.restore` gets on page load."""
    return f"() => [window.spiceKeep.pick({_keep_config(key)})]"


# After Stop or New chat: when the server found nothing of this session streaming ("1"), click the hidden button that
# cancels what the page may still wait for (its message or Auto tune queued behind another visitor's reply; nothing,
# harmlessly, when it waits for nothing). Not gated on the page's busy mark: New chat's own chain clears that mark.
WITHDRAW_JS = """(withdrawn) => {
  if (withdrawn === '1') {
    const button = document.querySelector('#spice-withdraw');
    if (button) button.click();
  }
  return [];
}"""
BUSY_ON_JS = "() => { document.body.classList.add('spice-generating'); return []; }"
BUSY_OFF_JS = "() => { document.body.classList.remove('spice-generating'); return []; }"
# On a narrow screen the settings sidebar starts closed, so the chat and the examples are usable at once.
NARROW_JS = """() => {
  if (window.innerWidth >= 900) return [];
  const close = () => {
    const bar = document.querySelector('#spice-controls');
    const side = bar && bar.closest('.sidebar');
    const btn = side && side.querySelector('button.toggle-button, button[aria-label*="idebar"]');
    if (side && side.classList.contains('open') && btn) { btn.click(); return true; }
    return !!(side && !side.classList.contains('open'));
  };
  if (!close()) { let n = 0; const t = setInterval(() => { if (close() || ++n > 40) clearInterval(t); }, 50); }
  return [];
}"""

# The chat listener's js: it receives the listener's inputs (message, chat, ...) and returns them to the server.
SENT_JS = """(...inputs) => {
  const users = (h) => (Array.isArray(h) ? h.filter((m) => m && m.role === 'user').length : 0);
  window.spiceSent = {text: typeof inputs[0] === 'string' ? inputs[0] : '', users: users(inputs[1])};
  return inputs;
}"""

# On every chat change. A reply has started when the chat ends with the reply streaming (its cursor) or holds one
# more user message than when the message was sent (a reply that came whole; at the history's limit older
# messages leave as the new one comes, so that count alone could miss it).
STARTED_JS = """(history) => {
  const sent = window.spiceSent;
  if (!sent || !Array.isArray(history)) return [];
  const text = (m) => {
    const c = m && m.content;
    if (typeof c === 'string') return c;
    return (Array.isArray(c) ? c : [c]).map((p) => (p && typeof p.text === 'string' ? p.text : '')).join('');
  };
  const last = history[history.length - 1];
  const streaming = last && last.role === 'assistant' && text(last).endsWith('%s');
  const users = history.filter((m) => m && m.role === 'user').length;
  if (!streaming && users <= sent.users) return [];
  window.spiceSent = null;
  const box = document.querySelector('#spice-msg textarea');
  if (box && sent.text && box.value.startsWith(sent.text)) {
    const setter = Object.getOwnPropertyDescriptor(Object.getPrototypeOf(box), 'value').set;
    setter.call(box, box.value.slice(sent.text.length));
    box.dispatchEvent(new Event('input', {bubbles: true}));
  }
  return [];
}"""


def started_js(cursor: str) -> str:
    """STARTED_JS for a chat whose streaming reply ends with ``cursor``."""
    return STARTED_JS % cursor.strip()
