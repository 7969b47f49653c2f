"""Where each decode token's time goes, read off Chrome traces this engine wrote (spice_core.trace.occupancy).

    python benchmarks/trace_split.py TRACE.json[.gz] [TRACE ...] [--markdown]

One row per trace: its decode tokens, the mean wall ms per token, and the ms per token in each exclusive state (the
GPU computing; the decode waiting for a copy, for a copy and the CPU lane, for the lane; the GPU idle with nothing
waited for: the host), then the link's busy time per token and how much of it hid under GPU work. The states add up
to the token's wall time. Timing: each trace's own, printed in its row: measured (a GPU run's CUDA
events and wall clock) or modeled (the timing model's, e.g. a trace downloaded from the app on a CPU).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the package without installing it

from spice_core.errors import SpiceError  # noqa: E402
from spice_core.tools.recalibrate import read_trace_events  # noqa: E402
from spice_core.trace.events import TraceEvent  # noqa: E402
from spice_core.trace.occupancy import STATES, time_split  # noqa: E402


def trace_events(path: Path) -> list[TraceEvent]:
    """The interval events of one Chrome trace as the engine's TraceEvents (measured or modeled)."""
    out = []
    for e in read_trace_events(path, "TRACE", ("measured", "modeled")):
        a = e["args"]
        start = float(a["start_ms"])
        out.append(TraceEvent(int(a["token"]), int(a["layer"]), int(a.get("expert", -1)), a["lane"], a["kind"],
                              start, start + float(a["dur_ms"]), int(a.get("bytes", 0)), str(a["timing"]),
                              str(a.get("detail", ""))))
    return out


def rows(paths: list[Path]) -> list[list[str]]:
    out = []
    for path in paths:
        events = trace_events(path)
        s = time_split(events)
        timing = "/".join(sorted({e.timing for e in events}))
        out.append([path.name, timing, str(s.tokens), f"{s.wall_ms:.2f}", *(f"{s.ms[k]:.2f}" for k in STATES),
                    f"{s.link_busy_ms:.2f}", f"{s.link_hidden_ms:.2f}", s.bound()])
    return out


HEADER = ["trace", "timing", "decode tokens", "wall ms/token", *(f"{k} ms" for k in STATES), "link busy ms",
          "link hidden under GPU ms", "bound"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", type=Path, help="Chrome traces (.json or .json.gz) this engine wrote")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table (default: aligned text)")
    args = ap.parse_args(argv)
    try:
        table = rows(args.traces)
    except SpiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.markdown:
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
        for r in table:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(HEADER)]
        for r in [HEADER, *table]:
            print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
