"""Argument types for the command line: each flag's value is checked as it is parsed.

A bad value (NaN, a negative duration, a seed past 64 bits, an unknown device, a folder where a
file is expected) is refused by argparse before any model is loaded, with one line that names
the flag, the value and what is allowed (`SpiceArgumentParser.error` prints only that line).
Knows nothing of models or policies; torch is imported only to check a CUDA device.
"""
from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path

from spice_core.config import SEED_MAX
from spice_core.errors import ConfigError
from spice_core.user_files import file_problem



class UsageError(ConfigError):
    """A flag is missing, unknown or has a value of the wrong form."""


class SpiceArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line and a `UsageError`, not a usage dump and
    a SystemExit: `cli.main` prints the line and returns 2 like any other `SpiceError`."""

    def error(self, message: str):
        # argparse says "argument --x/--no-x: 1.5 is out of range"; we say "--x 1.5 is out of range".
        m = re.match(r"argument (\S+): (.*)", message, re.S)
        if m:
            flag, rest = m.group(1).split("/")[0], m.group(2)
            starts_with_value = re.match(r"^\S+( is |: )", rest) and not rest.startswith("invalid ")
            message = f"{flag} {rest}" if starts_with_value else f"{flag}: {rest}"
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _num(text: str, kind: type):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def _allowed(lo, hi, lo_open: bool = False) -> str:
    if hi is None:
        return f"{'>' if lo_open else '>='} {lo:g}"
    return f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]"


def float_in(lo: float, hi: float | None = None, *, lo_open: bool = False):
    """A finite float in [lo, hi] (``lo_open``: (lo, hi]; ``hi`` None: no upper bound)."""
    def parse(text: str) -> float:
        v = _num(text, float)
        if (v <= lo if lo_open else v < lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{text} is out of range: use a value {_allowed(lo, hi, lo_open)}")
        return v
    parse.__name__ = "number"
    return parse


def int_in(lo: int, hi: int | None = None):
    """An integer in [lo, hi] (``hi`` None: no upper bound)."""
    def parse(text: str) -> int:
        v = _num(text, int)
        if v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"{text} is out of range: use an integer {rng}")
        return v
    parse.__name__ = "integer"
    return parse


seed = int_in(0, SEED_MAX)
positive_int = int_in(1)
positive_float = float_in(0.0, lo_open=True)
fraction = float_in(0.0, 1.0)

_DEVICE = re.compile(r"^(cpu|cuda)(:\d+)?$")


def device(text: str) -> str:
    """cpu, cuda or cuda:N; CUDA only when a GPU is visible (so no model is loaded in vain)."""
    t = text.strip().lower()
    m = _DEVICE.match(t)
    if not m or (m.group(1) == "cpu" and m.group(2)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: use cpu, cuda or cuda:N")
    if m.group(1) == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text}: no CUDA GPU is visible: use cpu")
        if m.group(2) and int(m.group(2)[1:]) >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return t


def threads(text: str) -> int:
    cores = os.cpu_count() or 1
    return int_in(1, max(64, 4 * cores))(text)


def path(text: str) -> Path:
    """A path typed on the command line; an empty one is refused (``Path("")`` is the current folder, so
    ``--trace-dir ""`` wrote there without a word)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty: pass a file or folder path")
    return Path(text)       # any other name the system takes, not-UTF-8 bytes included


def existing_file(text: str) -> Path:
    p = Path(text)
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder: pass a file")
    if not p.is_file():
        raise argparse.ArgumentTypeError(f"{text}: {file_problem(p)}")
    return p


def utf8_text_file(text: str) -> Path:
    """An existing, non-empty UTF-8 text file (checked now: a bad file must not wait for a model load)."""
    from spice_core.user_files import read_text

    p = existing_file(text)
    try:
        content = read_text(p, "file")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(f"{p} " + str(e).removeprefix(f"file {p}: ")) from None
    if not content.strip():
        raise argparse.ArgumentTypeError(f"{text} is empty: pass a file with some text in it")
    return p


def utf8_text(text: str) -> str:
    """Text typed on the command line, refused when it is not valid UTF-8 (Python hands invalid bytes on
    as lone surrogates, which a tokenizer or a print then fails on)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not valid UTF-8 text: check the terminal's or the "
                                         "script's encoding") from None
    return text


def nonempty_text(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("the value is empty")
    return utf8_text(text)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(text: str) -> str:
    t = text.strip().upper()
    if t not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a level: use one of {', '.join(LOG_LEVELS)}")
    return t
