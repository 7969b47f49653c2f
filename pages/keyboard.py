"""Keyboard use on every page (a script in the page's head, so each page of the app has it).

Two things Gradio and Plotly leave in the way of Tab:
- A dropdown's option list stayed open when Tab left the menu (Model, Policy, LoRE rank, ...): the blur closed
  it, then Gradio's own keydown handler for that Tab, which runs a tick later, opened it again over the controls
  below. Tab (and the Shift of Shift+Tab) on a menu now goes to the browser alone: it moves focus, and the
  menu's blur still sets its value.
- Each Plotly chart's modebar put eight buttons in the tab order (24 stops on the chat page before its next
  control). A Tab now first takes every modebar button out of the tab order (tabindex -1, before the browser
  moves focus): they stay buttons for the mouse and for screen readers, and the charts keep their hover, zoom
  and reset.
"""
from __future__ import annotations

KEYBOARD_JS = """<script>
(function () {
  window.addEventListener("keydown", function (e) {
    var t = e.target;
    // Shift too: for Shift+Tab, the handler's late run for the Shift reopened the list after Tab's blur.
    if ((e.key === "Tab" || e.key === "Shift") && t && t.matches && t.matches('input[role="combobox"]')) {
      e.stopPropagation();
    }
    if (e.key === "Tab") {
      document.querySelectorAll('.modebar-btn:not([tabindex="-1"])').forEach(function (b) {
        b.setAttribute("tabindex", "-1");
      });
    }
  }, true);
})();
</script>"""
