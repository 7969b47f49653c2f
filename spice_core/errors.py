"""Errors a user can cause. Each message says what to change.

Internal invariants use `assert`; everything a user can trigger through the CLI, the
API or the app raises a `SpiceError` subclass whose text is shown as-is (no traceback).
"""


def quoted(value, limit: int = 40) -> str:
    """A caller's value as an error message quotes it (its repr), at most ``limit`` characters: it may be megabytes.
    An integer past ~60 digits is described by its size (its repr may even be refused: Python's digit limit)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"{'a negative' if value < 0 else 'an'} integer of about {int(value.bit_length() * 0.30103) + 1:,} digits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class SpiceError(Exception):
    """Base class: the message is one line that names the setting to change."""


class ConfigError(SpiceError):
    """A setting is out of range or unknown (names the field, the value and what is allowed)."""


class ModelLoadError(SpiceError):
    """The model path, hub id or checkpoint cannot be used."""


class UnsupportedModelError(ModelLoadError):
    """The checkpoint is not one of the supported MoE families."""


class ModelOutputError(ModelLoadError):
    """The loaded model computes logits that are not finite (NaN or infinity): its weights are damaged."""


class PromptError(SpiceError):
    """The prompt is empty, too long or otherwise unusable."""


class ContextError(PromptError):
    """The prompt does not fit the model's context (or leaves the reply less room than asked): shorter text fits."""


class ArtifactError(SpiceError):
    """Calibration artifacts (draft heads, LoRE factors) are missing or belong to another model."""


class EngineBusyError(SpiceError):
    """Another generation is running on this engine: wait for it to finish, or stop it."""
