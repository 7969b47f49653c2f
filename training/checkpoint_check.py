"""Check a model directory before loading it, and name the file that is wrong.

A truncated or overwritten safetensors shard makes transformers fail deep inside the
loader with a message that names neither the shard nor the fix. ``verify_checkpoint``
reads only the files' headers and sizes (milliseconds), plus — when the directory ships a
``checksums.sha256`` manifest, as ``assets/spice-mini`` does — their SHA-256 digests, and
raises ``ModelLoadError`` naming the file. It does not load tensors and does not know
which architectures the engine supports.
"""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

from spice_core.errors import ModelLoadError

CHECKSUMS = "checksums.sha256"
_MAX_HEADER_BYTES = 100_000_000


def _shard_names(model_dir: Path) -> list[str]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as e:
            raise ModelLoadError(f"{index} is not a valid safetensors index ({e}): restore it from the "
                                 f"original checkpoint") from e
        return sorted(set(weight_map.values()))
    if (model_dir / "model.safetensors").exists():
        return ["model.safetensors"]
    raise ModelLoadError(f"{model_dir} has no model.safetensors or model.safetensors.index.json: "
                         f"point --model at a directory written by save_pretrained")


def check_safetensors_file(path: Path) -> None:
    """Header parses and every tensor's byte range lies inside the file, which ends where the data ends."""
    if not path.exists():
        raise ModelLoadError(f"checkpoint shard {path.name} is missing from {path.parent}: restore it "
                             f"(e.g. `git lfs pull` or re-download the checkpoint)")
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelLoadError(f"checkpoint shard {path.name} is corrupted: only {size} bytes, "
                                 f"no safetensors header; restore the file")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(_MAX_HEADER_BYTES, size - 8):
            raise ModelLoadError(f"checkpoint shard {path.name} is corrupted: header length {header_len} "
                                 f"does not fit in {size} bytes; restore the file")
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelLoadError(f"checkpoint shard {path.name} is corrupted: unreadable header ({e}); "
                                 f"restore the file") from e
    data_len = size - 8 - header_len
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = info["data_offsets"]
        except (KeyError, TypeError, ValueError) as e:
            raise ModelLoadError(f"checkpoint shard {path.name} is corrupted: bad entry for {name!r}; "
                                 f"restore the file") from e
        if not 0 <= start <= stop <= data_len:
            raise ModelLoadError(f"checkpoint shard {path.name} is truncated or corrupted: tensor {name!r} "
                                 f"needs bytes {start}..{stop} but the file holds {data_len}; restore the file")
        end = max(end, stop)
    if end != data_len:
        raise ModelLoadError(f"checkpoint shard {path.name} is corrupted: {data_len - end} unexpected bytes "
                             f"after the last tensor; restore the file")


def _check_digests(model_dir: Path) -> None:
    manifest = model_dir / CHECKSUMS
    for line in manifest.read_text().splitlines():
        if not line.strip():
            continue
        digest, name = line.split(maxsplit=1)
        path = model_dir / name.strip()
        if not path.exists():
            raise ModelLoadError(f"{path.name} is missing from {model_dir} (listed in {CHECKSUMS}): restore it")
        if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            raise ModelLoadError(f"{path.name} in {model_dir} is corrupted: its SHA-256 does not match "
                                 f"{CHECKSUMS}; restore the file")


def verify_checkpoint(model_dir: Path) -> None:
    """Raise ``ModelLoadError`` naming the file if ``model_dir`` is not a loadable checkpoint."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelLoadError(f"model directory {model_dir} does not exist: pass an existing checkpoint directory")
    config = model_dir / "config.json"
    if not config.exists():
        raise ModelLoadError(f"config.json is missing from {model_dir}: restore it or pass a checkpoint directory")
    try:
        json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"config.json in {model_dir} is corrupted ({e}): restore it") from e
    for name in _shard_names(model_dir):
        check_safetensors_file(model_dir / name)
    if (model_dir / CHECKSUMS).exists():
        _check_digests(model_dir)
