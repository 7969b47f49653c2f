"""Hardware profiles and target model shapes, shipped as data (profiles.json).

A *profile* says how fast a machine's links, GPU and CPU are; a *shape* says how big a
real model's experts and layers are. Together they let the timing model time a tiny
model's decisions as if it were DeepSeek-V2-Lite on, say, an RTX 4090. ``native``
shape means: use the loaded model's own dimensions. A shape also records the real model's
routing topology (family, MoE layers, experts, top-k): a model with that topology (a shipped
miniature, its lift) has that shape as its *own*; timed at another shape, only the sizes change.

This module knows nothing of torch or of the engine.
"""
from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

from spice_core.errors import ConfigError

_DATA = Path(__file__).with_name("profiles.json")
NATIVE_SHAPE = "native"


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    h2d_pinned_gbps: float
    h2d_pageable_gbps: float
    d2h_gbps: float
    copy_latency_us: float
    gpu_mem_gbps: float
    gpu_tflops: float
    gpu_kernel_us: float          # per kernel launch, eager (launch-bound at batch 1)
    gpu_kernels_per_expert: int
    gpu_kernels_per_layer: int    # non-expert work of one decoder layer (attention, norms, router)
    cpu_mem_gbps: float           # effective rate the CPU lane streams expert weights from DRAM
    cpu_gflops: float
    cpu_threads: int
    cpu_task_us: float            # fixed cost of one CPU-lane task (dispatch, sync)
    host_step_us: float           # per-token host work (sampling, Python between tokens)
    source: str = ""
    # The host as a lane (0 = never the bottleneck, the timing model's classic assumption). Eager
    # batch-1 decoding syncs once per MoE layer to read the routing, so Python launch and
    # bookkeeping time is not hidden behind the GPU; `recalibrate` fits these from a measured trace.
    host_layer_us: float = 0.0    # launching one decoder layer's non-expert work
    host_expert_us: float = 0.0   # launching one expert on the GPU
    host_copy_us: float = 0.0     # issuing one host-to-device expert copy (slot bookkeeping included)
    host_plan_us: float = 0.0     # one lookahead prediction + plan after a MoE layer
    host_dram_gbps: float = 0.0   # what the host's DRAM delivers to the CPU lane and the link together (0: unknown,
                                  # no contention modeled)
    # A decode step that is one CUDA graph (every expert resident, `runtime/graphed_static.py`) launches no kernel
    # from the host and, decoding greedily, runs the next step ahead while the host books this one: its kernels cost
    # this each (0: timed as segments, like every other step); `recalibrate --records` fits it from `resident`.
    graph_step_kernel_us: float = 0.0
    # The CPU lane's fixed compute per job (thread wake-up, the matmuls' set-up), beside its bytes at cpu_mem_gbps
    # and the task's dispatch in cpu_task_us (0: every µs of compute charged to bytes); `recalibrate --lane-records`
    # fits it with cpu_mem_gbps from two expert sizes (tools/lane_fit.py).
    cpu_job_compute_us: float = 0.0
    # A CPU lane that runs a layer's experts side by side from a few of them on (the auto lane, exec/cpu_lane.py):
    # their wall one after another on every core over their wall side by side, measured by
    # benchmarks/cpu_lane_profile.py (its "side_speedup"); 1: side by side is priced as one after another.
    cpu_side_speedup: float = 1.0

    def one_graph_step(self) -> "HardwareProfile":
        """This profile as a one-graph step runs: kernels at ``graph_step_kernel_us``, no host launch costs (the
        host's per-token step overlaps the next step instead: `ModeledTimeline.one_graph_step`)."""
        return replace(self, gpu_kernel_us=self.graph_step_kernel_us, host_layer_us=0.0, host_expert_us=0.0,
                       host_copy_us=0.0, host_plan_us=0.0)

    @property
    def models_host(self) -> bool:
        return (self.host_layer_us + self.host_expert_us + self.host_copy_us + self.host_plan_us) > 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"profile name={self.name!r}: use a non-empty string")
        if not isinstance(self.source, str):
            raise ConfigError(f"profile {self.name}: source={self.source!r} must be a string")
        for f in fields(self):
            if f.name in ("name", "source"):
                continue
            v = getattr(self, f.name)
            want_int = f.type in ("int", int)
            ok = isinstance(v, int) if want_int else isinstance(v, (int, float))
            if not ok or isinstance(v, bool):
                raise ConfigError(f"profile {self.name}: {f.name}={v!r} must be "
                                  f"{'an integer' if want_int else 'a number'}")
            # NaN passes every comparison: refuse non-finite values outright.
            if not math.isfinite(v) or v < 0:
                raise ConfigError(f"profile {self.name}: {f.name}={v} must be a finite number >= 0")
        if self.h2d_pinned_gbps <= 0 or self.gpu_mem_gbps <= 0 or self.cpu_mem_gbps <= 0:
            raise ConfigError(f"profile {self.name}: bandwidths must be > 0")
        if self.cpu_threads < 1:
            raise ConfigError(f"profile {self.name}: cpu_threads must be >= 1")
        if self.cpu_side_speedup <= 0:
            raise ConfigError(f"profile {self.name}: cpu_side_speedup={self.cpu_side_speedup} must be > 0 "
                              "(1: experts side by side cost what they cost one after another)")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ModelShape:
    """Dimensions that set the modeled cost of experts and layers."""

    name: str
    hidden: int
    expert_intermediate: int
    shared_intermediate: int      # 0 when the family has no shared expert
    dense_intermediate: int
    attention_params: int
    dtype_bytes: int
    source: str = ""

    @property
    def expert_bytes(self) -> int:
        """One routed expert's weights: gate, up and down projections."""
        return 3 * self.hidden * self.expert_intermediate * self.dtype_bytes

    @property
    def layer_bytes(self) -> int:
        """Non-routed weights read by one MoE decoder layer per token (attention + shared expert)."""
        return (self.attention_params + 3 * self.hidden * self.shared_intermediate) * self.dtype_bytes


