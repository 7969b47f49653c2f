"""LoreBank: a low-rank expert surrogate (LoRE) for every routed expert, and its file.

A LoRE is a narrow copy of the expert: r of its I intermediate neurons, chosen on real
activations, with a down projection refitted by least squares so that it also carries what the
dropped neurons contributed, plus a share of the block's shared expert:

    Ê_i(x) = act(x G_iᵀ) ⊙ (x U_iᵀ) · B_i  +  b_i  +  α_i · S(x)        x [n,H] -> [n,H]

    G_i, U_i [r,H]   gate and up rows of the r selected neurons (in order of importance)
    B_i [r,H], b_i [H]   refitted output projection and intercept (they depend on r, see below)
    S(x)             the MoE block's shared-expert output exactly as the block adds it (sigmoid-gated
                     for Qwen2-MoE); α_i = 0 for families without one (Mixtral, OLMoE, Qwen3-MoE)

Stored form (one file serves every rank up to R): the R neurons in selection order, and the
least-squares fit in an orthonormal basis of the features [1, h_1, ..., h_R] built in that
order (h_j the j-th neuron's activation): ``C`` [R+1,H] the coefficients, ``T`` [R+1,R+1] the
upper-triangular change of basis. Because T is triangular, the first r+1 basis vectors span
exactly [1, h_1..h_r], so T[:r+1,:r+1]·C[:r+1] *is* the least-squares refit for the first r
neurons: truncating to a lower rank loses nothing but the dropped components.

`apply` returns the expert's *unweighted* output approximation (the executor multiplies it
by the router weight, as for an exact expert). The fit lives in `lore/fit.py`.

Where things live: a bank read from disk (or just fitted) keeps its stored form in host
memory; ``with_rank(r)`` makes the device copy the engine uses (G, U, B, b, α at rank r), and
that copy's ``nbytes`` is what is counted inside the GPU budget. This module knows nothing of
policies, timing or how the factors were fitted.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.nn import functional as F

from spice_core.errors import ArtifactError, ConfigError
from spice_core.types import ExpertKey

FORMAT = "spice-lore"
FORMAT_VERSION = "1"
CALIBRATE_HINT = "python -m spice_core calibrate --model M"
_STORED = ("G", "U", "T", "C", "alpha")

# S(layer, x [n,H]) -> [n,H]: the block's shared-expert output.
SharedFn = Callable[[int, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class LoreLayer:
    """One MoE layer's stored factors, stacked over its E experts (H hidden, R max rank)."""

    G: torch.Tensor        # [E,R,H] gate rows of the selected neurons, most important first
    U: torch.Tensor        # [E,R,H] up rows of the same neurons
    T: torch.Tensor        # [E,R+1,R+1] upper-triangular basis change (float32)
    C: torch.Tensor        # [E,R+1,H] least-squares coefficients in that basis (float32)
    alpha: torch.Tensor    # [E] share of the shared-expert output (float32)

    @property
    def rank(self) -> int:
        return int(self.G.shape[1])


@dataclass(frozen=True)
class _Active:
    """What `apply` uses at one rank r, in the model's dtype on one device."""

    gate_up: torch.Tensor  # [E,2r,H]  (G_r ; U_r)
    down: torch.Tensor     # [E,r,H]   B_r
    bias: torch.Tensor     # [E,H]     b_r
    alpha: torch.Tensor    # [E]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.gate_up, self.down, self.bias, self.alpha))


def _activate(ly: LoreLayer, r: int, dtype: torch.dtype, device: torch.device) -> _Active:
    """Fold the stored form into the rank-r surrogate: B_r, b_r = T[:r+1,:r+1] · C[:r+1]."""
    coef = torch.bmm(ly.T[:, : r + 1, : r + 1].float(), ly.C[:, : r + 1].float())     # [E,r+1,H]
    gate_up = torch.cat([ly.G[:, :r], ly.U[:, :r]], dim=1)
    return _Active(gate_up=gate_up.to(device, dtype).contiguous(), down=coef[:, 1:].to(device, dtype).contiguous(),
                   bias=coef[:, 0].to(device, dtype).contiguous(), alpha=ly.alpha.to(device, dtype).contiguous())


