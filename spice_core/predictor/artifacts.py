"""Calibration artifacts beside a model: files, fingerprints, loading.

    <model dir>/spice-draft.safetensors    draft heads: weight [n,D*E,H] f16, bias [n,D*E] f32, calib [n,D,3] f32
    <model dir>/spice-lore.safetensors     LoRE factors (written and read by spice_core.lore)
    <model dir>/spice-calibration.json     fingerprint, expert popularity, what the calibration saw and scored

Every file carries the fingerprint of the model it was made for: architecture, hidden width,
expert count, top-k, MoE layer indices, and a hash of all router weights (so a retrained model
of the same shape is told apart too). Artifacts for another model or shape are refused with an
`ArtifactError` naming the calibrate command; no artifacts at all is fine (the engine falls
back to the training-free predictor and says so). Safetensors and JSON only, never pickles.
"""
from __future__ import annotations

import hashlib
import json
import shlex
import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

from spice_core.errors import ArtifactError, ConfigError
from spice_core.model.families import router_weight_rule
from spice_core.predictor.draft import DraftPredictor
from spice_core.types import ExpertKey

log = logging.getLogger(__name__)

DRAFT_FILE = "spice-draft.safetensors"
LORE_FILE = "spice-lore.safetensors"
CALIBRATION_FILE = "spice-calibration.json"
DRAFT_FORMAT = "spice-draft/1"
CALIBRATION_FORMAT = "spice-calibration/1"
_SHAPE_KEYS = ("architecture", "hidden", "n_experts", "top_k", "moe_layers")


@dataclass
class Artifacts:
    draft: DraftPredictor | None = None
    lore: object | None = None                      # spice_core.lore.bank's bank, when present
    popularity: list[ExpertKey] | None = None       # every expert, most often routed first (cpu_compute placement)
    calibration: dict = field(default_factory=dict)  # spice-calibration.json as read
    rebuild: str = ""               # the calibrate command that writes them where they were read (--out for a folder)


def calibrate_command(lm, *extra: str) -> str:
    """The command that builds ``lm``'s artifacts (its folder quoted for a shell; ``M`` where it has none, e.g. a
    random bench model)."""
    path = getattr(lm, "path", None)
    folder = shlex.quote(str(path)) if path and Path(path).is_dir() else "M"
    return " ".join(["python -m spice_core calibrate --model", folder, *extra])


def calibrate_command_at(lm, folder) -> str:
    """`calibrate_command` writing into ``folder``: with ``--out`` where it is not the model's own folder."""
    path = getattr(lm, "path", None)
    if path and Path(folder).resolve() == Path(path).resolve():
        return calibrate_command(lm)
    return calibrate_command(lm, "--out", shlex.quote(str(folder)))


def rebuild_command(artifacts, lm, *extra: str) -> str:
    """The calibrate command for ``lm``'s artifacts where they are (``artifacts``: as loaded, or None: beside it)."""
    return " ".join([getattr(artifacts, "rebuild", "") or calibrate_command(lm), *extra])


def model_fingerprint(lm) -> dict:
    """What artifacts must match: the model's MoE shape and a hash of its router weights."""
    h = hashlib.sha256()
    for layer in lm.moe_layers:
        w = lm.moe_block(layer).gate.weight.detach().float().cpu().contiguous()
        h.update(w.numpy().tobytes())
    return {"architecture": lm.family.architecture, "hidden": int(lm.layout.hidden), "n_experts": int(lm.n_experts),
            "top_k": int(lm.top_k), "moe_layers": [int(x) for x in lm.moe_layers], "router_sha256": h.hexdigest()[:24]}