@lru_cache(maxsize=1)
def _load() -> dict:
    return json.loads(_DATA.read_text())


def profile_names() -> tuple[str, ...]:
    return tuple(_load()["profiles"])


def shape_names() -> tuple[str, ...]:
    return tuple(_load()["shapes"]) + (NATIVE_SHAPE,)


def get_profile(name: str) -> HardwareProfile:
    profiles = _load()["profiles"]
    if name not in profiles:
        raise ConfigError(f"profile={name!r} is unknown: choose one of {', '.join(profiles)}")
    return HardwareProfile(name=name, **profiles[name])


def profile_from_dict(d: dict, where: str = "profile file") -> HardwareProfile:
    """A profile written by `calibrate-hw` (JSON); unknown and missing keys are refused."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where} holds a {type(d).__name__}, not a JSON object of profile fields")
    allowed = {f.name for f in fields(HardwareProfile)}
    required = {f.name for f in fields(HardwareProfile) if f.default is MISSING}
    extra = set(d) - allowed
    if extra:
        raise ConfigError(f"{where} has unknown keys {sorted(extra)}: allowed are {sorted(allowed)}")
    missing = required - set(d)
    if missing:
        raise ConfigError(f"{where} lacks keys {sorted(missing)}: write it with "
                          "`python -m spice_core calibrate-hw --out FILE`")
    try:
        return HardwareProfile(**d)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from e


def get_shape(name: str, native: ModelShape | None = None) -> ModelShape:
    """The named shape; ``native`` returns the loaded model's own (passed in by the engine)."""
    if name == NATIVE_SHAPE:
        if native is None:
            raise ConfigError("shape='native' needs a loaded model")
        return native
    shapes = _load()["shapes"]
    if name not in shapes:
        raise ConfigError(f"shape={name!r} is unknown: choose one of {', '.join(shape_names())}")
    return ModelShape(name=name, **{k: v for k, v in shapes[name].items() if k != "routing"})


def run_profile_label(hw: HardwareProfile | None, named: str | None, timing: str) -> str | None:
    """The profile a run is timed (modeled) or decided (measured) with, as records and summaries name it: a
    calibrated profile file's own name first, else the named profile when modeled, else "this machine"."""
    if hw is not None:
        return hw.name
    return named if timing == "modeled" else "this machine"


def routing_shape(family: str, moe_layers: int, n_experts: int, top_k: int) -> str | None:
    """The shape whose real model routes like this (same family, MoE layers, experts and top-k), if any."""
    want = {"family": family, "moe_layers": moe_layers, "n_experts": n_experts, "top_k": top_k}
    return next((name for name, d in _load()["shapes"].items() if d.get("routing") == want), None)
