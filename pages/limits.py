"""The limits a shared deployment puts on one visitor: the same at the UI and at the API.

The sliders stop at these values, and the handlers refuse anything beyond them with a message
that names the control, because API clients never see a slider. Chosen so that one visitor holds
the one shared engine for well under a minute on a 2-vCPU CPU Space (the modeled times shown do
not depend on how fast the host is; the wall time does).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from spice_core import errors
from spice_core.api import EngineInfo
from spice_core.errors import ConfigError


def quoted(value, limit: int = 20) -> str:
    """A visitor's value as a note quotes it: `spice_core.errors.quoted`, 20 characters unless ``limit`` says more."""
    return errors.quoted(value, limit)


def number_as_typed(value) -> str:
    """A number as a note quotes it: as typed (a string without quotes), at most 20 characters, except an integer,
    which is never cut to another number (`quoted`: longer ones shortened with "..." or described by size)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return quoted(value, 40)
    return str(value)[:20]


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


# The chat's sliders: (minimum, maximum, step). A slider's range is the range its setting takes in the app
# and its API: a browser clamps a number typed beyond it to the slider's end when its box is left.
# GPU cache size starts at the smallest step a model can run with (`slider_ranges`); Max new tokens: 1 to the
# app's limit (`Limits.chat_max_new_tokens`).
SLIDER_RANGES = {"cache_frac": (0.0, 1.0, 0.05), "tau_prefetch": (0.0, 1.0, 0.05), "tau_approx": (0.0, 0.2, 0.005),
                 "max_lookahead": (1, 16, 1), "temperature": (0.0, 2.0, 0.05)}


def min_cache_share(info: EngineInfo) -> Fraction:
    """The smallest GPU cache size (a share of all routed experts, every expert the same size) the engine runs
    with: one layer's top-k experts; the engine refuses less. 0 for an engine that does not say its sizes."""
    n_routed = getattr(info, "n_experts", 0) * len(getattr(info, "moe_layers", ()) or ())
    return min(Fraction(1), Fraction(getattr(info, "top_k", 0), n_routed)) if n_routed else Fraction(0)


def step_decimals(step: float) -> int:
    """Decimals a value on a slider of ``step`` is written with (0.005 -> 3, 0.05 -> 2, 1 -> 0)."""
    return max(0, -Decimal(str(step)).normalize().as_tuple().exponent)


def on_step(value: float, low: float, step: float) -> float:
    """``value`` at the nearest of a slider's steps from ``low`` (halves up), written as the slider writes it."""
    k = math.floor((Fraction(str(value)) - Fraction(str(low))) / Fraction(str(step)) + Fraction(1, 2))
    return round(float(Fraction(str(low)) + k * Fraction(str(step))), step_decimals(step))


def slider_ranges(info: EngineInfo, limits: Limits | None = None) -> dict[str, tuple]:
    """The chat's sliders for this model: SLIDER_RANGES with GPU cache size from the first step that holds one
    layer's top-k experts (0 was on the slider and the engine refused it whatever the model), and Max new tokens up
    to the app's cap. The app and its API take each setting within these ranges."""
    low, high, step = SLIDER_RANGES["cache_frac"]
    need = min_cache_share(info)
    first = min(high, float(math.ceil(need / Fraction(str(step))) * Fraction(str(step)))) if need > low else low
    return SLIDER_RANGES | {"cache_frac": (round(first, step_decimals(step)), high, step),
                            "max_new_tokens": (1, (limits or Limits()).chat_max_new_tokens, 1)}


class OutOfRange(ConfigError):
    """A number typed into a slider's box that the slider does not take (not a number, or beyond its ends)."""


