"""The address the app serves on: GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, as on Hugging Face Spaces.

Standard library only: app.py reads the port before it imports Gradio, which converts GRADIO_SERVER_PORT with
int() at import and stops with a traceback on anything else. A port asked for is checked before the models load
and then held to: a taken one is an error, never silently the next free port, which a script polling the port
asked for would not see. Without GRADIO_SERVER_PORT Gradio starts at 7860 and moves up to a free port, and says
where.
"""
from __future__ import annotations

import os
import socket

PORT_ENV = "GRADIO_SERVER_PORT"


def take_bad_port_env() -> str | None:
    """What is wrong with GRADIO_SERVER_PORT (None: unset or a port). A bad value is taken out of the environment,
    so that Gradio imports, and the caller reports the message."""
    raw = os.environ.get(PORT_ENV)
    if raw is None or not raw.strip():
        return None
    text = raw.strip()
    if text.isascii() and text.isdigit() and 1 <= int(text) <= 65535:
        return None
    del os.environ[PORT_ENV]
    return f"{PORT_ENV}={raw[:20]!r} is not a port: use a number from 1 to 65535"


def asked_address() -> tuple[str, int | None]:
    """(host, port) for `launch()`: port None when none was asked for. ValueError naming the port when the one asked
    for is taken on that host."""
    host = os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1"
    raw = (os.environ.get(PORT_ENV) or "").strip()
    if not raw:
        return host, None
    port = int(raw)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as the server binds: TIME_WAIT is free
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ValueError(f"port {port} on {host} ({PORT_ENV}) is not free ({exc.strerror or exc}): stop what "
                             "uses it or set another port") from None
    return host, port