def check_fingerprint(found: dict, lm, what: str, expected: dict | None = None, rebuild: str | None = None) -> None:
    """Raise ArtifactError when ``found`` (from a file) was not made for ``lm`` (``rebuild``: the command that writes
    it again where it was read from; default: beside the model)."""
    want = expected or model_fingerprint(lm)
    fix = f"rebuild them with: {rebuild or calibrate_command(lm)}"
    if not isinstance(found, dict):
        raise ArtifactError(f"{what} has no model fingerprint (not made by spice_core calibrate): {fix}")
    diffs = [f"{k} {found.get(k)!r} != {want[k]!r}" for k in _SHAPE_KEYS if found.get(k) != want[k]]
    if diffs:
        raise ArtifactError(f"{what} was made for another model shape ({'; '.join(diffs)}): {fix}")
    if found.get("router_sha256") != want["router_sha256"]:
        raise ArtifactError(f"{what} was made for another model (its router weights differ from "
                            f"{lm.path.name}'s): {fix}")


# ---------------------------------------------------------------- draft file
def save_draft(path: Path, draft: DraftPredictor, fingerprint: dict) -> Path:
    from safetensors.torch import save_file

    meta = {"format": DRAFT_FORMAT, "fingerprint": json.dumps(fingerprint), "distances": str(draft.distances),
            "top_k": str(draft.top_k)}
    path = Path(path)
    save_file(draft.tensors(), str(path), metadata=meta)
    return path


def load_draft(path: Path, lm, fingerprint: dict | None = None, rebuild: str | None = None) -> DraftPredictor:
    from safetensors import safe_open

    path = Path(path)
    rebuild = rebuild or calibrate_command(lm)
    fix = f"rebuild it with: {rebuild}"
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for bad files
        raise ArtifactError(f"{path.name} in {path.parent} is unreadable ({type(e).__name__}: {e}): {fix}") from e
    if meta.get("format") != DRAFT_FORMAT:
        raise ArtifactError(f"{path.name} has format {meta.get('format')!r}, expected {DRAFT_FORMAT!r}: {fix}")
    try:
        found = json.loads(meta.get("fingerprint", "null"))
    except json.JSONDecodeError:
        found = None
    check_fingerprint(found, lm, path.name, fingerprint, rebuild)
    missing = {"weight", "bias", "calib"} - set(tensors)
    if missing:
        raise ArtifactError(f"{path.name} lacks tensors {sorted(missing)}: {fix}")
    w, b, c = tensors["weight"], tensors["bias"], tensors["calib"]
    n = len(lm.moe_layers)
    ok = (w.dim() == 3 and w.shape[0] == n and w.shape[2] == lm.layout.hidden and c.dim() == 3 and c.shape[0] == n
          and c.shape[2] == 3 and w.shape[1] == c.shape[1] * lm.n_experts and tuple(b.shape) == tuple(w.shape[:2]))
    if not ok:
        raise ArtifactError(f"{path.name} has tensor shapes {tuple(w.shape)}/{tuple(b.shape)}/{tuple(c.shape)} that do "
                            f"not fit {lm.name} ({n} MoE layers, {lm.n_experts} experts, hidden {lm.layout.hidden}): {fix}")
    # Half precision on a GPU or for a half-precision checkpoint (also when the CPU computes the model in
    # float32: the heads and their budget stay those of the checkpoint; on the CPU they multiply in float32 from
    # the half weights, without rounding their logits to half, see DraftPredictor).
    stored = lm.offload_dtype or lm.layout.dtype
    dtype = torch.float16 if lm.device.type == "cuda" or stored in (torch.float16, torch.bfloat16) else torch.float32
    return DraftPredictor(tuple(lm.moe_layers), w, b, c, lm.top_k, device=lm.device, dtype=dtype,
                          router_rule=router_weight_rule(lm.model.config))


# ---------------------------------------------------------------- calibration json
def write_calibration(path: Path, fingerprint: dict, popularity: list[ExpertKey], **sections) -> Path:
    obj = {"format": CALIBRATION_FORMAT, "fingerprint": fingerprint,
           "popularity": [[k.layer, k.expert] for k in popularity], **sections}
    path = Path(path)
    # One top-level key per line: readable, and diffs of a re-calibration stay small.
    body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v, allow_nan=False)}" for k, v in obj.items())
    path.write_text("{\n" + body + "\n}\n")
    return path


