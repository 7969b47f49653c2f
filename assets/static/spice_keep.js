// What the chat keeps in this browser across reloads and the app's other pages: per tab, its conversation and
// settings (pages/chat_js.py builds the chat page's calls to `window.spiceKeep`; this script sits in every page's
// head, so it is there before any of them).
//
// One localStorage entry per tab and model, `<prefix>:<tab id>` = {"h": history, "s": settings, "t": ms}, and a tab
// writes only its own. The store used to be one value holding every tab's entry, which each tab read when its
// page loaded and wrote back whole: a tab's write put back the others' entries as they were when it loaded, so one
// tab undid or dropped another's (and pruned all but the 8 newest, live or not). Now a write is one setItem of the
// tab's own entry, nothing is read back before it, and an entry goes only when nobody wrote it for MAX_AGE_MS
// (pruned when a page loads), or, when the browser's storage is full, one untouched for IDLE_MS, oldest first.
//
// The tab's id lives in its sessionStorage, which a reload and the app's other pages keep. A duplicated tab starts
// with a copy of its original's sessionStorage, id included, and the two would write one entry: so a page asks the
// other pages (a BroadcastChannel) whether one of them holds its id, and takes a new id when one answers.
(function () {
  if (window.spiceKeep) return;
  const TAB_KEY = "spice-tab";
  const MAX_AGE_MS = 30 * 24 * 3600 * 1000;
  const IDLE_MS = 3600 * 1000;
  const newId = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
  let tab = null;

  function tabId() {
    if (tab) return tab;
    tab = sessionStorage.getItem(TAB_KEY);
    if (!tab) {
      tab = newId();
      sessionStorage.setItem(TAB_KEY, tab);
    }
    claim();
    return tab;
  }

  function claim() {
    if (document.body) document.body.dataset.spiceTab = tab;
    if (!("BroadcastChannel" in window)) return;
    const channel = new BroadcastChannel("spice-tabs");
    const nonce = newId();
    channel.onmessage = (e) => {
      const m = e.data || {};
      if (m.ask === tab) {
        channel.postMessage({ held: tab, nonce: m.nonce });
      } else if (m.held === tab && m.nonce === nonce) {      // a live page holds this id: this one is a copy
        tab = newId();
        sessionStorage.setItem(TAB_KEY, tab);
        if (document.body) document.body.dataset.spiceTab = tab;
      }
    };
    channel.postMessage({ ask: tab, nonce });
  }

  // [key, ms written] of every entry under `prefix` (an unreadable one counts as never written).
  function entries(prefix) {
    const out = [];
    for (let i = 0; i < localStorage.length; i++) {
      const key = localStorage.key(i);
      if (!key || !key.startsWith(prefix + ":")) continue;
      let t = 0;
      try { t = +JSON.parse(localStorage.getItem(key)).t || 0; } catch (e) { t = 0; }
      out.push([key, t]);
    }
    return out;
  }

  function write(prefix, key, value) {
    for (;;) {
      try {
        localStorage.setItem(key, value);
        return true;
      } catch (e) {
        const now = Date.now();
        const idle = entries(prefix).filter(([k, t]) => k !== key && now - t > IDLE_MS).sort((a, b) => a[1] - b[1]);
        if (!(e && e.name === "QuotaExceededError") || !idle.length) {
          console.warn("spice: the conversation was not kept in this browser", e);
          return false;
        }
        localStorage.removeItem(idle[0][0]);
      }
    }
  }

  const tagged = (m, tag) => !!(m && m.metadata && String(m.metadata.id || "").startsWith(tag));

  // Marks on the page's body, for the browser tests to wait on (never a fixed sleep): how many run notes (an ended
  // reply's note: a title and its run's tag) and which settings this tab has kept, and how many keeps so far.
  function mark(config, history, settings) {
    const b = document.body.dataset;
    const runNote = (m) => !!(m && m.metadata && m.metadata.title) && tagged(m, config.run);
    b.spiceKeptRuns = String(history.filter(runNote).length);
    b.spiceKeptSettings = JSON.stringify(settings);
    b.spiceKeeps = String(+(b.spiceKeeps || 0) + 1);
  }

  // A browser that refuses its storage (a blocked site, a sandboxed frame) keeps nothing; the console says why.
  const guarded = (fn, otherwise) => (...args) => {
    try {
      return fn(...args);
    } catch (e) {
      console.warn("spice: this browser's storage is not available; the conversation is not kept", e);
      return otherwise;
    }
  };

  window.spiceKeep = {
    // This tab's conversation `h` (without notes about the last action only) and settings `s` (JSON text), as
    // the page shows them now. `nonEmpty`: leave what was kept as it is when `h` is empty (a page's first, empty
    // chat must not overwrite what the load is about to bring back).
    keep: guarded((config, h, s, nonEmpty) => {
      if (nonEmpty && !(Array.isArray(h) && h.length)) return;
      const history = (Array.isArray(h) ? h : []).filter((m) => !tagged(m, config.transient));
      let settings = null;
      try { settings = JSON.parse(s); } catch (e) { settings = null; }
      write(config.prefix, `${config.prefix}:${tabId()}`, JSON.stringify({ h: history, s: settings, t: Date.now() }));
      mark(config, history, settings);
    }),
    // On page load: this tab's entry, else the newest kept (a new tab starts from the last conversation and
    // settings used), else nothing, as JSON text {"h": history, "s": settings}. Prunes the stale entries.
    pick: guarded((config) => {
      const now = Date.now(), own = `${config.prefix}:${tabId()}`;
      if (config.legacy) localStorage.removeItem(config.legacy);
      const fresh = [];
      for (const [key, t] of entries(config.prefix)) {
        if (key === own || now - t <= MAX_AGE_MS) fresh.push([key, t]);
        else localStorage.removeItem(key);
      }
      const newest = fresh.sort((a, b) => b[1] - a[1])[0];
      const key = localStorage.getItem(own) !== null ? own : newest && newest[0];
      let kept = null;
      try { kept = key ? JSON.parse(localStorage.getItem(key)) : null; } catch (e) { kept = null; }
      return JSON.stringify({ h: (kept && kept.h) || [], s: (kept && kept.s) || null });
    }, JSON.stringify({ h: [], s: null })),
  };
})();