def expert_weights_hash(lm) -> str:
    """A short hash of the loaded model's routed experts: shapes plus the values of two experts. The LoRE
    file's own check that its factors were fitted to these weights (the calibration artifacts' model
    fingerprint, predictor/artifacts.py, identifies the architecture and router instead).

    Values are hashed as float32, so the same checkpoint loaded in bf16 or fp32 matches."""
    h = hashlib.sha256()
    lay = lm.layout
    h.update(f"{lm.family.name}|{lay.hidden}|{lay.intermediate}|{lm.n_experts}|{list(lm.moe_layers)}".encode())
    for key in (ExpertKey(lm.moe_layers[0], 0), ExpertKey(lm.moe_layers[-1], lm.n_experts - 1)):
        h.update(lm.host.flat(key).detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def shared_fn_for(lm) -> SharedFn | None:
    """S(layer, x) from the loaded model's own shared-expert modules (None when it has none)."""
    if lm.family.shared_attr is None:
        return None

    def shared(layer: int, x: torch.Tensor) -> torch.Tensor:
        return lm.family.shared_output(lm.moe_block(layer), x)

    return shared


class LoreBank:
    """Surrogates for every routed expert at one rank. Build with `lore.fit.fit_lore_bank` or
    `load_lore_bank`; `with_rank` gives the device copy at a lower rank."""

    def __init__(self, layers: dict[int, LoreLayer], *, hidden: int, expert_width: int, n_experts: int,
                 act: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype, shared_fn: SharedFn | None = None,
                 device: torch.device | str = "cpu", target_device: torch.device | str | None = None,
                 rank: int | None = None, fingerprint: str = "", info: dict | None = None,
                 rebuild: str = CALIBRATE_HINT) -> None:
        """``rebuild``: the command that rebuilds these factors where they were read from (messages quote it)."""
        if not layers:
            raise ArtifactError(f"a LoRE bank needs at least one MoE layer: rebuild it with: {rebuild}")
        self.rebuild = rebuild
        stored = {ly.rank for ly in layers.values()}
        assert len(stored) == 1, f"all layers must share one rank, got {sorted(stored)}"
        self.layers = dict(sorted(layers.items()))
        self.hidden, self.expert_width, self.n_experts = hidden, expert_width, n_experts
        self.max_rank = stored.pop()
        self.rank = self.max_rank if rank is None else rank
        assert 0 <= self.rank <= self.max_rank
        self.act, self.dtype, self.shared_fn = act, dtype, shared_fn
        self.device = torch.device(device)                   # where the active (rank-r) tensors are
        self.target_device = torch.device(target_device) if target_device is not None else self.device
        self.fingerprint = fingerprint
        self.info = dict(info or {})
        self._active_cache: dict[int, _Active] | None = None
        # α on the host, so apply decides without reading the device.
        self._alpha_host = {layer: ly.alpha.float().tolist() for layer, ly in self.layers.items()}
        self._shared_memo: tuple | None = None
        self._derived: dict[tuple[int, str], LoreBank] = {}

    @property
    def _active(self) -> dict[int, _Active]:
        # Built on first use: a host bank that only hands out device copies never builds its own.
        if self._active_cache is None:
            self._active_cache = {layer: _activate(ly, self.rank, self.dtype, self.device)
                                  for layer, ly in self.layers.items()}
        return self._active_cache

    # ------------------------------------------------------------------ size and rank
    @property
    def nbytes(self) -> int:
        """Bytes of the surrogates at this bank's rank where they live (the device, for a
        `with_rank` copy): G, U, B, b and α of every expert. The stored form is host-only."""
        return sum(a.nbytes for a in self._active.values())

    def nbytes_at(self, hidden: int, dtype_bytes: int, rank: int | None = None) -> int:
        """What the same bank (layers, experts, rank) would occupy for a model of hidden size
        ``hidden``: budgets of modeled runs that time a real model's shape count this."""
        r = self.rank if rank is None else rank
        return len(self.layers) * self.n_experts * (3 * hidden * r + hidden + 1) * dtype_bytes

    def budget_bytes(self, native_expert_bytes: int, shape=None) -> int:
        """Bytes to reserve inside the routed-expert budget, in the loaded model's expert bytes.

        With a modeled target ``shape`` (e.g. DeepSeek-V2-Lite) the surrogates are sized for that
        shape's hidden width and charged in proportion to its expert size: at rank 16 a
        DeepSeek-V2-Lite expert's LoRE is 1/88 of the expert, while a 24-wide miniature's is 2/3
        of it, so charging native bytes would misstate the real trade-off."""
        if shape is None or getattr(shape, "name", "native") == "native":
            return self.nbytes
        return int(math.ceil(self.nbytes_at(shape.hidden, shape.dtype_bytes) / shape.expert_bytes
                             * native_expert_bytes))

    def with_rank(self, rank: int, device: torch.device | str | None = None) -> "LoreBank":
        """The first ``rank`` neurons of every surrogate with their least-squares refit, on
        ``device`` (default: the model's device). The last two derived banks are kept."""
        check_rank(rank, max_rank=self.max_rank, expert_width=self.expert_width, rebuild=self.rebuild)
        dev = torch.device(device) if device is not None else self.target_device
        if rank == self.rank and dev == self.device:
            return self
        key = (rank, str(dev))
        if key not in self._derived:
            if len(self._derived) >= 2:
                self._derived.pop(next(iter(self._derived)))
            self._derived[key] = LoreBank(
                self.layers, hidden=self.hidden, expert_width=self.expert_width, n_experts=self.n_experts,
                act=self.act, dtype=self.dtype, shared_fn=self.shared_fn, device=dev, target_device=dev, rank=rank,
                fingerprint=self.fingerprint, info=self.info, rebuild=self.rebuild)
        return self._derived[key]

    # ------------------------------------------------------------------ the surrogate
    @torch.no_grad()
    def apply(self, key: ExpertKey, x: torch.Tensor, shared: torch.Tensor | None = None) -> torch.Tensor:
        """Expert ``key``'s unweighted output, approximated: x [n,H] -> [n,H] (x's dtype).
        ``shared``: the block's shared-expert output for x when the caller has it already."""
        a = self._active.get(key.layer)
        if a is None:
            raise KeyError(f"no LoRE factors for layer {key.layer}")
        e = key.expert
        xs = x.to(a.down.dtype)
        gate, up = F.linear(xs, a.gate_up[e]).chunk(2, dim=-1)
        y = torch.addmm(a.bias[e], self.act(gate) * up, a.down[e])
        alpha = self._alpha_host[key.layer][e]
        if alpha != 0.0:
            if shared is None:
                if self.shared_fn is None:
                    raise ValueError("this bank has shared-expert terms but no shared-expert function")
                shared = self._shared(key.layer, x)
            y = y + alpha * shared.to(y.dtype)
        return y.to(x.dtype)

    def _shared(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """S(x), memoised for the last (layer, x): the experts of one layer approximated for the
        same token share one shared-expert pass."""
        m = self._shared_memo
        if m is not None and m[0] == layer and m[1].shape == x.shape and m[1].device == x.device \
                and torch.equal(m[1], x):
            return m[2]
        s = self.shared_fn(layer, x)
        self._shared_memo = (layer, x.clone(), s)
        return s

    def __repr__(self) -> str:
        return (f"LoreBank({len(self.layers)} layers x {self.n_experts} experts, rank {self.rank} of "
                f"{self.max_rank}, {self.nbytes / 1e6:.2f} MB on {self.device})")


def check_rank(rank, *, max_rank: int, expert_width: int, flag: str = "--lore-rank",
               rebuild: str = CALIBRATE_HINT) -> None:
    """ConfigError unless 1 <= rank <= min(max_rank, expert_width); the message names ``flag`` and
    says what to change (``rebuild``: the command that builds the factors again)."""
    limit = min(max_rank, expert_width)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ConfigError(f"{flag} {rank!r} is out of range: use an integer in [1, {limit}]")
    if rank > expert_width:
        raise ConfigError(
            f"{flag} {rank} is above the expert width {expert_width}: a surrogate wider than the expert "
            f"costs more than the expert itself; use {flag} <= {limit}")
    if rank > max_rank:
        raise ConfigError(
            f"{flag} {rank} is above the rank the LoRE factors were built with ({max_rank}): use {flag} "
            f"<= {max_rank}, or rebuild them with a higher rank: {rebuild} --lore-max-rank {rank}")


# ---------------------------------------------------------------------- file format
def save_lore_bank(bank: LoreBank, path: str | Path) -> Path:
    """Write ``bank``'s stored form (every rank up to max_rank) as one safetensors file.

    Tensors ``L{layer}.{G,U,T,C,alpha}``; metadata: format, version, the model's shape and
    fingerprint, the activation, and how it was fitted (``info``). No pickles."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {f"L{layer}.{n}": getattr(ly, n).detach().to("cpu").contiguous()
               for layer, ly in bank.layers.items() for n in _STORED}
    meta = {"format": FORMAT, "version": FORMAT_VERSION, "hidden": str(bank.hidden),
            "expert_width": str(bank.expert_width), "n_experts": str(bank.n_experts), "rank": str(bank.max_rank),
            "layers": json.dumps(list(bank.layers)), "fingerprint": bank.fingerprint,
            "info": json.dumps(bank.info, default=str)}
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)
    return path


def load_lore_bank(path: str | Path, lm, rebuild: str = CALIBRATE_HINT) -> LoreBank:
    """Read a bank written by `save_lore_bank` for the loaded model ``lm``. The stored form stays
    in host memory; `with_rank` puts a rank on the device. Missing, unreadable or foreign files
    raise ArtifactError naming ``rebuild``, the calibrate command that writes the file there."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"no LoRE factors at {path}: build them with: {rebuild}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for bad files
        raise ArtifactError(f"LoRE file {path} is unreadable ({e}): rebuild it with: {rebuild}") from e
    if meta.get("format") != FORMAT:
        raise ArtifactError(f"{path} is not a SPICE LoRE file: rebuild it with: {rebuild}")
    if meta.get("version") != FORMAT_VERSION:
        raise ArtifactError(f"LoRE file {path} has format version {meta.get('version')} (this engine reads "
                            f"{FORMAT_VERSION}): rebuild it with: {rebuild}")
    want = {"hidden": lm.layout.hidden, "expert_width": lm.layout.intermediate, "n_experts": lm.n_experts}
    try:
        got = {k: int(meta.get(k, -1)) for k in want}
        layers_meta = json.loads(meta.get("layers", "[]"))
    except ValueError as e:
        raise ArtifactError(f"LoRE file {path} has unreadable metadata ({e}): rebuild it with: {rebuild}") from e
    if got != want or sorted(layers_meta) != sorted(lm.moe_layers):
        raise ArtifactError(
            f"LoRE file {path} was built for another model shape (hidden {got['hidden']}, expert width "
            f"{got['expert_width']}, {got['n_experts']} experts, MoE layers {layers_meta}) than {lm.name} (hidden "
            f"{want['hidden']}, expert width {want['expert_width']}, {want['n_experts']} experts, MoE layers "
            f"{list(lm.moe_layers)}): rebuild it with: {rebuild}")
    fp = expert_weights_hash(lm)
    if meta.get("fingerprint") != fp:
        if lm.layout.dtype not in (torch.bfloat16, torch.float32):      # e.g. float16: it rounds a bf16 checkpoint
            loaded = str(lm.layout.dtype).removeprefix("torch.")
            raise ArtifactError(f"LoRE file {path} does not match {lm.name}'s weights as loaded in {loaded}, which "
                                "cannot hold every value of a bfloat16 checkpoint: load the model in its checkpoint's "
                                f"dtype (bfloat16, or float32 on the CPU); if the file was built for another model, "
                                f"rebuild it with: {rebuild}")
        raise ArtifactError(f"LoRE file {path} was built for another model (its weights differ from {lm.name}'s): "
                            f"rebuild it with: {rebuild}")
    layers = {}
    E, H = lm.n_experts, lm.layout.hidden
    for layer in lm.moe_layers:
        try:
            ly = LoreLayer(*(tensors[f"L{layer}.{n}"] for n in _STORED))
        except KeyError as e:
            raise ArtifactError(f"LoRE file {path} lacks tensor {e}: rebuild it with: {rebuild}") from e
        R = ly.rank
        shapes = (tuple(ly.G.shape), tuple(ly.U.shape), tuple(ly.T.shape), tuple(ly.C.shape), tuple(ly.alpha.shape))
        if shapes != ((E, R, H), (E, R, H), (E, R + 1, R + 1), (E, R + 1, H), (E,)):
            raise ArtifactError(f"LoRE file {path}: layer {layer}'s factors have inconsistent shapes {shapes}: "
                                f"rebuild it with: {rebuild}")
        layers[layer] = ly
    # The checkpoint's precision, also where the CPU computes the model in float32: the factors, their budget
    # and the approximations stay those of the model a GPU run holds.
    return LoreBank(layers, hidden=H, expert_width=lm.layout.intermediate, n_experts=E,
                    act=lm.experts_modules[lm.moe_layers[0]].act_fn, dtype=lm.offload_dtype or lm.layout.dtype,
                    shared_fn=shared_fn_for(lm), device="cpu", target_device=lm.device, fingerprint=fp,
                    info=json.loads(meta.get("info", "{}") or "{}"), rebuild=rebuild)