def read_calibration(path: Path, lm, fingerprint: dict | None = None, rebuild: str | None = None) -> dict:
    path = Path(path)
    rebuild = rebuild or calibrate_command(lm)
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path.name} in {path.parent} is unreadable ({e}): rebuild it with: {rebuild}") from e
    if not isinstance(obj, dict) or obj.get("format") != CALIBRATION_FORMAT:
        raise ArtifactError(f"{path.name} is not a {CALIBRATION_FORMAT} file: rebuild it with: {rebuild}")
    check_fingerprint(obj.get("fingerprint"), lm, path.name, fingerprint, rebuild)
    return obj


def _popularity(obj: dict, lm, rebuild: str) -> list[ExpertKey] | None:
    pop = obj.get("popularity")
    if pop is None:
        return None
    keys = [ExpertKey(int(a), int(b)) for a, b in pop]
    if set(keys) != set(lm.host.keys()):
        raise ArtifactError(f"{CALIBRATION_FILE}: its popularity list does not cover {lm.name}'s experts: "
                            f"rebuild it with: {rebuild}")
    return keys


def _load_lore(path: Path, lm, rebuild: str):
    try:
        from spice_core.lore.bank import load_lore_bank
    except ModuleNotFoundError as e:
        if e.name not in ("spice_core.lore", "spice_core.lore.bank"):
            raise
        log.warning("%s is present but this build has no LoRE support: misses are never approximated", path.name)
        return None
    return load_lore_bank(path, lm, rebuild)


def calibration_digest(artifacts) -> str:
    """A digest of the calibration record the artifacts came from ("" without one): every `calibrate` (and
    --lore-only) rewrites it, so a tuned pick can tell the artifacts it was measured with from later ones."""
    cal = getattr(artifacts, "calibration", None) if artifacts is not None else None
    if not cal:
        return ""
    return hashlib.sha256(json.dumps(cal, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_artifacts_folder(folder, model) -> Path:
    """``folder`` given for a model's artifacts (kept apart from its checkpoint, e.g. one that is read-only): a folder
    holding at least one of them, else a ConfigError saying how to make them there. ``model``: the loaded model, or
    before it loads the --model as given."""
    lm = model if hasattr(model, "path") else SimpleNamespace(path=model)
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"--artifacts {folder}: not a folder: pass the folder calibrate wrote "
                          f"({calibrate_command_at(lm, folder)})")
    if not any((folder / name).exists() for name in (DRAFT_FILE, LORE_FILE, CALIBRATION_FILE)):
        raise ConfigError(f"--artifacts {folder}: holds none of {DRAFT_FILE}, {LORE_FILE}, {CALIBRATION_FILE}: "
                          f"build them there with: {calibrate_command_at(lm, folder)}")
    return folder


def load_artifacts_if_present(lm, folder: Path | None = None) -> Artifacts | None:
    """The artifacts in ``folder`` (default: beside ``lm``'s checkpoint); None when there are none. Raises
    ArtifactError for unreadable files or files made for another model."""
    folder = Path(lm.path) if folder is None else Path(folder)
    draft_p, lore_p, calib_p = folder / DRAFT_FILE, folder / LORE_FILE, folder / CALIBRATION_FILE
    if not (draft_p.exists() or lore_p.exists() or calib_p.exists()):
        return None
    rebuild = calibrate_command_at(lm, folder)   # apart from a (maybe read-only) checkpoint: rebuilt there, --out
    fp = model_fingerprint(lm)
    arts = Artifacts(rebuild=rebuild)
    if calib_p.exists():
        arts.calibration = read_calibration(calib_p, lm, fp, rebuild)
        arts.popularity = _popularity(arts.calibration, lm, rebuild)
    if draft_p.exists():
        arts.draft = load_draft(draft_p, lm, fp, rebuild)
    if lore_p.exists():
        arts.lore = _load_lore(lore_p, lm, rebuild)
    log.info("artifacts in %s for %s: draft=%s lore=%s popularity=%s", folder, lm.name, arts.draft is not None,
             arts.lore is not None, arts.popularity is not None)
    return arts
