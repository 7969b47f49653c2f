"""JavaScript snippets the browser tests evaluate in the page (no app import: any browser test can use them)."""
from __future__ import annotations


def text_js(selector: str) -> str:
    """A JS expression for the text of the first element matching `selector`, '' while there is none.

    A `wait_for_function` predicate that throws (reading `innerText` of a missing element) ends Playwright's wait
    at once instead of polling again; on a slower machine an element can appear a moment after the load event
    (regression: the dark-mode contrast test failed in CI that way)."""
    return f"((document.querySelector({selector!r}) || {{}}).innerText || '')"


def value_js(selector: str) -> str:
    """A JS expression for the value of the first input matching `selector`, undefined while there is none (the
    same reason as `text_js`: a predicate that throws ends the wait)."""
    return f"(document.querySelector({selector!r}) || {{}}).value"
