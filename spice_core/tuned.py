"""A tuned setting as the tuner leaves it beside a model (`spice-tuned.json`), and finding it again.

One record per hardware profile, shape and cache fraction; `generate --tuned` and the app read it. Plain data:
knows nothing of how the setting was searched (`spice_core.tuner`).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from spice_core.config import RunSettings
from spice_core.errors import ConfigError

TUNED_FILE = "spice-tuned.json"


@dataclass
class TuneRecord:
    """What the tuner found: saved beside the model (`save`), shown by the app and the CLI."""

    model: str
    policy: str
    profile: str
    shape: str
    cache_frac: float
    budget: dict
    setting: dict
    speed_ms: float
    speed_timing: str               # "modeled (profile P, shape S)" or "measured (device)"
    ppl_pct: float
    agreement: float
    quality_measured_on: str        # the held-out text and prompts
    reason: str                     # one sentence: why this setting
    trials: list = field(default_factory=list)
    stopped: bool = False
    tune_s: float = 0.0
    seed: int = 0
    confirmed_on: str = ""          # the confirmation sample lossy candidates were re-measured on ("": none ran)

    def settings(self, base: RunSettings) -> RunSettings:
        """``base`` with the picked setting applied (policy spice)."""
        return replace(base, policy=self.policy, **self.setting)

    def as_dict(self) -> dict:
        return asdict(self)

    def matches(self, *, profile: str, shape: str, cache_frac: float) -> bool:
        return self.profile == profile and self.shape == shape and abs(self.cache_frac - cache_frac) < 1e-9


def tuned_path(model_dir: Path | str) -> Path:
    return Path(model_dir) / TUNED_FILE


def save(record: TuneRecord, path: Path) -> None:
    """Add ``record`` to the tuned file at ``path``, replacing one for the same profile, shape and cache.

    Written beside it first and then renamed over it, so a write that fails (a read-only folder, a full disk)
    leaves the file as it was: OSError then, and the records already saved are kept."""
    path = Path(path)
    records = [r for r in load_all(path) if not r.matches(profile=record.profile, shape=record.shape,
                                                          cache_frac=record.cache_frac)] if path.exists() else []
    records.append(record)
    text = json.dumps({"format": 1, "records": [r.as_dict() for r in records]}, indent=1, allow_nan=False) + "\n"
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        part.write_text(text, encoding="utf-8")
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


def load_all(path: Path) -> list[TuneRecord]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        return [TuneRecord(**r) for r in doc["records"]]
    except FileNotFoundError:
        raise ConfigError(f"no tuned settings at {path}: run `python -m spice_core tune --model M` first") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path} is not a tuned-settings file ({type(e).__name__}: {e}): run the tuner again "
                          "to rewrite it") from None


def find(path: Path, *, profile: str, shape: str, cache_frac: float) -> TuneRecord:
    records = load_all(path)
    for r in records:
        if r.matches(profile=profile, shape=shape, cache_frac=cache_frac):
            return r
    have = "; ".join(f"profile {r.profile}, shape {r.shape}, cache {r.cache_frac:g}" for r in records) or "none"
    raise ConfigError(f"{path} has no tuned setting for profile {profile}, shape {shape}, cache {cache_frac:g} "
                      f"(it has: {have}): run `python -m spice_core tune` with those")
