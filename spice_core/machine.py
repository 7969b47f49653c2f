"""Machine: where and how runs execute, resolved once when the engine is built.

One frozen value answers every "modeled or measured?", "which decision profile?", "which link?"
and "which executor?" question, so no module decides them again on its own:

- ``timing``: "measured" (CUDA events; CUDA only) or "modeled" (the timing model replays the run).
  A pass the engine runs for its own use (teacher forcing, the oracle's routing on the CPU) is
  modeled whatever the machine: `run_timing(modeled_pass)`.
- ``decision_profile``: the costs a measured run's planner believes. The default depends on the
  executor (`MEASURED_DEFAULT_PROFILE` eager, `MEASURED_FAST_PROFILE` graphed); a calibrated
  profile given by the user replaces both. ``link_gbps`` replaces its host-to-device bandwidth and,
  below the native link, paces copies (link emulation).
- ``executor``: "auto", "eager" or "graphed" (runtime/graph_exec.py), and whether a pass uses the
  fast path (`fast_path`).
"""
from __future__ import annotations

import hashlib
import json
import numbers
import platform
from dataclasses import dataclass, replace
from pathlib import Path

from spice_core.errors import ConfigError
from spice_core.timing.profiles import HardwareProfile, get_profile

MEASURED_DEFAULT_PROFILE = "h200-pcie5x16-host"     # decisions of measured runs on the eager executor
MEASURED_FAST_PROFILE = "h200-pcie5x16-graphed"     # ... and on the fast path (its GPU and host costs)
TIMINGS = ("measured", "modeled")
EXECUTORS = ("auto", "eager", "graphed")


@dataclass(frozen=True)
class Machine:
    device: str                                   # "cuda" | "cpu"
    timing: str                                   # "measured" | "modeled"
    hw_profile: HardwareProfile | None = None     # the user's calibrated profile (decides measured runs)
    link_gbps: float | None = None                # emulated host-to-device link (measured) or bandwidth override
    host_aware: bool = True                       # the profile's host costs decide, not only time
    executor: str = "auto"

    def __post_init__(self) -> None:
        if self.timing not in TIMINGS:
            raise ConfigError(f"timing={self.timing!r}: use 'measured' (CUDA only) or 'modeled'")
        if self.timing == "measured" and self.device != "cuda":
            raise ConfigError("timing='measured' needs a CUDA device: use timing='modeled' on this machine")
        if self.executor not in EXECUTORS:
            raise ConfigError(f"executor={self.executor!r} is unknown: use one of {', '.join(EXECUTORS)}")
        v = self.link_gbps
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 < v < float("inf")):
            raise ConfigError(f"link_gbps={self.link_gbps!r} must be a positive number of GB/s")

    @classmethod
    def resolve(cls, device: str, timing: str | None = None, **kw) -> "Machine":
        """The machine for a model on ``device``: measured on CUDA, modeled elsewhere, unless told."""
        return cls(device=device, timing=timing or ("measured" if device == "cuda" else "modeled"), **kw)

    def run_timing(self, modeled_pass: bool = False) -> str:
        return "modeled" if modeled_pass or self.timing == "modeled" else "measured"

    def fast_path(self, modeled_pass: bool = False) -> bool:
        """Whether a pass asks for the graphed executor (the engine may still refuse it for a run's features)."""
        if self.executor == "eager" or modeled_pass:
            return False
        if self.executor == "graphed":
            return True
        return self.device == "cuda" and self.timing == "measured"

    def decision_profile(self, fast: bool) -> HardwareProfile:
        """What a measured run's planner believes things cost, with the link's bandwidth."""
        prof = self.hw_profile or get_profile(MEASURED_FAST_PROFILE if fast else MEASURED_DEFAULT_PROFILE)
        return replace(prof, h2d_pinned_gbps=self.link_gbps) if self.link_gbps else prof

    def modeled_profile(self, name: str) -> HardwareProfile:
        """The profile a modeled run is timed with: the user's, else the named one, with the link override."""
        prof = self.hw_profile or get_profile(name)
        return replace(prof, h2d_pinned_gbps=self.link_gbps) if self.link_gbps else prof

    def profile_key(self, named: str) -> str:
        """The profile a modeled run's tuned picks are filed under: a calibrated file's name and a digest of its numbers
        (two files called "this-machine", or one file calibrated again, are other machines to a pick timed on one),
        else ``named``; measured runs, ``named`` (measured picks have always been filed so)."""
        if self.timing != "modeled" or self.hw_profile is None:
            return named
        digest = hashlib.sha256(json.dumps(self.hw_profile.as_dict(), sort_keys=True).encode()).hexdigest()[:8]
        return f"{self.hw_profile.name}#{digest}"

    def pace_extra_ms_per_byte(self) -> float:
        """Link emulation: extra copy-stream time per byte, when the link is slower than the native one."""
        if not self.link_gbps:
            return 0.0
        native = (self.hw_profile or get_profile(MEASURED_DEFAULT_PROFILE)).h2d_pinned_gbps
        if self.link_gbps >= native:
            return 0.0
        return 1.0 / (self.link_gbps * 1e6) - 1.0 / (native * 1e6)


def cpu_model_name() -> str:
    """The host CPU's model name as the OS reports it (benchmarks print it beside what they measured)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
