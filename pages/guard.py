"""What a public deployment puts on every HTTP request before any page sees it, and each visitor's share of the queue.

    request ──► RequestGuard (ASGI) ──► Gradio's routes ──► queue/join ──► FairQueue ──► Gradio's queue
                │ body over MAX_BODY_BYTES: 413 before it is read (Content-Length, or counted as it arrives)
                │ the upload route: 403 (the app takes no files)
                └ every response: Content-Security-Policy (frame-ancestors: embeddable by Hugging Face, not by
                  other sites), X-Content-Type-Options, Referrer-Policy

Why a per-visitor share: the queue (`QUEUE_MAX_SIZE` in app.py) is shared by every queued event of every
visitor, so one visitor sending events in a loop could fill it, and everyone else got "Queue is full". A
visitor is the browser's owner token (pages/owners.py), else the event's session: at most `PER_VISITOR`
of their events may wait or run at once; one more is refused with a message that says why, and the
visitors behind them are not affected. Read-only views (trace, compare, run list, share) do not queue at
all (queue=False in pages/trace_explorer.py).

Knows Gradio's queue only through `Queue.push` and the events it holds (gradio 6.31); knows nothing of the engine.
"""
from __future__ import annotations

import json
import logging

from pages.owners import browser_owner

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 512 * 1024      # the largest legitimate body (a 200-message history, 2,048 characters each, as JSON)
PER_VISITOR = 3                  # events one visitor may have waiting or running at once (a reply, a sweep, an export)
# Gradio's page needs inline scripts and styles (its config, the owner token) and eval (plotly); data and blob
# URLs for images; nothing from other origins. Hugging Face shows a Space in an iframe on huggingface.co.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; media-src 'self' data: blob:; connect-src 'self'; "
    "worker-src 'self' blob:; object-src 'none'; base-uri 'self'; form-action 'self'; "
    "frame-ancestors 'self' https://huggingface.co https://*.hf.space")
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"strict-origin-when-cross-origin"),
)
_BODY_METHODS = {"POST", "PUT", "PATCH"}


class RequestGuard:
    """ASGI middleware: size limit, no uploads, security headers (see the module docstring)."""

    def __init__(self, app, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message = {**message, "headers": [*message.get("headers", []),
                                                  *((k, v) for k, v in SECURITY_HEADERS if k not in names)]}
            await send(message)

        path = scope.get("path", "")
        if scope.get("method") in _BODY_METHODS:
            length = _content_length(scope)
            if length is not None and length > self.max_body_bytes:
                return await _refuse(send_with_headers, 413, self._too_large())
            if path.rstrip("/").endswith("/upload"):
                return await _refuse(send_with_headers, 403, "This app takes no uploads.")
            if length is None:          # chunked: read it here, up to the limit, then hand it on
                chunks, size = [], 0
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        break
                    size += len(message.get("body", b""))
                    if size > self.max_body_bytes:
                        return await _refuse(send_with_headers, 413, self._too_large())
                    chunks.append(message)
                    if not message.get("more_body"):
                        break
                receive = _replay(chunks, receive)
        return await self.app(scope, receive, send_with_headers)

    def _too_large(self) -> str:
        return (f"Request too large: this app takes at most {self.max_body_bytes // 1024} kB per request "
                "(a message is at most a few thousand characters).")


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(chunks, receive):
    pending = list(chunks)

    async def replay():
        if pending:
            return pending.pop(0)
        return await receive()
    return replay


async def _refuse(send, status: int, detail: str) -> None:
    log.info("refused a request: %s", status)       # no path, no values: nothing of what visitors send
    body = json.dumps({"detail": detail, "error": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def visitor_of(request, session_hash: str | None) -> str:
    """The browser's owner token if the request carries a well-formed one, else the session."""
    return (browser_owner(request) if request is not None else "") or f"session:{session_hash or ''}"


class FairQueue:
    """Wraps one Gradio queue's `push`: a visitor holds at most ``per_visitor`` waiting or running events, and
    the queue's size limit counts only the engine's work. API clients send every call through the queue, the
    read-only views (queue=False: a browser calls them directly) included; those never find the queue full."""

    def __init__(self, queue, per_visitor: int = PER_VISITOR) -> None:
        self.queue = queue
        self.per_visitor = per_visitor
        self.max_size = queue.max_size          # enforced here, for queued work only
        queue.max_size = None
        self._push = queue.push
        self._joining: dict[str, int] = {}     # pushes under way (Gradio's push awaits before the event is queued)
        queue.push = self.push

    def _events(self, running: bool = True) -> list:
        waiting = [e for q in list(self.queue.event_queue_per_concurrency_id.values()) for e in list(q.queue)]
        return waiting + ([e for job in list(self.queue.active_jobs) if job for e in job] if running else [])

    def held_by(self, visitor: str) -> int:
        return sum(1 for e in self._events()
                   if visitor_of(getattr(e, "request", None), getattr(e, "session_hash", None)) == visitor)

    async def push(self, body, request, username):
        visitor = visitor_of(request, getattr(body, "session_hash", None))
        # Counting and reserving happen with no await in between: concurrent joins of one visitor cannot both pass.
        if self.held_by(visitor) + self._joining.get(visitor, 0) >= self.per_visitor:
            log.info("refused a queued event: the visitor already has %d waiting or running", self.per_visitor)
            # "error" (400), not "queue_full": for a 503 the browser shows its own "This application is currently
            # busy" and drops this text, which says what is different here (the app has room: this visitor is full).
            return (False, f"You already have {self.per_visitor} requests waiting or running: wait for them to "
                           "finish (the queue is shared with every visitor).", "error")
        fn = self._fn(body)
        if fn is None:          # Gradio's push would fail with a KeyError traceback in the log
            return False, "No such endpoint.", "error"
        data = getattr(body, "data", None)
        if isinstance(data, list) and len(data) < len(fn.inputs):
            # Gradio would refuse it later, logging every value sent ("Received inputs: ...").
            hidden = sum(1 for c in fn.inputs if type(c).__name__ == "State")     # gradio_client sends them itself
            why = (f" ({hidden} of them the page's hidden state, which the API page leaves out: send null there)"
                   if hidden else "")
            return False, f"This endpoint takes {len(fn.inputs)} inputs{why} and {len(data)} came: see the API page.", \
                "error"
        if self.max_size is not None and fn.queue:
            waiting = sum(1 for e in self._events(running=False) if getattr(e.fn, "queue", True))
            if waiting + sum(self._joining.values()) >= self.max_size:
                return False, f"Queue is full. Max size is {self.max_size} and size is {waiting}.", "queue_full"
        self._joining[visitor] = self._joining.get(visitor, 0) + 1
        try:
            return await self._push(body=body, request=request, username=username)
        finally:
            self._joining[visitor] -= 1
            if not self._joining[visitor]:
                del self._joining[visitor]


    def _fn(self, body):
        try:
            return self.queue.blocks.fns[body.fn_index]
        except (AttributeError, KeyError, TypeError):
            return None


def install(demo, per_visitor: int = PER_VISITOR) -> FairQueue:
    """Give each visitor a bounded share of ``demo``'s queue (call after ``demo.queue()``)."""
    return FairQueue(demo._queue, per_visitor)
