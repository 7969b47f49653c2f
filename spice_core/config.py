"""The settings a run takes (`RunSettings`), the policy names a user may pick, and the timing shape that is a
model's own: plain values, built once at the edge (CLI, app) and passed down.

Front ends read these through `spice_core.api`, which re-exports them; the engine's own modules import them
from here, so that `spice_core.api` may also re-export what sits above the engine (the tuner) without an
import cycle. Knows nothing of how a run is executed, timed or shown.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from types import MappingProxyType

from spice_core.errors import ConfigError, quoted
from spice_core.policy.spec import POLICY_SPECS
from spice_core.records import EngineInfo
from spice_core.timing.profiles import NATIVE_SHAPE, routing_shape

# Names a user may pick, derived from the one policy table (policy/spec.py); the engine refuses anything
# else with a ConfigError. Baselines predict nothing; exact policies never approximate nor run int8 experts.
POLICIES = tuple(POLICY_SPECS)
BASELINE_POLICIES = tuple(n for n, s in POLICY_SPECS.items() if s.predictor is None)
SPICE_POLICIES = tuple(n for n in POLICIES if n not in BASELINE_POLICIES)
EXACT_POLICIES = tuple(n for n, s in POLICY_SPECS.items() if not s.use_lore and not s.use_int8)
# Settings a running generation takes from its next token (GenerationRun.update_settings); any other
# change applies from the next message.
LIVE_FIELDS = ("tau_prefetch", "tau_approx", "max_lookahead", "temperature", "top_p")

MAX_NEW_TOKENS_LIMIT = 4096
# When the engine offers the CPU lane to spice-like policies: "auto" where one CPU expert beats a copy over the link
# (the planner's costs; elsewhere offering it cost more than it saved, docs/benchmarks/cpu-lane/ab), "always" on any
# link (an A/B of that rule).
LANE_OFFERS = ("auto", "always")
# How slot copies are issued on CUDA: "direct" calls the CUDA runtime's cudaMemcpyAsync (runtime/direct_copy.py, where
# a start-up copy checks it), "torch" through Tensor.copy_ (the reference, and an A/B of the direct path).
COPY_ISSUES = ("direct", "torch")


def check_copy_issue(value: str) -> str:
    if value not in COPY_ISSUES:
        raise ConfigError(f"copy_issue={value!r} is unknown: use one of {', '.join(COPY_ISSUES)}")
    return value


# The range each share, threshold, sampling knob and lookahead of a run takes, ends included: RunSettings refuses
# anything else, and every front end and check takes its bounds from here (a control may offer less, as the app's
# τ_approx and lookahead sliders do, never more). Read-only: one table for the whole process, so nothing may widen a
# range behind RunSettings' back. max_lookahead's ends are integers (MoE layers ahead).
SETTING_RANGES = MappingProxyType({
    "cache_frac": (0.0, 1.0), "tau_prefetch": (0.0, 1.0), "tau_approx": (0.0, 1.0), "tau_int8": (0.0, 1.0),
    "temperature": (0.0, 10.0), "top_p": (1e-6, 1.0), "repetition_penalty": (0.1, 10.0), "max_lookahead": (1, 64)})


def _check_range(name: str, value: float) -> None:
    lo, hi = SETTING_RANGES[name]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):      # numpy's numbers are Real too
        raise ConfigError(f"{name}={quoted(value)} is not a number: use a value in [{lo}, {hi}]")
    if not (lo <= value <= hi):
        raise ConfigError(f"{name}={value!r} is out of range: use a value in [{lo}, {hi}]")


SEED_MAX = 2**63 - 1          # torch.manual_seed takes a signed 64-bit value


def checked_int(name: str, value, lo: int, hi: int | None) -> int:
    """``value`` as a Python int in [lo, hi] (hi None: no upper bound); numpy's integers are Integral too.
    ConfigError naming the setting: "not an integer" for another type, "out of range" for one outside."""
    span = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name}={quoted(value)} is not an integer: use an integer {'in ' if hi is not None else ''}{span}")
    if not lo <= value <= (hi if hi is not None else value):
        raise ConfigError(f"{name}={quoted(int(value))} is out of range: use an integer {'in ' if hi is not None else ''}{span}")
    return int(value)


DEFAULT_LORE_RANK = 16


@dataclass(frozen=True)
class RunSettings:
    """Per-session, per-generation settings. Validated on construction.

    ``cache_frac`` is the GPU budget for routed experts as a fraction of all routed
    experts' bytes (LoRE factors and draft heads are counted inside it).
    ``profile``/``shape`` only matter in modeled timing: the hardware profile and the
    real-model shape the modeled times stand for.
    ``tau_int8`` (0 = off): a miss whose router weight is below it, and not below ``tau_approx`` (LoRE
    keeps the lowest), may run on the CPU lane from an int8 weight-only copy of the experts when that
    finishes before the copy and the exact CPU run; lossy, taken only by ``spice``.
    """

    policy: str = "spice"
    cache_frac: float = 0.25
    tau_prefetch: float = 0.2
    tau_approx: float = 0.0
    tau_int8: float = 0.0
    max_lookahead: int = 4
    lore_rank: int = DEFAULT_LORE_RANK   # the default means "up to 16": smaller LoRE factors are used whole
    cpu_lane: bool = True
    profile: str = "rtx4090-pcie4x16"
    shape: str = "deepseek-v2-lite"
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    # transformers' repetition penalty (1.0: none); None takes the checkpoint's generation_config, as `generate` does
    repetition_penalty: float | None = None
    seed: int = 0
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.policy, str) or self.policy not in POLICIES:
            raise ConfigError(f"policy={quoted(self.policy)} is unknown: choose one of {', '.join(POLICIES)}")
        for name in ("profile", "shape"):          # their names are checked against the engine's lists at start
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name}={quoted(getattr(self, name))} is not a name: pass one as a string")
        if not isinstance(self.cpu_lane, bool):
            raise ConfigError(f"cpu_lane={quoted(self.cpu_lane)} must be True or False")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or not 0 <= self.seed <= SEED_MAX:
            raise ConfigError(f"seed={quoted(self.seed)} is out of range: use an integer in [0, 2**63 - 1]")
        stop = self.stop
        if stop is None:
            stop = ()
        elif isinstance(stop, str):                # one stop string, not its characters
            stop = (stop,)
        if not isinstance(stop, (tuple, list)) or not all(isinstance(x, str) and x for x in stop):
            raise ConfigError(f"stop={quoted(self.stop)} must be a string or a sequence of non-empty strings")
        object.__setattr__(self, "stop", tuple(stop))
        for name in ("cache_frac", "tau_prefetch", "tau_approx"):
            _check_range(name, getattr(self, name))
        low, high = SETTING_RANGES["tau_int8"]
        if not (isinstance(self.tau_int8, (int, float)) and not isinstance(self.tau_int8, bool)
                and low <= self.tau_int8 <= high):
            raise ConfigError(f"tau_int8={self.tau_int8!r} is out of range: use a value in [{low:g}, {high:g}] "
                              "(--tau-int8; 0 = no int8 CPU runs)")
        for name, lo, hi in (("max_lookahead", *SETTING_RANGES["max_lookahead"]), ("lore_rank", 1, None),
                             ("max_new_tokens", 1, MAX_NEW_TOKENS_LIMIT)):
            object.__setattr__(self, name, checked_int(name, getattr(self, name), lo, hi))
        _check_range("temperature", self.temperature)
        _check_range("top_p", self.top_p)
        if self.repetition_penalty is not None:
            _check_range("repetition_penalty", self.repetition_penalty)

    @property
    def exact(self) -> bool:
        """True when the settings cannot change the output (no approximation, no int8 CPU run)."""
        return self.policy in EXACT_POLICIES or (self.tau_approx == 0.0 and self.tau_int8 == 0.0)


def own_shape(info: EngineInfo) -> str | None:
    """The timing shape whose real model has this model's routing (a shipped miniature's, e.g.
    deepseek-v2-lite for spice-mini), or None: modeled times at it stand for that real model, while any
    other shape only resizes this model's routing."""
    return routing_shape(info.family, len(info.moe_layers), info.n_experts, info.top_k)


def default_shape(info: EngineInfo) -> str:
    """The shape a modeled run of this model times unless told otherwise: its own (`own_shape`: the real model a
    miniature stands for, routing and all), else ``native``, the model's own sizes (a Mixtral checkpoint's modeled
    copies are Mixtral's experts, not another model's)."""
    return own_shape(info) or NATIVE_SHAPE
