"""Links to the app's own pages: the public address they live at, and the page a wrong address gets.

    an event's request ──► root_url ──► "https://host[/root-path]" ──► page_link: a run's share link
    GET /no-such-page from a browser ──► not_found ──► a small HTML page (404) linking the app's pages
    any other 404 (Gradio's API routes, clients that do not ask for HTML) ──► FastAPI's own {"detail": ...}

Why Gradio's own resolution (`route_utils.get_root_url`): behind a reverse proxy or on a Space the request
reaches the app on 127.0.0.1 under another host, scheme and path. Gradio reads the forwarded headers and the
app's root path (launch(root_path=...), GRADIO_ROOT_PATH, the ASGI server's root_path or a mount path) that way
for its own page config, so the links made here point where Gradio's pages do. An event's request is the call
to Gradio's API ("/gradio_api/..."), so its route is that path's tail from the API prefix.

Knows nothing of the engine; knows Gradio's app only through `get_blocks().pages` and `root_path` (gradio 6.31).
"""
from __future__ import annotations

import difflib
import html
import logging
from urllib.parse import urlencode

from fastapi.exception_handlers import http_exception_handler
from gradio import route_utils
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

log = logging.getLogger(__name__)

HOME_TITLE = "Chat"          # what the app's root page is (Gradio names it "Home")


def root_url(request) -> str:
    """The app's public root URL without a trailing slash, from an event's `gr.Request` or a route's starlette
    request; "" when the request carries no URL (a test's stand-in, a pickled request): links then stay relative."""
    http = request if isinstance(request, Request) else getattr(request, "request", None)
    if not isinstance(http, Request):
        return ""
    path = http.url.path
    at = path.find(route_utils.API_PREFIX)
    route = path[at:] if at >= 0 else path
    app = http.scope.get("app")
    blocks = app.get_blocks() if hasattr(app, "get_blocks") else None
    root_path = (getattr(app, "root_path", "") or http.scope.get("root_path")
                 or getattr(blocks, "custom_mount_path", None))
    try:
        return route_utils.get_root_url(request=http, route_path=route, root_path=root_path or None)
    except ValueError as exc:        # a forwarded host that is no host: the link stays relative
        log.info("no root URL for this request: %s", exc)
        return ""


def page_link(request, page: str, **query: str) -> str:
    """The full link to one of the app's pages (``page`` "" for the root), with ``query``; relative where
    `root_url` has no answer."""
    tail = page.strip("/") + (f"?{urlencode(query)}" if query else "")
    root = root_url(request)
    return f"{root}/{tail}" if root else tail or "./"


def app_pages(request: Request) -> list[tuple[str, str]]:
    """(path, title) of every page of the app serving ``request``, the root first ("" where there is no app)."""
    app = request.scope.get("app")
    blocks = app.get_blocks() if hasattr(app, "get_blocks") else None
    pages = getattr(blocks, "pages", None) or [("", "Home", True)]
    return [(path, HOME_TITLE if path == "" else title) for path, title, *_ in pages]


def not_found_html(asked: str, pages: list[tuple[str, str]], root: str) -> str:
    """The 404 page: which address had no page, the closest page's name when one is close, every page linked."""
    names = {path: title for path, title in pages}
    word = asked.strip("/").rsplit("/", 1)[-1].lower()
    close = [p for p in names if p and len(word) >= 3 and (word in p.lower() or p.lower() in word)]
    close = close or difflib.get_close_matches(word, [p for p in names if p], n=1, cutoff=0.6)
    href = lambda path: html.escape(f"{root}/{path}", quote=True)     # noqa: E731
    items = "".join(f'<li><a href="{href(path)}">{html.escape(title)}</a> <code>/{html.escape(path)}</code></li>'
                    for path, title in pages)
    hint = (f'<p>Did you mean <a href="{href(close[0])}">{html.escape(names[close[0]])}</a>?</p>' if close else "")
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<title>Page not found · SPICE</title><style>:root{color-scheme:light dark}body{font-family:system-ui,"
            "sans-serif;max-width:40rem;margin:3rem auto;padding:0 1rem;line-height:1.5}code{opacity:.75}</style>"
            "</head><body>"
            f"<h1>Page not found</h1><p>This app has no page at <code>{html.escape(asked)}</code>.</p>{hint}"
            f"<p>Its pages:</p><ul>{items}</ul></body></html>")


async def not_found(request: Request, exc) -> Response:
    """FastAPI's handler for every 404: a browser asking for a page gets `not_found_html`; Gradio's API routes
    and clients that do not ask for HTML get FastAPI's JSON as before."""
    wants_page = (request.method in ("GET", "HEAD") and "text/html" in request.headers.get("accept", "")
                  and route_utils.API_PREFIX not in request.url.path)
    if not wants_page:
        return await http_exception_handler(request, exc)
    body = not_found_html(request.url.path, app_pages(request), root_url(request))
    return HTMLResponse(body, status_code=404)
