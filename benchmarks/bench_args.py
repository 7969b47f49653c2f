"""The benchmark scripts' command lines: the engine's flag checks (spice_core.tools.args) plus what only scripts need.

A bad value is refused while the command line is parsed, or right after it, before any model loads or any run
starts: one line on stderr, ``error: --runs 0 is out of range: use an integer >= 1 (see `... --help`)``, and exit
status 2, never a traceback and never once the work is done (an output that cannot be written is found first).
Imported by the scripts as ``bench_args`` (their own folder is on sys.path); knows nothing of what they measure.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from spice_core.errors import SpiceError
from spice_core.tools import args as ca

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")     # as the loader tells a hub id from a folder


class Parser(ca.SpiceArgumentParser):
    """argparse whose errors are ca's one line (the flag, the value, what is allowed) and exit status 2, as
    argparse's own do; ``parser.error(text)`` refuses a value checked after parsing the same way."""

    def error(self, message: str):
        try:
            super().error(message)
        except ca.UsageError as e:
            self.exit(2, f"error: {' '.join(str(e).split())}\n")


def prog(file: str) -> str:
    """The name a script's usage and errors give it: ``benchmarks/NAME.py``."""
    return f"benchmarks/{Path(file).name}"


def one_of(names, what: str):
    """A value among ``names`` (e.g. the engine's policies), refused with the list otherwise."""
    names = tuple(names)

    def parse(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what}: choose from {', '.join(names)}")
        return text
    parse.__name__ = what
    return parse


def model(text: str) -> str:
    """A model: a shipped model's name (its folder is returned), a checkpoint folder with a usable config.json,
    or a hub id (org/name, left to the loader). A missing folder or a broken config.json is refused now."""
    from spice_core.model.loader import read_config, resolve_model_path
    from spice_core.model.shipped import model_argument

    try:
        value = model_argument(text, "--model")
        s = str(value)
        if Path(s).expanduser().exists() or not _HUB_ID.match(s) or s.startswith((".", "/", "~")):
            read_config(resolve_model_path(s))
    except SpiceError as e:
        raise argparse.ArgumentTypeError(" ".join(str(e).split()).removeprefix("--model ")) from None
    return value


def check_out_file(parser: argparse.ArgumentParser, path, flag: str) -> None:
    """``path`` can be written as a file (its folder exists or can be made): else ``parser.error``, before the
    work rather than after it."""
    from spice_core.user_files import check_writable_file

    try:
        check_writable_file(path, flag)         # a scratch file written where it would go (root: no os.access)
    except SpiceError as e:
        parser.error(str(e))


def check_out_dir(parser: argparse.ArgumentParser, path, flag: str) -> None:
    """``path`` is, or can be made, a writable folder: else ``parser.error``."""
    from spice_core.user_files import check_writable_dir

    try:
        check_writable_dir(path, flag)
    except SpiceError as e:
        parser.error(str(e))


def check_timing(parser: argparse.ArgumentParser, timing: str | None, device: str) -> None:
    """Measured timing takes CUDA events: refused on the CPU before the model loads (the engine would refuse
    it after)."""
    if timing == "measured" and not str(device).startswith("cuda"):
        parser.error(f"--timing measured needs a CUDA device (--device cuda), not {device}: use --timing modeled")


__all__ = ["Parser", "ca", "check_out_dir", "check_out_file", "check_timing", "model", "one_of", "prog"]
