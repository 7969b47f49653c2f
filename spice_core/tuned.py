"""A tuned setting as the tuner leaves it beside a model (`spice-tuned.json`), and finding it again.

One record per hardware profile, shape and cache fraction; `generate --tuned` and the app read it. Plain data:
knows nothing of how the setting was searched (`spice_core.tuner`).

Which picks are within their budget (`TuneRecord.within_budget_for`): an exact pick always (tau_approx 0: the exact
model's tokens); a lossy one only when its quality held on the confirmation sample, whose greedy generations were at
least as long as the replies it is used for. Greedy agreement falls with the length of a generation (a greedy
reply that diverged from the exact one rarely finds its way back), so agreement measured over a few tokens says
little about a reply of a hundred. Records written before the confirmation existed, or by a tune without it, have
no `confirmed` flag and count as not confirmed: they are offered with that caveat, never as within the budget.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from spice_core.config import RunSettings
from spice_core.errors import ConfigError
from spice_core.user_files import is_number

TUNED_FILE = "spice-tuned.json"


# What a measured setting came to (the tuner writes it into the record's trials; `TuneRecord.verdict` reads it back).
EXACT, HELD, FAILED, RULED_OUT, UNCONFIRMED, MISSED = "exact", "held", "failed", "ruled out", "unconfirmed", "missed"
WITHIN = (EXACT, HELD)
VERDICTS = (EXACT, HELD, FAILED, RULED_OUT, UNCONFIRMED, MISSED)
# The knobs a record's setting holds: what the tuner searches; the rest of a run's settings are the caller's.
TUNED_KNOBS = ("tau_approx", "tau_prefetch", "max_lookahead", "lore_rank", "cpu_lane")


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
    confirmed: bool = False         # a lossy pick's quality held on the confirmation sample (exact picks need none)
    reply_tokens: int = 0           # greedy tokens per prompt of that sample: the reply length the pick holds for
                                    # (0: no confirmation ran)
    calibration: str = ""           # the artifacts' calibration digest it was measured with ("": none, or unknown)

    def settings(self, base: RunSettings) -> RunSettings:
        """``base`` with the picked setting applied (policy spice), and tau_int8 0 as the tuner measured it: a lossy
        int8 lane on top would make the quality it quotes another setting's (review)."""
        return replace(base, policy=self.policy, tau_int8=0.0, **self.setting)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def exact(self) -> bool:
        return float(self.setting.get("tau_approx", 0.0)) <= 0.0

    def within_budget_for(self, reply_tokens: int) -> bool:
        """Whether the pick may be called within its budget for replies of ``reply_tokens`` tokens: exact, or
        confirmed on greedy generations at least that long."""
        return self.exact or (self.confirmed and self.reply_tokens >= reply_tokens)

    def caveat(self, reply_tokens: int) -> str:
        """Why the pick is not within its budget for such replies, in words ("" when it is)."""
        if self.within_budget_for(reply_tokens):
            return ""
        if not self.confirmed and self.confirmed_on and not self.reply_tokens:    # written before those two fields
            return (f"its quality was confirmed ({self.confirmed_on}) before picks recorded the reply length they "
                    f"hold for, so it is not known to hold for replies of {reply_tokens} tokens")
        if not self.confirmed:
            return (f"its quality was never confirmed on replies as long as yours ({reply_tokens} tokens): it stands on "
                    "a sample of a few greedy tokens per prompt, where agreement runs higher than over a whole reply")
        return (f"its quality was confirmed on replies of {self.reply_tokens} tokens, shorter than yours "
                f"({reply_tokens} tokens), and greedy agreement falls as replies grow")

    @staticmethod
    def verdict(trial: dict) -> str:
        """What a measured setting (one of ``trials``) came to: "exact" (tau_approx 0: within any budget), "held"
        (its quality held on the confirmation sample), "failed" (it did not), "ruled out" (not re-measured: a less
        lossy setting failed there), "unconfirmed" (passed the short screening only) or "missed" (failed the
        screening). Records written before the verdicts were kept get theirs from ``met`` and the confirmation's
        numbers."""
        if "verdict" in trial:
            return trial["verdict"]
        if trial.get("stage") == "exact" or not trial.get("tau_approx"):
            return EXACT
        if "confirm_agreement" in trial:
            return HELD if trial.get("met") else FAILED
        return UNCONFIRMED if trial.get("met") else MISSED

    def matches(self, *, profile: str, shape: str, cache_frac: float) -> bool:
        return self.profile == profile and self.shape == shape and abs(self.cache_frac - cache_frac) < 1e-9

    def same_key(self, other: "TuneRecord") -> bool:
        """One record per model, profile, shape and cache in a file: another model's pick is not replaced."""
        return self.model == other.model and other.matches(profile=self.profile, shape=self.shape,
                                                           cache_frac=self.cache_frac)


