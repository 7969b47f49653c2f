"""Driving a number box of the sweep page in a real browser, shared by the browser tests of its slider notes: a number
typed beyond what the box takes is said under its label with the value the box went to, and a sweep started straight
from the box (typed, then a click on Run) runs at that value.

Waits are for the page's own state, never for a fixed time."""
from __future__ import annotations

WAIT_MS = 20_000


class SweepBox:
    """The number box of the slider ``elem_id`` on the sweep page ``url``."""

    def __init__(self, page, url: str, elem_id: str) -> None:
        self.page, self.slider = page, page.locator(f"#{elem_id}")
        self.box = page.locator(f"#{elem_id} input[type=number]")
        page.goto(url.rstrip("/") + "/sweep", wait_until="load")
        self.box.wait_for(state="visible")

    def leave(self, value: str, by: str = "Tab") -> None:
        """Write ``value`` into the box, then leave it: Tab, or a click on the element ``by`` names."""
        self.box.fill(value)
        if by == "Tab":
            self.box.press("Tab")
        else:
            self.page.locator(by).click()

    def says_it_went(self, expect, typed: str, said: str, went: str) -> None:
        """``typed`` and Tab: the slider's note says ``said`` and that the box went to ``went``, which it holds."""
        self.leave(typed)
        expect(self.slider).to_contain_text(said, timeout=WAIT_MS)
        expect(self.slider).to_contain_text(f"The box went to {went}.", timeout=WAIT_MS)
        expect(self.box).to_have_value(went, timeout=WAIT_MS)

    def sweep_typed(self, expect, engine, typed: str, said: str) -> list:
        """Typed and straight on to Run (the click leaves the box), `lru` alone on one prompt: the note says ``said``,
        the sweep ends, and the engine's generations of that sweep are returned."""
        page = self.page
        page.locator("#sweep-prompts textarea").fill("Once upon a time")
        for policy in ("spice_prefetch", "spice"):
            page.locator("#sweep-policies label", has_text=policy).first.click()       # untick: lru stays
        before = len(engine.generations)
        self.leave(typed, "#sweep-run")
        expect(self.slider).to_contain_text(said, timeout=WAIT_MS)
        expect(page.locator("#sweep-status")).to_contain_text("Done", timeout=60_000)
        return engine.generations[before:]
