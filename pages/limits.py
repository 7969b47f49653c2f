"""The limits a shared deployment puts on one visitor: the same at the UI and at the API.

The sliders stop at these values, and the handlers refuse anything beyond them with a message
that names the control, because API clients never see a slider. Chosen so that one visitor holds
the one shared engine for well under a minute on a 2-vCPU CPU Space (the modeled times shown do
not depend on how fast the host is; the wall time does).
"""
from __future__ import annotations

from dataclasses import dataclass

from spice_core.errors import ConfigError


@dataclass(frozen=True)
class Limits:
    chat_max_new_tokens: int = 512         # "Max new tokens" slider
    sweep_min_tokens: int = 4              # "Tokens per run" slider
    sweep_max_tokens: int = 128
    sweep_max_runs: int = 120
    sweep_max_prompts: int = 8
    sweep_token_budget: int = 4096         # runs × tokens per run, references included
    history_max_messages: int = 200        # chat messages kept from a client's history (newest)
    trace_max_window_tokens: int = 4096    # "Tokens shown" in the trace explorer


def bounded_number(value, control: str, lo: float, hi: float, *, integer: bool = False) -> float | int:
    """A finite number in [lo, hi] from a UI or API value, or ConfigError naming the control."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{control}: {value!r} is not a number; use a value from {lo:g} to {hi:g}")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{control}: {value!r} is not a number; use a value from {lo:g} to {hi:g}") from None
    if number != number or number in (float("inf"), float("-inf")) or not lo <= number <= hi:
        raise ConfigError(f"{control}={str(value)[:20]} is out of range: use a value from {lo:g} to {hi:g}")
    if integer:
        if not number.is_integer():
            raise ConfigError(f"{control}={number:g} must be a whole number from {lo:g} to {hi:g}")
        return int(number)
    return number


def strict_bool(value, control: str) -> bool:
    """True or False from a UI or API value: a checkbox sends a boolean; an API client may send "true" or
    "false". Anything else is refused by name (``bool("false")`` is True: never cast)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"{control}: {str(value)[:20]!r} is not true or false")