def tuned_path(model_dir: Path | str) -> Path:
    return Path(model_dir) / TUNED_FILE


def save(record: TuneRecord, path: Path) -> None:
    """Add ``record`` to the tuned file at ``path``, replacing one for the same model, profile, shape and cache (a
    file shared by several models' tunes kept only the last model's pick, review).

    Written beside it first and then renamed over it, so a write that fails (a read-only folder, a full disk)
    leaves the file as it was: OSError then, and the records already saved are kept."""
    path = Path(path)
    records = [r for r in load_all(path) if not r.same_key(record)] if path.exists() else []
    records.append(record)
    text = json.dumps({"format": 1, "records": [r.as_dict() for r in records]}, indent=1, allow_nan=False) + "\n"
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        part.write_text(text, encoding="utf-8")
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


# What each field of a record must be in the file: (Python types, in words). JSON numbers are int or float, never bool.
_JSON_TYPES = {"str": (str, "a string"), "float": ((int, float), "a number"), "int": (int, "an integer"),
               "bool": (bool, "true or false"), "dict": (dict, "an object"), "list": (list, "a list")}


def _record(r, i: int) -> TuneRecord:
    """Record ``i`` of a tuned file, with its fields' types, its budget and its setting checked (ValueError says which
    is wrong): a hand-edited value (``"cache_frac": "0.25"``) used to fail only where it was used, after a whole tune."""
    if not isinstance(r, dict):
        raise ValueError(f"record {i} is {json.dumps(r)[:60]}, not an object")
    rec = TuneRecord(**r)         # TypeError: a missing or unknown field
    for f in fields(TuneRecord):
        v, (want, said) = getattr(rec, f.name), _JSON_TYPES[f.type]
        if (isinstance(v, bool) and want is not bool) or not isinstance(v, want) or (isinstance(v, float) and not
                                                                                     math.isfinite(v)):
            raise ValueError(f"record {i}: {f.name} is {json.dumps(v)[:60]}, not {said}")
    for key in ("ppl_pct", "agreement"):
        if key in rec.budget and rec.budget[key] is not None and not is_number(rec.budget[key]):
            raise ValueError(f"record {i}: budget {key} is {json.dumps(rec.budget[key])[:60]}, not a number")
    try:
        rec.settings(RunSettings())
    except (ConfigError, TypeError) as e:
        raise ValueError(f"record {i}: its setting {json.dumps(rec.setting)[:120]} is not one spice runs ({e})") from None
    if set(rec.setting) != set(TUNED_KNOBS):
        raise ValueError(f"record {i}: its setting has {sorted(rec.setting)}, not the tuned knobs {list(TUNED_KNOBS)}"
                         " (anything else there would be applied too)")
    for j, t in enumerate(rec.trials):
        bad = _bad_trial(t)
        if bad:
            raise ValueError(f"record {i}: trial {j} {bad}")
    return rec


