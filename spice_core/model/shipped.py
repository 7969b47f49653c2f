"""The models shipped in ``assets/``, by name, and the real model each one is a miniature of.

    name               folder                    shape (timing/profiles.json)   real model
    spice-mini         assets/spice-mini         deepseek-v2-lite               DeepSeek-V2-Lite
    spice-mini-qwen2   assets/spice-mini-qwen2   qwen2-57b-a14b                 Qwen2-57B-A14B

A miniature has its real model's topology (MoE layers, experts, top-k) at small widths, so its routing
stands for the real model's: modeled times at its *own* shape time the real model's layout. A shape applied
to the other miniature times that miniature's routing at the shape's sizes only (pages and the CLI say so).
Folders that are missing (not trained yet, removed) are simply not offered. A user names a model by a
folder, a hub id or a shipped name; `model_argument` turns the name into its folder and refuses an unknown
bare name with the known ones. Knows nothing of torch or of loading.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spice_core.errors import ConfigError

ASSETS = Path(__file__).resolve().parents[2] / "assets"


@dataclass(frozen=True)
class ShippedModel:
    name: str
    shape: str          # the timing shape of the real model it is a miniature of
    real: str           # that model's name, for people

    @property
    def folder(self) -> Path:
        return ASSETS / self.name

    @property
    def present(self) -> bool:
        return (self.folder / "config.json").is_file()


SHIPPED = (ShippedModel("spice-mini", "deepseek-v2-lite", "DeepSeek-V2-Lite"),
           ShippedModel("spice-mini-qwen2", "qwen2-57b-a14b", "Qwen2-57B-A14B"))
NAMES = tuple(m.name for m in SHIPPED)


def shipped(name: str) -> ShippedModel | None:
    return next((m for m in SHIPPED if m.name == name), None)


def present_models() -> tuple[ShippedModel, ...]:
    """The shipped models whose folders are in this checkout, in the table's order (the first is the default)."""
    return tuple(m for m in SHIPPED if m.present)


def model_argument(text, flag: str = "--model"):
    """What a user typed for a model, as the loader takes it: None (the default model) and anything that
    exists or looks like a path or a hub id (org/name) pass through; a shipped model's name becomes its
    folder. ConfigError (one line) for a shipped model whose folder is missing and for an unknown bare name."""
    if text is None:
        return None
    s = str(text).strip()
    if not s:       # an empty value (a variable that was not set) must not quietly mean the default model
        raise ConfigError(f"{flag} is empty: pass a shipped model's name ({', '.join(NAMES)}), a checkpoint folder "
                          f"or a hub id, or leave {flag} out for the default")
    if Path(s).expanduser().exists() or "/" in s or "\\" in s or s.startswith((".", "~")):
        return text
    model = shipped(s)
    if model is None:
        raise ConfigError(f"{flag} {s!r} is neither a shipped model ({', '.join(NAMES)}) nor a folder: pass one "
                          "of those names, a checkpoint folder or a hub id like org/name")
    if not model.present:
        have = ", ".join(m.name for m in present_models()) or "none"
        raise ConfigError(f"{flag} {s}: this checkout has no assets/{s} (shipped models present: {have}): add "
                          "the folder or pick a present one")
    return str(model.folder)
