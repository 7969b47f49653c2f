"""Files a user points us at: read them with a size limit, as UTF-8, as JSON of an expected type.

    path ─► is a file? ─► bytes (at most ``limit_bytes``, after gzip decompression too)
         ─► UTF-8 text ─► JSON ─► the expected type (object, list) ─► caller's own checks

Every failure is a `ConfigError` that names the flag (or config key) the path came from, so a
broken file never surfaces as a traceback. Gzip input is decompressed in chunks and refused
as soon as it passes the limit: a small archive can expand to gigabytes (a "gzip bomb").
This module knows nothing of torch, of models or of what the files mean.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import tempfile
import zlib
from pathlib import Path

from spice_core.errors import ConfigError
from spice_core.units import format_bytes

# Generous for every file the CLI reads (a long measured Chrome trace is tens of MB), small
# enough that parsing it cannot exhaust a laptop's memory.
DEFAULT_LIMIT_BYTES = 256 * 1024 * 1024
_CHUNK_BYTES = 1 << 20


def file_problem(path) -> str:
    """Why ``path`` is not a regular file to read ("" when it is): missing, a folder, or something else that exists
    (/dev/null, a pipe, a socket), each said as it is."""
    p = Path(path)
    if p.is_file():
        return ""
    if p.is_dir():
        return "is a directory, not a file"
    if p.exists():
        return "is not a regular file (a device, pipe or socket)"
    return "no such file"


def require_file(path, flag: str, hint: str = "") -> Path:
    """``path`` as a Path that is an existing regular file, else a ConfigError naming ``flag``."""
    p = Path(path)
    problem = file_problem(p)
    if problem:
        raise ConfigError(f"{flag} {p}: {problem}{': ' + hint if hint else ''}")
    return p


def read_bytes_limited(path, flag: str, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> bytes:
    """The file's bytes, gunzipped when it ends in .gz; refused past ``limit_bytes`` (decompressed)."""
    p = require_file(path, flag)
    try:
        if p.suffix == ".gz":
            out = bytearray()
            with gzip.open(p, "rb") as f:
                while chunk := f.read(_CHUNK_BYTES):
                    out += chunk
                    if len(out) > limit_bytes:
                        raise ConfigError(f"{flag} {p}: decompresses to more than {format_bytes(limit_bytes)}: "
                                          "refusing it (not a file this tool wrote)")
            return bytes(out)
        if p.stat().st_size > limit_bytes:
            raise ConfigError(f"{flag} {p}: is {format_bytes(p.stat().st_size)}, over the {format_bytes(limit_bytes)} "
                              "limit: pass a smaller file")
        return p.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise ConfigError(f"{flag} {p}: cannot be read ({type(e).__name__}: {e})") from e


def read_text(path, flag: str, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> str:
    data = read_bytes_limited(path, flag, limit_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{flag} {path}: is not UTF-8 text (byte {e.start}): convert it to UTF-8") from e


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def read_json(path, flag: str, expect: type | tuple[type, ...] | None = dict,
              limit_bytes: int = DEFAULT_LIMIT_BYTES):
    """Parsed JSON; ``expect`` the type of the top-level value (dict: an object). NaN and
    Infinity literals are refused (they are not JSON and would slip past range checks)."""
    text = read_text(path, flag, limit_bytes)
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (json.JSONDecodeError, ValueError, RecursionError) as e:
        raise ConfigError(f"{flag} {path}: is not valid JSON ({str(e).splitlines()[0][:200]})") from e
    if expect is not None and not isinstance(value, expect):
        names = {dict: "an object {...}", list: "a list [...]"}
        want = " or ".join(names.get(t, t.__name__) for t in (expect if isinstance(expect, tuple) else (expect,)))
        raise ConfigError(f"{flag} {path}: holds {json_type(value)}, expected {want}")
    return value


def json_type(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def is_number(value) -> bool:
    """A finite int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_writable_dir(path, flag: str) -> Path:
    """``path`` is, or can be created as, a writable directory (nothing is created here): checked
    before long work so its results are not lost at the end."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {p}: is a file, not a folder: pass a folder path")
    probe = p
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(f"{flag} {p}: {probe} is a file, so the folder cannot be created: pass another path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {p}: {probe} is not writable: pass a writable folder")
    try:        # os.access says yes to root on a read-only file system: a scratch file says no
        fd, scratch = tempfile.mkstemp(prefix=".write-check-", dir=probe)
        os.close(fd)
        os.unlink(scratch)
    except OSError as e:
        raise ConfigError(f"{flag} {p}: cannot write in {probe} ({e.strerror or e}): pass a writable folder") from None
    return p


def check_writable_file(path, flag: str) -> Path:
    """``path`` can be written as a file (its folder exists or can be created; it is not a folder)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{flag} {p}: is a folder: pass a file path, e.g. {p / 'out.json'}")
    if p.exists() and not os.access(p, os.W_OK):
        raise ConfigError(f"{flag} {p}: the file is not writable: pass another path")
    check_writable_dir(p.parent, flag)
    return p
