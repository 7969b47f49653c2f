"""Command line: `python -m spice_core <command> ...`.

Each command lives in its own module exposing ``add_cli(subparsers)``; the parser it adds
sets ``func(args) -> int``. Errors a user can cause (`SpiceError`) print one line and exit 2;
nothing prints a traceback for them.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from spice_core.errors import SpiceError

COMMAND_MODULES = (
    "spice_core.cli_generate",      # generate
    "spice_core.timing.calibrate_hw",  # calibrate-hw
    "spice_core.timing.recalibrate",   # recalibrate (host costs from measured traces)
    "spice_core.calibrate",         # calibrate (draft heads, LoRE)
    "spice_core.quality",           # quality
    "spice_core.bench",             # bench
    "spice_core.lift",              # lift
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m spice_core", description="SPICE: offloaded MoE inference")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SpiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
