() => {
  // The chat page's text as typed, in the browser (pages/chat.py installs this once per page, on load).
  // The chat holds the visitor's and the model's text as Markdown that shows it literally (pages/messages.py
  // `shown_text`: Gradio's chat renders every message as Markdown with HTML, with no option per message). Gradio's
  // own copy button, its edit box and each message's aria-label take that stored text as it is, backslashes and
  // all. Here each gets the text as typed (or generated) instead, through `typed`, the twin of
  // pages/messages.py `typed_text` (tests/app/test_app_browser_copy.py checks the two agree):
  // - copy: a click on a message's buttons marks the copy Gradio makes in that click (the clipboard write, or the
  //   `copy` event of its fallback without the Clipboard API), which then gets the typed text of the group's own
  //   messages only: Gradio copies a bubble whole, and a reply's bubble also holds the app's notes (its run note, a
  //   note about the message), which are not the reply. A bubble of notes alone is copied as Gradio copies it;
  // - edit: the edit box, once Gradio has filled it with the stored text, holds the typed text. At Submit (or
  //   Cancel), before Gradio reads it, the box is escaped again (`escaped`): Gradio puts the edit into the chat
  //   itself until the server answers, where unescaped HTML would be drawn (an <img> loads its src); the server
  //   gets the typed text back exactly with typed_text (pages/chat.py `prepare_edit`);
  // - aria-label ("user's message: ..."): the typed text after the role.
  if (window.spiceTyped) return [];
  // Python's str.isspace() characters (not JavaScript's \s: no U+FEFF, but U+001C-U+001F and U+0085).
  const SPACE = "\\t\\n\\v\\f\\r \\x1c-\\x1f\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
  const LEADING = new RegExp(`^[${SPACE}]*`), BLANK = new RegExp(`^[${SPACE}]*$`);
  const UNESCAPE = /\\([!-\/:-@\[-`{-~])/g;     // a backslash before ASCII punctuation
  const PUNCT = /[!-\/:-@\[-`{-~]/g;
  const INDENT_COLUMNS = 4;
  const leadingColumns = (line) => {           // len(x) - len(x.lstrip()) of x = line.expandtabs(4)
    let expanded = "", column = 0;
    for (const ch of line) {
      if (ch === "\t") {                        // to the next multiple of 4 columns
        const n = INDENT_COLUMNS - (column % INDENT_COLUMNS);
        expanded += " ".repeat(n);
        column += n;
      } else {
        expanded += ch;
        column = ch === "\r" ? 0 : column + 1;  // expandtabs counts columns from a carriage return again
      }
    }
    return LEADING.exec(expanded)[0].length;
  };
  // pages/messages.py `_code_lines`: the lines of an indented code block, left as they were.
  const codeLines = (lines) => {
    const out = [];
    let prevCode = false, prevBlank = true;
    for (const line of lines) {
      const blank = BLANK.test(line);
      const code = !blank && leadingColumns(line) >= INDENT_COLUMNS && (prevBlank || prevCode);
      prevCode = code || (blank && prevCode);
      prevBlank = blank;
      out.push(prevCode);
    }
    return out;
  };
  const typed = (shown) => {
    if (typeof shown !== "string") return shown;
    const lines = shown.split("\n"), code = codeLines(lines);
    return lines.map((line, i) => (code[i] ? line : line.replace(UNESCAPE, "$1"))).join("\n");
  };
  // Every ASCII punctuation mark escaped, outside code lines: Markdown that shows `text` literally, which `typed`
  // (and typed_text) turn back into `text` exactly (the escapes leave blank lines and indents, so code lines, as
  // they were).
  const escaped = (text) => {
    const lines = text.split("\n"), code = codeLines(lines);
    return lines.map((line, i) => (code[i] ? line : line.replace(PUNCT, "\\$&"))).join("\n");
  };
  window.spiceTyped = typed;
  window.spiceEscaped = escaped;

  const setValue = (box, value) => {            // as typing does: Gradio's binding reads the input event
    Object.getOwnPropertyDescriptor(Object.getPrototypeOf(box), "value").set.call(box, value);
    box.dispatchEvent(new Event("input", { bubbles: true }));
  };
  // The elements of the visitor's and the model's messages in `root`, not the app's notes (Markdown of the app's,
  // drawn as a collapsible "thought" with their title). Gradio's own `thought` class only marks every message of a
  // bubble after its first, so a note that comes first (a control character removed) passed for a message, and a
  // reply after it for a note.
  const MESSAGES = ["user", "bot"].map((role) => `.message > [data-testid="${role}"][aria-label]`).join(", ");
  const ownMessages = (root) => [...root.querySelectorAll(MESSAGES)]
    .filter((el) => !el.querySelector(":scope > .thought-group"));
  const labelled = new WeakMap();                // element -> the aria-label set here
  const labelText = (el) => {                    // the text after "user's message: " (Gradio's label: stored text)
    const label = el.getAttribute("aria-label"), at = label.indexOf(": ") + 2;
    return labelled.get(el) === label ? label.slice(at) : typed(label.slice(at));
  };
  // What a copy of the bubble in `row` gives: its own messages as typed, one a line as Gradio joins them (Gradio
  // copies the app's notes in the bubble too); null for a bubble of notes alone.
  const ownText = (row) => {
    const own = row ? ownMessages(row) : [];
    return own.length ? own.map(labelText).join("\n") : null;
  };

  // A click on a message's buttons: Gradio's copy button writes the clipboard within it; an edit's buttons (Submit,
  // Cancel) follow the edited message's row.
  let copying = false, copied = null;
  document.addEventListener("click", (e) => {
    const buttons = e.target && e.target.closest && e.target.closest("#spice-chat .message-buttons");
    if (!buttons) return;
    const row = buttons.previousElementSibling;
    copying = true;
    copied = ownText(row);
    setTimeout(() => { copying = false; copied = null; }, 0);
    for (const box of row ? row.querySelectorAll("textarea.edit-textarea[data-spice-typed]") : []) {
      setValue(box, escaped(box.value));
    }
  }, true);
  if (navigator.clipboard && navigator.clipboard.writeText) {
    const write = navigator.clipboard.writeText.bind(navigator.clipboard);
    navigator.clipboard.writeText = (text) => write(copying && copied !== null ? copied : text);
  }
  document.addEventListener("copy", (e) => {     // the fallback: a selected textarea and execCommand("copy")
    const box = e.target;
    if (!copying || copied === null || !box || box.tagName !== "TEXTAREA" || !e.clipboardData) return;
    e.clipboardData.setData("text/plain", copied);
    e.preventDefault();
  }, true);

  // Edit boxes and aria-labels, as Gradio (re)draws them.
  const fix = (chat) => {
    for (const box of chat.querySelectorAll("textarea.edit-textarea:not([data-spice-typed])")) {
      if (!box.value) {                          // not filled yet (a message is never empty): look again
        requestAnimationFrame(() => fix(chat));
        continue;
      }
      box.dataset.spiceTyped = "1";
      setValue(box, typed(box.value));
    }
    for (const el of ownMessages(chat)) {
      const label = el.getAttribute("aria-label");
      if (labelled.get(el) === label) continue;
      const at = label.indexOf(": ") + 2;        // "user's message: " + the stored text
      const mine = label.slice(0, at) + typed(label.slice(at));
      labelled.set(el, mine);
      if (mine !== label) el.setAttribute("aria-label", mine);
    }
  };
  const chat = document.getElementById("spice-chat");
  if (chat) {
    fix(chat);
    // A streamed reply redraws its message at every token: look once a frame, not once a mutation.
    let queued = false;
    const soon = () => {
      if (queued) return;
      queued = true;
      requestAnimationFrame(() => { queued = false; fix(chat); });
    };
    new MutationObserver(soon).observe(chat, {
      childList: true, subtree: true, attributes: true, attributeFilter: ["aria-label"],
    });
  }
  return [];
}