def on_slider(raw, low: float, high: float, step: float) -> float:
    """A number typed into a slider's box, at the nearest of its steps (the slider shows no other); OutOfRange
    when it is not a finite number from ``low`` to ``high``, with the words a note completes ("… is out of
    range")."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise OutOfRange("is not a number")
    try:
        number = float(raw)
    except (ValueError, OverflowError):
        raise OutOfRange("is not a number") from None
    if not math.isfinite(number):
        raise OutOfRange("is not a number")
    if not low <= number <= high:
        raise OutOfRange("is out of range")
    return min(high, max(low, on_step(number, low, step)))


def cache_words(info: EngineInfo) -> str:
    """What a page's GPU cache size takes for this model, as a note ends: "it takes 0.25 to 1 for this model (0.25
    is the first step that holds one layer's top-4 experts)"; the part in brackets only when the model needs more
    than 0."""
    low, high, _step = slider_ranges(info)["cache_frac"]
    need = f" ({low:g} is the first step that holds one layer's top-{info.top_k} experts)" if low > 0 else ""
    return f"it takes {low:g} to {high:g} for this model{need}"


def cache_share(raw, info: EngineInfo, control: str = "GPU cache size") -> float:
    """A GPU cache size from a page other than the chat (the sweep, the tune) or its API, as typed, within the chat
    slider's range for this model (`slider_ranges`: the engine refuses less than one layer's top-k experts);
    ConfigError naming the control, the value and that range otherwise. Between two steps it stays as typed:
    these pages apply nothing else the slider would have to agree with."""
    low, high, step = slider_ranges(info)["cache_frac"]
    typed = str(raw).strip()[:20] if isinstance(raw, (str, int, float)) and not isinstance(raw, bool) else "that"
    try:
        if typed == "":
            raise OutOfRange("is empty")
        on_slider(raw, low, high, step)
    except OutOfRange as exc:
        what = "the box is empty" if typed == "" else f"{typed} {exc}"
        raise ConfigError(f"{control}: {what}; {cache_words(info)}") from None
    return float(raw)


def box_refusal(raw, take, low: float, high: float, step: float) -> tuple[float, str] | None:
    """A number left in the box of a slider from ``low`` to ``high`` that the page does not take (``take(raw)`` raises
    ConfigError): (the value the box goes to, the note that says so); None for one it takes. The browser brings a
    number beyond a slider's ends to the nearest end, and anything else (an empty box) to its low end, without a word;
    one between two steps it leaves as typed, so the page puts it on the nearest step. The note gives that value."""
    try:
        take("" if raw is None else raw)
        return None
    except ConfigError as exc:
        try:
            went = float(raw)
        except (TypeError, ValueError, OverflowError):
            went = low
        went = on_step(min(high, max(low, went)), low, step) if math.isfinite(went) else low
        return went, f"⚠ {exc}. The box went to {went:g}."


def cache_refusal(raw, info: EngineInfo) -> tuple[float, str] | None:
    """A number left in a GPU cache size box that the page does not take (`cache_share`): `box_refusal`'s."""
    low, high, step = slider_ranges(info)["cache_frac"]
    return box_refusal(raw, lambda typed: cache_share(typed, info), low, high, step)


def bounded_number(value, control: str, lo: float, hi: float, *, integer: bool = False) -> float | int:
    """A finite number in [lo, hi] from a UI or API value, or ConfigError naming the control."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{control}: {quoted(value)} is not a number; use a value from {lo:g} to {hi:g}")
    if isinstance(value, str) and not value.strip():
        raise ConfigError(f"{control}: the box is empty; use a value from {lo:g} to {hi:g}")
    try:
        number = float(value)
    except OverflowError:       # an integer like 10**400 sent by an API client
        raise ConfigError(f"{control}={number_as_typed(value)} is out of range: use a value from {lo:g} to {hi:g}") from None
    except (TypeError, ValueError):
        raise ConfigError(f"{control}: {quoted(value)} is not a number; use a value from {lo:g} to {hi:g}") from None
    if number != number or number in (float("inf"), float("-inf")) or not lo <= number <= hi:
        raise ConfigError(f"{control}={number_as_typed(value)} is out of range: use a value from {lo:g} to {hi:g}")
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
    raise ConfigError(f"{control}: {quoted(value)} is not true or false: use true or false")
