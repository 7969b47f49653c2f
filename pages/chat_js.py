"""The chat page's browser side: Stop in Send's place while a reply streams, the side bar closed on a narrow
screen, and the message box: a sent message leaves it when its reply starts, and what was typed since stays.

The server used to empty the box with the reply's first update, and keys typed between Send and that update
(a fraction of a second, or as long as the message waits for the engine behind another visitor's reply)
went with it. Now the browser remembers the text it sent (SENT_JS, the chat listener's own js, which hands
the inputs on unchanged) and, at the first chat update that shows the reply started, takes exactly that
text off the front of the box (STARTED_JS). A message the server refuses starts no reply, so it stays in
the box to be fixed; a box edited meanwhile is left as the visitor made it.
"""
from __future__ import annotations

import json

from pages.chat_text import settings_hint
from pages.messages import TRANSIENT_TAG

# Stop's note says what is about to happen; once the reply has ended (`ChatPage._after_reply`) it is out of date
# and the settings hint comes back.
STOPPING_NOTE = "Stopping after the current token…"
STOPPED_NOTE_JS = f"(n) => [n === {json.dumps(STOPPING_NOTE)} ? {json.dumps(settings_hint())} : n]"
# The conversation and settings the browser keeps (a BrowserState, one per model), per tab: {"tabs": {tab id: {"h":
# history, "s": settings, "t": ms}}}, the tab's id in its sessionStorage (which a reload and the app's other pages
# keep). Two tabs of one browser used to share one kept conversation, the last to write winning: a reload brought the
# other tab's back and this one's was gone. A new tab starts from the newest kept conversation and its settings (the
# last used), under its own id. A kept plain list (the format before) counts as one tab's, with no settings.
# Every keep writes both the history and the settings from the page (the settings the server applied, as JSON in a
# hidden box, `ChatPage.kept_settings`), never one of them from what was kept: two keeps triggered together read the
# same kept value, and the last to write wins; each writes the page as it is. A note about the last action only
# (pages.messages.transient_note) is not kept.
KEEP_TABS = 8
_KEEP_PRELUDE = """
  let tab = sessionStorage.getItem('spice-tab');
  if (!tab) { tab = Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
              sessionStorage.setItem('spice-tab', tab); }
  const all = Array.isArray(kept) ? (kept.length ? {before: {h: kept, t: 0}} : {})
    : (kept && typeof kept === 'object' && kept.tabs && typeof kept.tabs === 'object') ? {...kept.tabs} : {};
"""
# (history, settings JSON, kept) -> [kept with this tab's history and settings]; KEEP_NONEMPTY_JS leaves it as it was
# for an empty history (the page's first, empty chat must not overwrite what `restore` is about to read).
_KEEP_BODY = f"""{_KEEP_PRELUDE}
  const transient = (m) => !!(m && m.metadata && String(m.metadata.id || '').startsWith({json.dumps(TRANSIENT_TAG)}));
  let settings = null;
  try {{ settings = JSON.parse(s); }} catch (e) {{ settings = null; }}
  all[tab] = {{h: (Array.isArray(h) ? h : []).filter((m) => !transient(m)), s: settings, t: Date.now()}};
  const ids = Object.keys(all).sort((a, b) => all[b].t - all[a].t).slice(0, {KEEP_TABS});
  return [{{tabs: Object.fromEntries(ids.map((k) => [k, all[k]]))}}];
"""
KEEP_JS = f"(h, s, kept) => {{{_KEEP_BODY}}}"
KEEP_NONEMPTY_JS = f"(h, s, kept) => {{ if (!(h && h.length)) return [kept];{_KEEP_BODY}}}"
# (kept) -> [{h: this tab's history, s: its settings}, else the newest kept tab's, else {h: [], s: null}]: what
# `ChatPage.restore` gets on page load.
PICK_KEPT_JS = f"""(kept) => {{{_KEEP_PRELUDE}
  const newest = Object.values(all).sort((a, b) => b.t - a.t)[0];
  const pick = all[tab] || newest;
  return [pick ? {{h: pick.h || [], s: pick.s || null}} : {{h: [], s: null}}];
}}"""
# After the browser has written what it keeps (BrowserState's change follows its localStorage write): this tab's kept
# conversation's count of run notes (an ended reply's note: a title and its run's tag, pages.messages.run_note) on
# the page's body, so a browser test can tell the conversation is kept with its last reply's note before it reloads,
# on any machine; the tab's kept settings, which a reload brings back; and how many keeps this page has made (a test
# waits for the keep after an action). It runs at every keep while a reply streams: a count over the messages, no
# serialising of them.
MARK_KEPT_JS = """(kept) => {
  const tab = sessionStorage.getItem('spice-tab');
  const mine = kept && kept.tabs && typeof kept.tabs === 'object' ? kept.tabs[tab] : null;
  const h = mine && Array.isArray(mine.h) ? mine.h : [];
  const isNote = (m) => !!(m && m.metadata && m.metadata.title && String(m.metadata.id || '').startsWith('run:'));
  document.body.dataset.spiceKeptRuns = String(h.filter(isNote).length);
  document.body.dataset.spiceKeptSettings = JSON.stringify(mine && mine.s ? mine.s : null);
  document.body.dataset.spiceKeeps = String(+(document.body.dataset.spiceKeeps || 0) + 1);
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
