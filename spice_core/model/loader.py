"""Load a transformers MoE checkpoint into the offloaded layout.

    path / hub id ─► resolve ─► check (config, family, safetensors, expert keys, shards)
                 ─► from_pretrained on the host ─► per-expert rows of one HostStore slab
                 ─► each `mlp.experts` replaced by `OffloadedExperts` ─► rest to device

The fused expert tensors are only ever materialised in host memory, one layer at a time
is sliced into per-expert buffers and then dropped. Safetensors only; never
``trust_remote_code``. Knows nothing of policies or timing.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import logging
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from spice_core.errors import ModelLoadError, UnsupportedModelError
from spice_core.memory.host_store import ExpertLayout, HostStore
from spice_core.model.families import (FAMILIES, FUSED_KEY_FORMATS, SUPPORTED_ARCHITECTURES, Family,
                                       is_moe_block)
from spice_core.types import ExpertKey

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_DIR = REPO_ROOT / "assets" / "spice-mini"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: object | None
    family: Family
    path: Path
    moe_layers: tuple[int, ...]
    n_layers: int
    n_experts: int
    top_k: int
    layout: ExpertLayout
    host: HostStore
    device: torch.device
    experts_modules: dict = field(default_factory=dict)   # layer -> OffloadedExperts
    # The dtype that budgets, byte counts and modeled times count in: the checkpoint's when a half-precision
    # checkpoint is computed in float32 on the CPU (`load_model(float32_on_cpu=True)`), so the run models
    # the same offload as on a GPU; None: the loaded dtype.
    offload_dtype: torch.dtype | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def expert_bytes(self) -> int:
        """One routed expert, in `offload_dtype` (what a GPU run holds and copies per expert)."""
        dtype = self.offload_dtype or self.layout.dtype
        return self.layout.numel * torch.empty((), dtype=dtype).element_size()

    @property
    def routed_bytes(self) -> int:
        """All routed experts, in `offload_dtype`."""
        return len(self.host) * self.expert_bytes

    @property
    def max_context_tokens(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    def moe_block(self, layer: int) -> nn.Module:
        return self.model.model.layers[layer].mlp


def _online(host: str = "huggingface.co", timeout_s: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def resolve_model_path(model: str | Path | None, flag: str = "--model") -> Path:
    """A local directory, or a hub id fetched only when online (fails fast offline). ``flag``: what errors call the
    value (a bench config's key rather than a command-line option)."""
    if model is None or str(model) == "":
        path = DEFAULT_MODEL_DIR
        if not path.is_dir():
            raise ModelLoadError(f"the shipped model is missing at {path}: pass {flag} DIR or restore assets/")
        return path
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelLoadError(f"{flag} {model}: is a file, not a checkpoint directory: pass the folder holding config.json")
    s = str(model)
    if not _HUB_ID.match(s) or s.startswith((".", "/", "~")):
        raise ModelLoadError(f"{flag} {model}: no such directory: pass an existing checkpoint folder or a hub id like org/name")
    return _resolve_hub(s)


def _resolve_hub(repo_id: str) -> Path:
    from huggingface_hub import constants, snapshot_download

    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached; decide below whether we may go online
        pass
    if constants.HF_HUB_OFFLINE or not _online():
        raise ModelLoadError(
            f"--model {repo_id}: not a local directory and not in the hub cache, and the Hugging Face hub "
            "is unreachable (offline): download it elsewhere and pass its local folder")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as e:  # noqa: BLE001 - hub errors come in many types
        raise ModelLoadError(f"--model {repo_id}: could not download from the hub ({type(e).__name__}: {e})") from e


def _safetensors_files(path: Path) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        other = [p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
        hint = f" (found {', '.join(other)}: pickled weights are refused; re-save with safetensors)" if other else ""
        raise ModelLoadError(f"--model {path}: holds no .safetensors files{hint}")
    return files


def _checkpoint_keys(path: Path, files: list[Path]) -> set[str]:
    """All tensor names, opening every shard (a truncated or corrupted shard is named)."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    single = path / "model.safetensors"
    if single.is_file():        # what transformers loads first, an index beside it or not
        files = [single]
    elif index.exists():
        try:
            weight_map = json.loads(index.read_bytes().decode("utf-8"))["weight_map"]
        except (UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError) as e:
            raise ModelLoadError(f"{index.name} in {path} is unreadable ({str(e)[:200]}): re-save the checkpoint") from e
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) and v for v in weight_map.values()):
            raise ModelLoadError(f"{index.name} in {path}: \"weight_map\" is not an object of tensor names to shard "
                                 "file names: re-save the checkpoint")
        wanted = set(weight_map.values())
        missing = sorted(w for w in wanted if not (path / w).exists())
        if missing:
            raise ModelLoadError(f"checkpoint shard {missing[0]} is missing from {path}: restore it or re-save the checkpoint")
        files = [path / w for w in sorted(wanted)]      # the shards transformers reads: not calibration files beside
    _check_digests(path, [path / "config.json", *([index] if index.exists() and not single.is_file() else []), *files])
    keys: set[str] = set()
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as h:
                keys.update(h.keys())
        except Exception as e:  # noqa: BLE001 - safetensors raises several types for bad files
            raise ModelLoadError(f"checkpoint shard {f.name} is corrupted or truncated ({e}): restore or re-save it") from e
    return keys


CHECKSUMS = "checksums.sha256"       # `sha256sum` lines a checkpoint may ship (the shipped models do)


def _check_digests(path: Path, files: list[Path]) -> None:
    """Where the checkpoint ships `checksums.sha256`, each of ``files`` it lists must match (a shard whose bytes
    changed but whose header still reads, e.g. NaN weights, loads and generates nothing otherwise). Lines that are
    not `sha256sum`'s and files it does not list are left alone."""
    sums = path / CHECKSUMS
    if not sums.is_file():
        return
    try:
        text = sums.read_text("utf-8-sig", "replace")
    except OSError as e:
        raise ModelLoadError(f"--model {path}: {CHECKSUMS} cannot be read ({e.strerror or e}): fix its permissions") from e
    listed = {}
    for line in text.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and re.fullmatch(r"[0-9a-fA-F]{64}", parts[0]):
            name = parts[1].strip().removeprefix("*")      # "*name": sha256sum's binary mode
            listed[name.removeprefix("./")] = parts[0].lower()     # "./name": `sha256sum ./*`
    for f in files:
        want = listed.get(f.name)
        if want is None:
            continue
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
        if h.hexdigest() != want:
            raise ModelLoadError(f"checkpoint file {f.name} in {path} does not match its digest in {CHECKSUMS} "
                                 f"(corrupted or changed): restore it, or if you changed it on purpose, update or "
                                 f"remove {CHECKSUMS}")


def read_config(path: Path) -> dict:
    """config.json as a dict, checked enough that nothing downstream trips on its types."""
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise ModelLoadError(f"--model {path}: no config.json: pass a transformers checkpoint folder")
    if not cfg_path.is_file():
        raise ModelLoadError(f"--model {path}: config.json is not a file: pass a transformers checkpoint folder")
    try:
        cfg = json.loads(cfg_path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise ModelLoadError(f"--model {path}: config.json cannot be read ({e.strerror or e}): fix its permissions") from e
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ModelLoadError(f"--model {path}: config.json is not valid JSON ({str(e)[:200]}): restore it") from e
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"--model {path}: config.json holds a {type(cfg).__name__}, not a JSON object: restore it")
    archs = cfg.get("architectures")
    if archs is None:
        archs = []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ModelLoadError(f"--model {path}: config.json \"architectures\" must be a list of class names, e.g. "
                             f"[\"{SUPPORTED_ARCHITECTURES[0]}\"], not {json.dumps(archs)[:80]}")
    if not archs or archs[0] not in FAMILIES:
        raise UnsupportedModelError(
            f"--model {path}: architecture {archs[0] if archs else 'unknown'} is not supported: "
            f"use one of {', '.join(SUPPORTED_ARCHITECTURES)}")
    for key in ("num_hidden_layers", "num_experts_per_tok", "hidden_size", "vocab_size"):
        v = cfg.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ModelLoadError(f"--model {path}: config.json \"{key}\" is {json.dumps(v)[:40]}: "
                                 "it must be a positive integer")
    return cfg


def _find_moe_layers(model: nn.Module) -> tuple[int, ...]:
    return tuple(i for i, layer in enumerate(model.model.layers) if is_moe_block(getattr(layer, "mlp", None) or nn.Module()))


def _check_expert_keys(path: Path, keys: set[str], family: Family, moe_layers: tuple[int, ...], n_experts: int) -> None:
    for layer in moe_layers:
        fused = [f.format(L=layer) for f in FUSED_KEY_FORMATS]
        if all(k in keys for k in fused):
            continue
        fmts = family.expert_key_formats
        groups = [fmts[i:i + 3] for i in range(0, len(fmts), 3)]
        for e in range(n_experts):
            if not any(all(f.format(L=layer, E=e) in keys for f in g) for g in groups):
                want = groups[0][0].format(L=layer, E=e)
                raise ModelLoadError(
                    f"checkpoint {path} lacks expert tensors for layer {layer} expert {e} (e.g. {want}): "
                    "the checkpoint is incomplete; re-save or re-download it")


HALF_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device to load on: ``device`` ("cpu", "cuda" or "cuda:N"), or None for cuda when a GPU is visible and
    cpu otherwise. Anything else is a `ModelLoadError` that says what to pass."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"--device {device}: use cpu or cuda (cuda:N for the N-th GPU)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"--device {device} was asked for but no CUDA GPU is visible: use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ModelLoadError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA GPU(s), "
                             f"numbered from 0")
    return dev


def load_model(model: str | Path | None, device: str | torch.device | None = None,
               dtype: torch.dtype | None = None, *, float32_on_cpu: bool = False) -> LoadedModel:
    """``dtype`` None: the checkpoint's. ``float32_on_cpu``: on the CPU, a half-precision checkpoint (dtype not
    given) is loaded in float32, because half-precision matmuls on the CPU are several times slower at these
    sizes; its byte accounting stays in the checkpoint's dtype (`LoadedModel.offload_dtype`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    dev = resolve_device(device)
    path = resolve_model_path(model)
    cfg_dict = read_config(path)
    family = FAMILIES[cfg_dict["architectures"][0]]
    files = _safetensors_files(path)
    keys = _checkpoint_keys(path, files)
    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - config classes raise many types
        raise ModelLoadError(f"--model {path}: config.json cannot be read by transformers ({e})") from e

    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - inconsistent sizes in config.json raise many types
        raise ModelLoadError(f"--model {path}: config.json describes a model transformers cannot build "
                             f"({type(e).__name__}: {e}): restore it") from e
    moe_layers = _find_moe_layers(skeleton)
    if not moe_layers:
        raise UnsupportedModelError(f"--model {path}: has no MoE layers (a dense model): use an MoE checkpoint "
                                    f"({', '.join(SUPPORTED_ARCHITECTURES)})")
    first = skeleton.model.layers[moe_layers[0]].mlp.experts
    n_experts = int(first.gate_up_proj.shape[0])
    n_layers = len(skeleton.model.layers)
    del skeleton
    _check_expert_keys(path, keys, family, moe_layers, n_experts)

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()   # a library should not draw progress bars on the user's terminal
    offload_dtype = None
    stored = HALF_DTYPES.get(str(cfg_dict.get("dtype") or cfg_dict.get("torch_dtype") or ""))
    if float32_on_cpu and dtype is None and dev.type == "cpu" and stored is not None:
        dtype, offload_dtype = torch.float32, stored
    try:
        hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or "auto", trust_remote_code=False,
                                                  use_safetensors=True)
    except Exception as e:  # noqa: BLE001 - transformers raises many types for bad checkpoints
        raise ModelLoadError(f"--model {path}: transformers could not load it ({type(e).__name__}: {e})") from e
    hf.eval()

    tokenizer = _load_tokenizer(path)
    return offload_model(hf, dev, family=family, path=path, tokenizer=tokenizer, offload_dtype=offload_dtype)


def cache_kwarg(model) -> str:
    """The forward's cache keyword: transformers renamed ``past_key_values`` to ``cache`` (5.24 warns on the
    old name; 5.17 only knows it)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def offload_model(hf: nn.Module, device: torch.device, *, family: Family | None = None, path: Path | None = None,
                  tokenizer=None, offload_dtype: torch.dtype | None = None) -> LoadedModel:
    """Move an in-memory transformers MoE model into the offloaded layout: routed experts into
    HostStore (one slab, a row per expert, pinned on CUDA), `mlp.experts` replaced, the rest on ``device``.
    The fused expert tensors may live on any device; they are freed layer by layer. ``offload_dtype``:
    see `LoadedModel.offload_dtype`."""
    from spice_core.exec.experts import OffloadedExperts

    device = torch.device(device)
    if family is None:
        arch = (getattr(hf.config, "architectures", None) or [type(hf).__name__])[0]
        if arch not in FAMILIES:
            raise UnsupportedModelError(f"architecture {arch} is not supported: use one of {', '.join(SUPPORTED_ARCHITECTURES)}")
        family = FAMILIES[arch]
    moe_layers = _find_moe_layers(hf)
    if not moe_layers:
        raise UnsupportedModelError("the model has no MoE layers (a dense model): use an MoE checkpoint")
    gu = hf.model.layers[moe_layers[0]].mlp.experts.gate_up_proj
    n_experts = int(gu.shape[0])
    layout = ExpertLayout(hidden=int(gu.shape[2]), intermediate=int(gu.shape[1]) // 2, dtype=gu.dtype)
    host = HostStore(layout, pinned=device.type == "cuda", capacity=len(moe_layers) * n_experts)
    experts_modules = {}
    for layer in moe_layers:
        mlp = hf.model.layers[layer].mlp
        fused = mlp.experts
        with torch.no_grad():
            for e in range(n_experts):
                host.put(ExpertKey(layer, e), fused.gate_up_proj[e], fused.down_proj[e])
        mod = OffloadedExperts(layer, n_experts, fused.act_fn)
        mlp.experts = mod
        experts_modules[layer] = mod
        del fused
    if device.type == "cuda":
        torch.cuda.empty_cache()
    hf.to(device)
    hf.eval()
    cfg = hf.config
    top_k = int(getattr(cfg, "num_experts_per_tok", 0) or getattr(cfg, "top_k", 0))
    path = path or Path(getattr(cfg, "name_or_path", "") or "in-memory-model")
    log.info("offloaded %s (%s): %d MoE layers x %d experts, %.1f MB of routed experts in host memory",
             path.name, family.name, len(moe_layers), n_experts, host.total_bytes / 1e6)
    return LoadedModel(hf, tokenizer, family, path, moe_layers, len(hf.model.layers), n_experts, top_k, layout,
                       host, device, experts_modules, offload_dtype)


def _load_tokenizer(path: Path):
    if not any((path / n).exists() for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as e:  # noqa: BLE001
        raise ModelLoadError(f"--model {path}: the tokenizer files cannot be loaded ({e})") from e
