"""Command line: `python -m spice_core <command> ...`.

Each command lives in its own module exposing ``add_cli(subparsers)``; the parser it adds
sets ``func(args) -> int``. Errors a user can cause (`SpiceError`, including a flag argparse
refuses: see cli_args.py) print one line and exit 2; nothing prints a traceback for them.
Flags are checked as they are parsed (cli_args.py types), files and folders before any model
is loaded, so a typo never waits for long work.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager

from spice_core.tools.args import SpiceArgumentParser, log_level
from spice_core.errors import SpiceError

COMMAND_MODULES = (
    "spice_core.tools.generate",      # generate
    "spice_core.tools.calibrate_hw",  # calibrate-hw
    "spice_core.tools.recalibrate",   # recalibrate (host costs from measured traces)
    "spice_core.tools.calibrate",         # calibrate (draft heads, LoRE)
    "spice_core.tools.quality",           # quality
    "spice_core.tools.tune",              # tune (the fastest spice setting within a quality budget)
    "spice_core.tools.bench",             # bench
    "spice_core.tools.lift",              # lift
)


def build_parser() -> argparse.ArgumentParser:
    parser = SpiceArgumentParser(prog="python -m spice_core", description="SPICE: offloaded MoE inference")
    parser.add_argument("--log-level", type=log_level, default="WARNING", help="logging level (default WARNING)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        mod.add_cli(sub)
    return parser


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, a container stopping): unwound as Ctrl-C is, so a command's clean-up runs (calibrate's
    scratch folder, a partial trace export), and the process ends with 128 + SIGTERM."""


def _terminate(signum, frame) -> None:
    raise Terminated("terminated")


def unwind_on_sigterm() -> None:
    """Make SIGTERM raise `Terminated` in the main thread, for the process that runs the command line
    (`python -m spice_core`); a program that calls `main` keeps its own SIGTERM handling."""
    signal.signal(signal.SIGTERM, _terminate)


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except Terminated as e:
        detail = _one_line(e)
        print(f"terminated{': ' + detail if detail and detail != 'terminated' else ''}", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt as e:      # Ctrl-C at any point, start-up (imports, parsing) included
        return interrupted(e)


def interrupted(e: BaseException | None = None) -> int:
    """Ctrl-C: one line (what was left undone, when the command says) and the shell's exit status 130."""
    detail = _one_line(e) if e is not None and str(e) else ""
    print(f"interrupted{': ' + detail if detail else ''}", file=sys.stderr)
    return 130


@contextmanager
def _interrupt_deferred():
    """Hold a Ctrl-C back while the commands import: torch's C++ start-up runs Python code, and a
    KeyboardInterrupt raised inside it aborts the process ("terminate called ... KeyboardInterrupt").
    Yields a list that holds the signal if one came; outside the main thread nothing is changed."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield got
    finally:
        signal.signal(signal.SIGINT, previous)


def _main(argv: list[str] | None) -> int:
    with _interrupt_deferred() as interrupt:
        try:
            parser = build_parser()
            args = parser.parse_args(argv)
        except SpiceError as e:
            print(f"error: {_one_line(e)}", file=sys.stderr)
            return 2
    if interrupt:
        return interrupted()
    logging.basicConfig(level=getattr(logging, args.log_level), format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SpiceError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`generate ... | head -1`): stop quietly with SIGPIPE's status, as Unix tools do.
        # Standard output goes to /dev/null first, or Python flushes its buffer at exit and fails once more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as e:
        # The file system, not the code: a full disk, a file removed or made read-only mid-run.
        where = f" {e.filename}" if e.filename else ""
        print(f"error: cannot read or write{where}: {e.strerror or e}: check the path, its permissions "
              "and free space", file=sys.stderr)
        return 2
