"""Held-out data the engine evaluates and calibrates on: read from files, never generated here.

    <model dir>/spice-heldout.json.gz   written by `python -m training.export_heldout` for the shipped
                                        model: held-out stories and prose (calibration / eval halves),
                                        bench prompts, the stories of the long-context prompt

Also the built-in prompts every tool falls back to (`DEFAULT_PROMPTS`). Knows nothing of how the
data was made: the training package does, and the engine does not import it.
"""
from __future__ import annotations

import functools
import gzip
import json
import zlib
from pathlib import Path

from spice_core.errors import ConfigError

HELDOUT_FILENAME = "spice-heldout.json.gz"
HELDOUT_FORMAT = "spice-heldout-v1"
_MAX_BYTES = 64 * 1024 * 1024        # decompressed: the shipped file is ~6 MB

DEFAULT_PROMPTS = (
    "Once upon a time, a little cat found a red ball in the garden.",
    "Tell me a story about a dog who lost his bone.",
    "The girl looked up at the stars and wondered",
    "It was a rainy day, and Tom did not want to stay inside.",
    "Lily and her mom went to the market to buy apples.",
    "The old tree in the park had a secret door.",
    "Ben wanted to build the biggest sand castle on the beach.",
    "One morning the sun did not come up.",
)


def _default_dir() -> Path:
    from spice_core.model.loader import DEFAULT_MODEL_DIR
    return DEFAULT_MODEL_DIR


@functools.lru_cache(maxsize=4)
def _read(path: Path) -> dict:
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read(_MAX_BYTES + 1)
        if len(raw) > _MAX_BYTES:
            raise ConfigError(f"{path} decompresses to more than {_MAX_BYTES >> 20} MiB: regenerate it with "
                              "python -m training.export_heldout")
        data = json.loads(raw)
    except (OSError, EOFError, zlib.error, ValueError) as e:     # truncated or not gzip, or not JSON (UTF-8)
        raise ConfigError(f"{path} cannot be read ({type(e).__name__}: {str(e)[:80]}): regenerate it with "
                          "python -m training.export_heldout") from None
    if not isinstance(data, dict) or data.get("format") != HELDOUT_FORMAT:
        raise ConfigError(f"{path} is not a {HELDOUT_FORMAT} file: regenerate it with python -m training.export_heldout")
    return data


def load_heldout(model_dir: Path | None = None) -> dict | None:
    """The held-out data beside ``model_dir`` (default: the shipped model), or None when there is none."""
    path = Path(model_dir or _default_dir()) / HELDOUT_FILENAME
    return _read(path.resolve()) if path.is_file() else None


def _require(model_dir: Path | None, instead: str = "list the prompts as text") -> dict:
    """The held-out data, or ConfigError saying how to write it or what to do ``instead``."""
    data = load_heldout(model_dir)
    if data is None:
        where = Path(model_dir or _default_dir()) / HELDOUT_FILENAME
        raise ConfigError(f"no held-out data at {where}: write it with python -m training.export_heldout, "
                          f"or {instead}")
    return data


def stories(part: str, n: int | None = None, model_dir: Path | None = None) -> list[str]:
    """Held-out stories of one half ("calibration" or "eval"), plain and chat-wrapped as in training."""
    out = _require(model_dir)["stories"][part]
    return list(out if n is None else out[:n])


def prose(part: str, model_dir: Path | None = None) -> tuple[list[str], list[str]]:
    """(prose chunks, domains they come from) of one half of the validation split."""
    data = _require(model_dir)
    return list(data["prose"][part]), list(data["prose_domains"][part])


def prompts(n: int, model_dir: Path | None = None) -> list[dict]:
    """Bench prompts from the eval half: {"text": opening} or {"chat": request} each."""
    got = _require(model_dir)["prompts"]
    if n > len(got):
        raise ConfigError(f"\"prompts\": {{\"heldout\": {n}}} asks for more than the {len(got)} held-out prompts "
                          "there are: ask for fewer")
    return list(got[:n])


def long_stories(model_dir: Path | None = None) -> list[str]:
    """Held-out stories for the long-context prompt, in order."""
    return list(_require(model_dir, instead='drop "long_prompt_tokens" (the long prompt is made of them)')["long_stories"])
