"""Who owns a run: one visitor's identity across the app's pages, and the app's book of runs.

    browser ──(first page load)──► OWNER_JS: a random 128-bit token in localStorage, mirrored into
                                   the `spice_owner` cookie (sent with every request of that browser)
    any event ──► owner_of(request) ──► cookie token if well formed, else the event's session_hash
    chat / sweep ──► RunBook.add(run_id, owner, label) ──► list_for(owner), may_open(run_id, owner)

Why a cookie token and not `session_hash`: Gradio gives every page of a multipage app its own
session, so a run made on the chat page would be invisible on /trace. A token kept by the
browser is the same on every page and in every tab of that browser, and it is never shown to
anyone else. Why not `gr.BrowserState`: it becomes a required input of every API endpoint.
Clients that send no cookie (API clients, browsers that refuse the cookie, e.g. when the Space
is embedded in a page of another site) fall back to the event's session: still isolated from
everyone else, just not shared across pages. A run can be opened by someone else only if its
owner pressed "Share" on it (then its link, `/trace?run=<id>`, opens it read-only); shared runs
are never listed to others.

Knows nothing of the engine: the pages intersect this book with the engine's own run list.
"""
from __future__ import annotations

import html
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

OWNER_COOKIE = "spice_owner"
_TOKEN = re.compile(r"^[0-9a-f]{32}$")
RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")   # what the engine's run ids look like (checked before any lookup)
RUN_ID_RULE = "a run id is 1 to 64 letters, digits, - or _, e.g. 03c3b90521"     # RUN_ID, in words
MAX_RUNS_PER_OWNER = 64
MAX_RUNS_TOTAL = 1024

# Runs in the page's <head>: creates the token once per browser and refreshes the cookie (a year).
# SameSite=None; Secure on https, so that the cookie also travels when the app is embedded in a
# page of another site (Hugging Face shows Spaces in an iframe); Strict on plain http (local use).
OWNER_JS = """<script>
(function () {
  try {
    var key = "spice_owner", token = localStorage.getItem(key);
    if (!/^[0-9a-f]{32}$/.test(token || "")) {
      var b = new Uint8Array(16); crypto.getRandomValues(b);
      token = Array.from(b, function (x) { return x.toString(16).padStart(2, "0"); }).join("");
      localStorage.setItem(key, token);
    }
    var attrs = location.protocol === "https:" ? "; SameSite=None; Secure" : "; SameSite=Strict";
    document.cookie = key + "=" + token + "; path=/; max-age=31536000" + attrs;
  } catch (e) { /* no storage: the app falls back to one session per page */ }
})();
</script>"""


def owner_of(request) -> str:
    """The visitor behind an event: the browser's token, else the event's session, else "" (unknown)."""
    if request is None:
        return ""
    browser = browser_owner(request)
    if browser:
        return browser
    session = getattr(request, "session_hash", None) or ""
    return f"session:{session}" if session else ""


def browser_owner(request) -> str:
    """"browser:<token>" when the request carries a well-formed owner cookie, else ""."""
    try:
        token = (request.cookies or {}).get(OWNER_COOKIE, "")
    except AttributeError:
        token = ""
    return "browser:" + token if isinstance(token, str) and _TOKEN.match(token) else ""


def valid_run_id(run_id) -> str:
    """The run id stripped, or "" when it cannot be one (never reaches the engine or the disk then)."""
    if not isinstance(run_id, str):
        return ""
    run_id = run_id.strip()
    return run_id if RUN_ID.match(run_id) else ""


def esc(value) -> str:
    """Any value as text safe inside HTML (and inside Markdown that allows HTML)."""
    return html.escape(str(value), quote=False)


@dataclass(frozen=True)
class RunEntry:
    run_id: str
    owner: str
    label: str
    seq: int               # order of start (run ids carry none)
    shared: bool = False


class RunBook:
    """Thread-safe record of which visitor started which run, with what label; bounded.

    Worker threads add runs while page loads list them, so every access holds one lock and
    readers get copies.
    """

    def __init__(self, *, per_owner: int = MAX_RUNS_PER_OWNER, total: int = MAX_RUNS_TOTAL) -> None:
        self._lock = threading.Lock()
        self._runs: OrderedDict[str, RunEntry] = OrderedDict()
        self._seq = 0
        self._per_owner = per_owner
        self._total = total

    def add(self, run_id: str, owner: str, label: str) -> None:
        if not run_id:
            return
        with self._lock:
            self._seq += 1
            self._runs[run_id] = RunEntry(run_id, owner, label, self._seq)
            mine = [k for k, e in self._runs.items() if e.owner == owner]
            for k in mine[: max(0, len(mine) - self._per_owner)]:
                del self._runs[k]
            while len(self._runs) > self._total:
                self._runs.popitem(last=False)

    def get(self, run_id: str) -> RunEntry | None:
        with self._lock:
            return self._runs.get(run_id)

    def label(self, run_id: str) -> str:
        entry = self.get(run_id)
        return entry.label if entry else ""

    def list_for(self, owner: str) -> list[RunEntry]:
        """This owner's runs, newest first (an unknown owner has none)."""
        if not owner:
            return []
        with self._lock:
            return sorted((e for e in self._runs.values() if e.owner == owner), key=lambda e: -e.seq)

    def drop(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    def may_open(self, run_id: str, owner: str) -> bool:
        entry = self.get(run_id)
        return entry is not None and (entry.shared or (bool(owner) and entry.owner == owner))

    def is_owner(self, run_id: str, owner: str) -> bool:
        entry = self.get(run_id)
        return entry is not None and bool(owner) and entry.owner == owner

    def set_shared(self, run_id: str, owner: str, shared: bool) -> bool:
        """Only the owner may share or unshare a run; True if it changed hands that way."""
        with self._lock:
            entry = self._runs.get(run_id)
            if entry is None or not owner or entry.owner != owner:
                return False
            self._runs[run_id] = replace(entry, shared=shared)
            return True
