"""The sweep's inputs: the page's boxes (or an API call's values) checked and turned into a plan of runs.

    prompts, policies, τ value lists, cache, tokens, profile, shape ──► plan_sweep ──► SweepPlan
        (prompts, the grid of RunSettings, the base settings, notes), or a ConfigError naming the box to change

The grid only varies what a policy uses: τ_prefetch for prefetching policies, τ_approx for the lossy ones (an exact
policy ignores it), nothing for the plain baselines. Each threshold takes the engine's range for it
(spice_core.api.SETTING_RANGES, the one source): a sweep may look past the chat's τ_approx slider, which stops
where approximation stops being useful. Its size is capped at the API as at the UI (pages.limits): runs,
prompts, tokens per run and tokens in all. Knows nothing of running the plan or of showing its results.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import gradio as gr

from spice_core.api import EXACT_POLICIES, SETTING_RANGES, EngineInfo, RunSettings
from spice_core.errors import ConfigError
from pages.common import FIELD_CONTROLS, check_profile_and_shape
from pages.limits import Limits, bounded_number, cache_share, quoted

PREFETCHING = ("gate_prefetch", "spice_prefetch", "oracle_prefetch", "spice", "spice_no_lore", "spice_no_cpu")
DEFAULT_POLICIES = ("lru", "spice_prefetch", "spice")
# The shipped model writes children's stories: prompts of the kind it learned, about the animals and things
# of the chat's examples (pages.chat.EXAMPLES).
DEFAULT_PROMPTS = ("Once upon a time, there was a little cat who had a red ball.",
                   "Once upon a time, a fox found a drum in the woods.",
                   "Once upon a time, a rabbit wanted a new hat.")
DEFAULT_TAU_PREFETCH = "0.1, 0.4, 0.7"
DEFAULT_TAU_APPROX = "0, 0.05, 0.1, 0.2"     # values the chat's τ_approx takes ([0, 0.2]; useful below ~0.1)
TOKENS_CONTROL = "Tokens per run"


class TypedData(gr.EventData):
    """A slider's release event: ``value`` is the number in its box as the browser had it when the box was left,
    before Gradio brings it to the slider's nearest end (None when the box held none)."""

    def __init__(self, target, data) -> None:
        super().__init__(target, data)
        self.value = data


@dataclass(frozen=True)
class SweepPlan:
    prompts: tuple[str, ...]
    settings: tuple[RunSettings, ...]     # the grid, in order
    base: RunSettings                     # what every run shares (cache, tokens, profile, shape)
    notes: tuple[str, ...] = ()           # what was changed from what was asked, said when the sweep ends

    @property
    def n_runs(self) -> int:
        """Every prompt once per setting, plus once with exact settings (its reference)."""
        return len(self.prompts) * (len(self.settings) + 1)


def values_range(field: str, ranges: Mapping[str, tuple] = SETTING_RANGES) -> str:
    """The values a threshold's list takes, in words ("each from 0 to 1"): the engine's range for it
    (spice_core.api.SETTING_RANGES), wider than the chat's slider offers where the slider stops at the useful part.
    ``ranges``: the table to read (a test passes another; the engine's is read-only)."""
    low, high = ranges[field]
    return f"each from {low:g} to {high:g}"


def parse_values(text: str, field: str, ranges: Mapping[str, tuple] = SETTING_RANGES) -> list[float]:
    """A threshold's list ("0, 0.1, 0.2" -> [0.0, 0.1, 0.2]) within the engine's range for ``field`` (tau_prefetch or
    tau_approx; ``ranges`` as for `values_range`); ConfigError naming the control otherwise."""
    name, (low, high) = FIELD_CONTROLS[field], ranges[field]
    items = [t for t in str(text or "").replace(";", ",").replace(" ", ",").split(",") if t.strip()]
    if not items:
        raise ConfigError(f"{name}: give at least one value, e.g. 0.2 or 0, 0.1, 0.3")
    values = []
    for t in items:
        try:
            if "_" in t:         # float() reads "0_1" as 1.0: not a value anyone typed as such
                raise ValueError(t)
            v = float(t)
        except ValueError:
            raise ConfigError(f"{name}: {quoted(t.strip())} is not a number; separate values with commas") from None
        if not low <= v <= high:
            raise ConfigError(f"{name}={v:g} is out of range: use values in [{low:g}, {high:g}]")
        values.append(v)
    return sorted(set(values))


def run_tokens(raw, limits: Limits) -> int:
    """Tokens per run from its box or an API call, within this server's limits; ConfigError naming the control."""
    return bounded_number(raw, TOKENS_CONTROL, limits.sweep_min_tokens, limits.sweep_max_tokens, integer=True)


