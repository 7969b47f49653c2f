"""How sizes and bounds read in what a user sees (errors, notes, a command's summary).

    format_bytes(17_300_000) -> "17.3 MB"      decimal units chosen by size, three significant figures
    round_up(0.0036057)      -> "0.00361"      a bound rounded up, in plain decimal, so it can be typed back

Decimal units (kB, MB, GB: powers of 1000), as `--cache-gb` counts and bandwidths are quoted, so a size in a
message and the flag that changes it use the same unit. A bound a message asks for ("raise --cache-frac to
>= X") is rounded up, never to the nearest: the value typed back must still meet it. Knows nothing of what is
measured; no logging, no I/O.
"""
from __future__ import annotations

from decimal import ROUND_CEILING, Decimal

SIZE_UNITS = (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3))
SIGNIFICANT_DIGITS = 3


def format_bytes(n_bytes: float) -> str:
    """``n_bytes`` in the largest decimal unit it reaches, to three significant figures: 12 -> "12 B",
    999 -> "999 B", 1536 -> "1.54 kB", 17.3e6 -> "17.3 MB", 2.7e9 -> "2.70 GB", 999_999 -> "1.00 MB" (not
    "1000 kB")."""
    for unit, size in SIZE_UNITS:
        value = n_bytes / size
        if abs(value) >= 0.9995:       # "1.00 MB" from 999,500 bytes up, never "1000 kB"
            return f"{value:.{_decimals(abs(value))}f} {unit}"
    return f"{n_bytes:.0f} B"


def _decimals(value: float) -> int:
    """Decimals that give ``value`` (>= 0.9995) three significant figures: 2 below 10, 1 below 100, else none."""
    return 0 if value >= 99.95 else 1 if value >= 9.995 else 2


def round_up(value: float, digits: int = SIGNIFICANT_DIGITS) -> str:
    """``value`` rounded up to ``digits`` significant figures, in plain decimal (no exponent): 0.0036057 ->
    "0.00361", 1.23e-5 -> "0.0000123", 0.125 -> "0.125", 0 -> "0". Never below ``value``, so a bound a message
    asks for still holds when typed back."""
    exact = Decimal(repr(float(value)))
    if exact == 0:
        return "0"
    step = Decimal(1).scaleb(exact.adjusted() - digits + 1)
    return format(exact.quantize(step, rounding=ROUND_CEILING).normalize(), "f")
