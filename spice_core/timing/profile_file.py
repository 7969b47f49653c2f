"""A hardware profile read from a file (`calibrate-hw`, `recalibrate`): its fields checked (profiles.py), then its
prices: every command that takes ``--hw-profile`` (generate, tune, quality, bench, recalibrate) reads it here.

A profile whose numbers are each finite and positive can still price an operation at zero, infinity, NaN or more than
a day (a rate of 1e-300 GB/s, or 1e308 everywhere); modeled with, it failed later, in a JSON writer or a division,
after the work (a tune's whole search), or wrote NaN into a benchmark's results. It is refused when read.
"""
from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

from spice_core.errors import ConfigError
from spice_core.timing.costs import CostModel
from spice_core.timing.profiles import NATIVE_SHAPE, HardwareProfile, get_shape, profile_from_dict, shape_names

MAX_MODELED_MS = 86_400_000.0       # a day: no modeled operation of a sane profile comes near it


def profile_from_file(path, flag: str = "--hw-profile") -> HardwareProfile:
    """A profile JSON written by `calibrate-hw` or `recalibrate`; ``flag`` names the option in errors."""
    from spice_core.user_files import read_json

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{flag} {path}: no such file: write one with `python -m spice_core calibrate-hw --out FILE` "
                          "(then `recalibrate`)")
    where = f"{flag} {path}"
    profile = profile_from_dict(read_json(path, flag, dict, limit_bytes=1_000_000), where=where)
    check_prices(profile, where)
    return profile


def check_prices(profile: HardwareProfile, where: str) -> None:
    """ConfigError when ``profile`` gives a fixed cost (``*_us``) over a day, or prices an expert's copy, an expert or a
    layer on the GPU, an expert on the CPU lane (alone or beside others) or the host's step outside (0, a day) ms, or
    at NaN, for any of the shipped shapes (the host's step may be 0: a profile that does not model the host)."""
    def refuse(what: str):
        return ConfigError(f"{where}: {what}: use measured values (python -m spice_core calibrate-hw)")

    for f in fields(profile):
        if f.name.endswith("_us") and getattr(profile, f.name) / 1e3 >= MAX_MODELED_MS:
            raise refuse(f"{f.name}={getattr(profile, f.name):g} µs is more than a day")
    for name in shape_names():
        if name == NATIVE_SHAPE:
            continue
        c = CostModel(profile, get_shape(name))
        try:
            prices = {"an expert's copy": c.copy_ms(), "an expert on the GPU": c.gpu_expert_ms(1),
                      "a layer on the GPU": c.gpu_layer_ms(1), "an expert on the CPU lane": c.cpu_expert_ms(1),
                      "an expert on the CPU lane beside others": c.cpu_expert_ms(1) / profile.cpu_side_speedup,
                      "the host's step": c.host_step_ms()}
        except ZeroDivisionError:       # a rate of 0 (gpu_tflops, cpu_gflops, d2h_gbps may be 0 as fields)
            raise refuse(f"a rate of 0 prices some operation at infinity for {name}'s shape") from None
        for what, ms in prices.items():
            low_ok = what == "the host's step" and ms == 0
            if not (math.isfinite(ms) and (0 < ms or low_ok) and ms < MAX_MODELED_MS):
                raise refuse(f"its numbers price {what} at {ms:g} ms for {name}'s shape (a rate near 0 or near the "
                             "largest float)")