def grid(policies, tau_prefetch: list[float], tau_approx: list[float], base: RunSettings) -> list[RunSettings]:
    """The settings to run: each policy crossed only with the thresholds it uses."""
    out = []
    for policy in policies:
        prefetch_values = tau_prefetch if policy in PREFETCHING else [base.tau_prefetch]
        approx_values = tau_approx if policy not in EXACT_POLICIES else [0.0]
        for tp in prefetch_values:
            for ta in approx_values:
                out.append(replace(base, policy=policy, tau_prefetch=tp, tau_approx=ta, temperature=0.0))
    return list(dict.fromkeys(out))


def reference_policy(policies) -> str:
    return "resident" if "resident" in policies else next(p for p in policies if p in EXACT_POLICIES)


def plan_sweep(info: EngineInfo, limits: Limits, defaults: RunSettings, max_prompt_chars: int, prompts_text,
               policies, tau_prefetch_text, tau_approx_text, cache_frac, max_new_tokens, profile,
               shape) -> SweepPlan:
    """The sweep the boxes ask for, within this server's limits; ConfigError naming the box to change otherwise."""
    if prompts_text is not None and not isinstance(prompts_text, str):     # an API client's list: not str() of it
        raise ConfigError(f"Prompts: send them as text, one per line, not as a {type(prompts_text).__name__}")
    prompts = [p.strip() for p in str(prompts_text or "").splitlines() if p.strip()]
    if not prompts:
        raise ConfigError("Prompts: write at least one prompt, one per line")
    if len(prompts) > limits.sweep_max_prompts:
        raise ConfigError(f"Prompts: {len(prompts)} given; the limit is {limits.sweep_max_prompts}")
    too_long = next((p for p in prompts if len(p) > max_prompt_chars), None)
    if too_long is not None:
        raise ConfigError(f"Prompts: one is {len(too_long):,} characters; the limit is {max_prompt_chars:,}")
    policies = _policies(info, policies)
    check_profile_and_shape(info, profile, shape)
    base = replace(defaults, cache_frac=cache_share(cache_frac, info),
                   max_new_tokens=run_tokens(max_new_tokens, limits), profile=profile, shape=shape)
    tau_approx = parse_values(tau_approx_text, "tau_approx")
    notes = []
    if not info.has_lore and tau_approx != [0.0]:
        tau_approx = [0.0]
        notes.append("τ_approx was left at 0: this model has no LoRE factors, so nothing is approximated.")
    tau_prefetch = parse_values(tau_prefetch_text, "tau_prefetch")
    # Counted before the grid is built: a few kB of values would otherwise build millions of settings, on the
    # engine's queue, only to be refused (review: 1,200 values a box took 53 s, and the cost grows with the square).
    n_settings = sum((len(tau_prefetch) if p in PREFETCHING else 1) * (1 if p in EXACT_POLICIES else len(tau_approx))
                     for p in policies)
    if n_settings * len(prompts) > limits.sweep_max_runs:
        raise ConfigError(f"it would make at least {n_settings * len(prompts):,} runs ({n_settings:,} settings × "
                          f"{len(prompts)} prompts); the limit is {limits.sweep_max_runs}. Use fewer values, policies "
                          "or prompts.")
    settings = grid(policies, tau_prefetch, tau_approx, base)
    plan = SweepPlan(tuple(prompts), tuple(settings), base, tuple(notes))
    _check_size(plan, limits)
    return plan


def _policies(info: EngineInfo, policies) -> list[str]:
    """The ticked policies, each one the engine offers."""
    if isinstance(policies, str):
        policies = [policies]
    if not isinstance(policies, (list, tuple)) or not all(isinstance(p, str) for p in policies) or not policies:
        raise ConfigError("Policies: tick at least one policy")
    unknown = [p for p in policies if p not in info.policies]
    if unknown:
        raise ConfigError(f"Policies: {unknown[0][:40]!r} is unknown; choose from {', '.join(info.policies)}")
    return list(dict.fromkeys(policies))


def _check_size(plan: SweepPlan, limits: Limits) -> None:
    """ConfigError when the plan makes more runs, or generates more tokens, than this server allows one sweep."""
    total, tokens = plan.n_runs, plan.base.max_new_tokens
    if total > limits.sweep_max_runs:
        raise ConfigError(f"it would make {total} runs ({len(plan.settings)} settings × {len(plan.prompts)} prompts, "
                          f"plus references); the limit is {limits.sweep_max_runs}. Use fewer values, policies or "
                          "prompts.")
    if total * tokens > limits.sweep_token_budget:
        raise ConfigError(f"it would generate up to {total * tokens:,} tokens ({total} runs × {tokens} tokens per "
                          f"run); this shared server allows {limits.sweep_token_budget:,} per sweep. Lower Tokens "
                          "per run, or use fewer values, policies or prompts.")