def _bad_trial(t) -> str:
    """What is wrong with one of a record's trials as the pages read it ("" when nothing): an object with the tuned
    knobs, numbers for its speed and quality and a known verdict (a hand-edited trial failed the app's page load)."""
    if not isinstance(t, dict):
        return f"is {json.dumps(t)[:60]}, not an object"
    missing = [k for k in (*TUNED_KNOBS, "speed_ms", "ppl_pct", "agreement") if k not in t]
    if missing:
        return f"has no {', '.join(missing)}"
    for k in ("speed_ms", "ppl_pct", "agreement"):
        if not is_number(t[k]):
            return f"has {k} {json.dumps(t[k])[:40]}, not a number"
    for k in ("confirm_ppl_pct", "confirm_agreement"):          # absent or null: not re-measured
        if t.get(k) is not None and not is_number(t[k]):
            return f"has {k} {json.dumps(t[k])[:40]}, not a number"
    if (t.get("confirm_ppl_pct") is None) != (t.get("confirm_agreement") is None):
        return "has one of confirm_ppl_pct and confirm_agreement without the other"
    try:
        RunSettings(policy="spice", **{k: t[k] for k in TUNED_KNOBS})
    except (ConfigError, TypeError) as e:
        return f"has knobs spice does not run ({e})"
    if not isinstance(t["cpu_lane"], bool):
        return f"has cpu_lane {json.dumps(t['cpu_lane'])[:20]}, not true or false"
    if "verdict" in t and t["verdict"] not in VERDICTS:
        return f"has verdict {json.dumps(t['verdict'])[:40]}, not one of {', '.join(VERDICTS)}"
    return ""


def load_all(path: Path) -> list[TuneRecord]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        return [_record(r, i) for i, r in enumerate(doc["records"])]
    except FileNotFoundError:
        raise ConfigError(f"no tuned settings at {path}: run `python -m spice_core tune` on this model first (with the "
                          "--profile, --shape and --cache-frac you generate with), or pass --tuned FILE") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path} is not a tuned-settings file ({type(e).__name__}: {e}): move it aside or delete it, "
                          "then run `python -m spice_core tune` again (or pass --out with another file)") from None


def check_can_save(path: Path, flag: str = "--out") -> None:
    """ConfigError, before a tune spends minutes, when `save` to ``path`` would fail after it: an existing file that
    is not a tuned-settings file (`load_all`'s message), or a folder it cannot write in."""
    from spice_core.user_files import check_writable_file

    check_writable_file(path, flag)
    if Path(path).exists():
        load_all(path)


def find(path: Path, *, profile: str, shape: str, cache_frac: float, model: str | None = None,
         calibration: str | None = None, prefer: str | None = None) -> TuneRecord:
    """The record for this profile, shape and cache; with ``model``, one tuned on that model only (a file copied
    from another model's folder holds that model's measured quality, not this one's); with ``calibration`` (the
    engine's artifacts' digest), one measured with those artifacts (`stale_reason`). Without ``model`` (the file
    beside the model, whatever its folder is called now), ``prefer``'s own pick when the file holds several models'
    for this key, and the one model's pick when it holds one model's only."""
    records = load_all(path)
    keyed = [r for r in records if r.matches(profile=profile, shape=shape, cache_frac=cache_frac)]
    if keyed:
        mine = [r for r in keyed if r.model == (model or prefer)]
        if not mine and model is None and len({r.model for r in keyed}) == 1:
            mine = keyed            # the file beside the model: its own picks, made when the folder had another name
        if not mine:
            others = ", ".join(sorted({r.model for r in keyed}))
            raise ConfigError(f"{path} was tuned on model {others}, not {model or prefer}: its measured quality says "
                              f"nothing of this one; run `python -m spice_core tune` on {model or prefer}")
        r = mine[-1]
        why = stale_reason(r, calibration)
        if why:
            raise ConfigError(f"{path}: {why}")
        return r
    have = "; ".join(f"profile {r.profile}, shape {r.shape}, cache {r.cache_frac:g}" for r in records) or "none"
    raise ConfigError(f"{path} has no tuned setting for profile {profile}, shape {shape}, cache {cache_frac:g} "
                      f"(it has: {have}): run `python -m spice_core tune` with those")


def stale_reason(record: TuneRecord, calibration: str | None) -> str:
    """Why ``record`` no longer describes the model's artifacts ("": it does, or either digest is unknown): its pick's
    quality was measured with draft heads and LoRE that a later `calibrate` replaced."""
    if not calibration or not record.calibration or record.calibration == calibration:
        return ""
    return ("its pick was tuned with calibration artifacts that were rebuilt since (calibrate ran after tune): its "
            "measured quality says nothing of the new ones; run `python -m spice_core tune` again")
