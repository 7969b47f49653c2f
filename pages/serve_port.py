"""The address the app serves on: GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, as on Hugging Face Spaces.

Standard library only: app.py reads the port before it imports Gradio, which converts GRADIO_SERVER_PORT with
int() at import and stops with a traceback on anything else. A port asked for is checked before the models load
and then held to: a taken one is an error, never silently the next free port, which a script polling the port
asked for would not see. Without GRADIO_SERVER_PORT Gradio starts at 7860 and moves up to a free port, and says
where.
"""
from __future__ import annotations

import errno
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
    try:
        family, _, _, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ValueError(f"GRADIO_SERVER_NAME={host[:60]!r} is not an address of this machine ({exc}): use 127.0.0.1, "
                         "0.0.0.0 or a name that resolves") from None
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        if os.name != "nt":     # as the server binds (TIME_WAIT is free); on Windows it would let a taken port bind
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(f"port {port} on {host} ({PORT_ENV}) is not free: stop what uses it or set another "
                                 "port") from None
            raise ValueError(f"cannot listen on {host} port {port} ({exc.strerror or exc}): set another "
                             f"{PORT_ENV} or GRADIO_SERVER_NAME") from None
    return host, port
