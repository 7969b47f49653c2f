"""The graphed decoder's expert step: one MoE layer's K selections from the device plan row, T = 1.

    plan row (graphed_plan.py) ─► per selection its kind: a GPU slot, LoRE's surrogate, the CPU lane's output
                                  (uploaded with the row), or none
    "slots"   two Triton kernels read each selection straight from its slot (exec/slot_kernels.py; CUDA)
    "gather"  index_select the K experts' weights into scratch, then bmm (the CPU's)
    "grouped" grouped_mm over the slot views
    ─► y_e in the model dtype, (y_e · w_e) in the router's dtype, cast, added in ascending expert order:
       the stock loop's rounding, so any slot assignment of the same experts gives the same bits

Also the eager prefill's experts (T tokens, the stock loop) from weights the decoder hands in. Captured as it
runs: nothing here reads the host or branches on device values.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.nn import functional as F

from spice_core.errors import ConfigError
from spice_core.exec import slot_kernels
from spice_core.exec.experts import expert_forward, gathered_experts_forward
from spice_core.runtime.graphed_plan import APPROX, BY_SLOT, EXPERT, INV, KIND, KIND_CPU, PERM, SLOT, VALID

KERNELS = ("slots", "gather", "grouped")


def default_kernel(device: torch.device) -> str:
    """The slot-indexed Triton step on CUDA where Triton is installed, else the gather (the CPU's path)."""
    return "slots" if device.type == "cuda" and slot_kernels.available() else "gather"


class SlotExpertStep:
    """Experts of one layer from slots of ``buffer`` [n_slots, numel] (``lm.layout``'s flat layout)."""

    def __init__(self, lm, buffer: torch.Tensor, kernel: str | None = None, lore=None) -> None:
        """``lore``: a LoreBank on the device; selections the plan marks approximate take its surrogate (plus
        α·shared expert) instead of a slot's expert."""
        kernel = kernel or default_kernel(torch.device(lm.device))
        if kernel not in KERNELS:
            raise ConfigError(f"kernel {kernel!r} is unknown: use one of {', '.join(KERNELS)}")
        lay = lm.layout
        H, I, numel = lay.hidden, lay.intermediate, lay.numel
        assert buffer.shape[1:] == (numel,) and buffer.is_contiguous(), buffer.shape
        self.lm, self.kernel, self.k, self.layout = lm, kernel, lm.top_k, lay
        self.buffer, self.n_slots = buffer, int(buffer.shape[0])
        if kernel == "slots" and not slot_kernels.available():
            raise ConfigError("kernel 'slots' needs Triton (pip install triton) and a CUDA device: use kernel='gather'")
        if kernel == "grouped" and self.n_slots > 1024:
            raise ConfigError(f"kernel 'grouped' handles at most 1024 slots (a grouped_mm limit), not {self.n_slots}: "
                              "use kernel='gather'")
        if self.n_slots < self.k:
            raise ConfigError(f"slots_buffer has {self.n_slots} slots, below one layer's top-{self.k}: enlarge it")
        off = buffer.storage_offset()
        # Strided views of every slot (no copy): gate_up [n_slots, 2I, H], down [n_slots, H, I].
        self._gu = buffer.as_strided((self.n_slots, 2 * I, H), (numel, H, 1), off)
        self._dn = buffer.as_strided((self.n_slots, H, I), (numel, I, 1), off + 2 * I * H)
        self._slot_ids = torch.arange(self.n_slots, device=buffer.device)
        self.lore = lore
        self._lore_alpha = {layer: any(a != 0.0 for a in lore._alpha_host.get(layer, ())) for layer in lm.moe_layers} \
            if lore is not None else {}

    def slot_views(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [2I,H], down [H,I]) of the expert in ``slot``."""
        return self._gu[slot], self._dn[slot]

    def forward(self, i: int, x: torch.Tensor, top_k_weights: torch.Tensor, act, plan: torch.Tensor,
                cpu_out: torch.Tensor | None = None) -> torch.Tensor:
        """x [1,H] -> [1,H]: MoE layer i's K selections by ``plan`` (its device plan row), combined in ascending
        expert order. ``cpu_out`` [K,H]: the CPU lane's outputs (the selections the plan marks CPU)."""
        K, H = self.k, x.shape[-1]
        slot_e, perm, valid = plan[SLOT], plan[PERM], plan[VALID]
        if self.kernel == "slots" and slot_kernels.is_silu(act):
            y_ext = self.lore_out(i, x, plan[EXPERT], act).to(x.dtype) if self.lore is not None else None
            if cpu_out is not None:
                y_ext = cpu_out if y_ext is None else torch.where((plan[KIND] == KIND_CPU).view(K, 1), cpu_out, y_ext)
            h = torch.empty((K, self.layout.intermediate), dtype=x.dtype, device=x.device)
            out = torch.empty((1, H), dtype=x.dtype, device=x.device)
            return slot_kernels.slot_experts_forward(x.view(1, H), self.buffer, slot_e, plan[KIND], perm,
                                                     top_k_weights.view(-1), y_ext, self.layout, h, out)
        w = top_k_weights.view(-1).index_select(0, perm).view(K, 1)       # router dtype
        if self.kernel != "grouped":
            y = gathered_experts_forward(x, self.buffer, slot_e, self.layout, act)   # [K,H]
        else:
            offs = torch.searchsorted(plan[BY_SLOT], self._slot_ids, right=True).to(torch.int32)   # group ends
            gate, up = F.grouped_mm(x.expand(K, H).contiguous(), self._gu.transpose(1, 2), offs=offs).chunk(2, -1)
            y = F.grouped_mm((act(gate) * up).contiguous(), self._dn.transpose(1, 2), offs=offs)
            y = y.index_select(0, plan[INV])                                 # slot order -> expert order
        if self.lore is not None:
            y = torch.where(plan[APPROX].view(K, 1) != 0, self.lore_out(i, x, plan[EXPERT], act).to(y.dtype), y)
        if cpu_out is not None:
            y = torch.where((plan[KIND] == KIND_CPU).view(K, 1), cpu_out.to(y.dtype), y)
        p = torch.where(valid.view(K, 1) != 0, (y * w).to(x.dtype), 0.0)
        acc = p[0]
        for k in range(1, K):   # bf16 adds in ascending expert order, as the stock loop
            acc = acc + p[k]
        return acc.view(1, H)

    def lore_out(self, i: int, x: torch.Tensor, expert: torch.Tensor, act) -> torch.Tensor:
        """Every selection's LoRE surrogate, [K,H] (the plan's approx row picks which are used): the rank-r
        expert G·x, U·x -> act·mul -> B + b, plus α·S(x) when the layer's surrogates use the shared expert."""
        layer = self.lm.moe_layers[i]
        a = self.lore._active[layer]
        K, H = expert.shape[0], x.shape[-1]
        gu = a.gate_up.index_select(0, expert)                                   # [K,2r,H]
        xs = x.to(gu.dtype).expand(K, 1, H)
        gate, up = torch.bmm(xs, gu.transpose(1, 2)).chunk(2, dim=-1)            # [K,1,r]
        y = torch.baddbmm(a.bias.index_select(0, expert).unsqueeze(1), self.lore.act(gate) * up,
                          a.down.index_select(0, expert)).view(K, H)
        if self._lore_alpha.get(layer):
            shared = self.lore.shared_fn(layer, x).to(y.dtype)                    # [1,H]
            y = y + a.alpha.index_select(0, expert).view(K, 1) * shared
        return y

    @staticmethod
    def prefill(x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, act, n_experts: int,
                weights: Callable[[int], tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The eager prefill's experts (T tokens), the stock loop: each routed expert once, ascending, from
        ``weights(e)`` -> (gate_up, down)."""
        routes: dict[int, tuple[list[int], list[int]]] = {}
        for t, row in enumerate(top_k_index.tolist()):
            for p, e in enumerate(row):
                if 0 <= e < n_experts:
                    toks, poss = routes.setdefault(e, ([], []))
                    toks.append(t)
                    poss.append(p)
        final = torch.zeros_like(x)
        for e in sorted(routes):
            gate_up, down = weights(e)
            tp = torch.tensor(routes[e], dtype=torch.long).to(x.device, non_blocking=True)
            y = expert_forward(x[tp[0]], gate_up, down, act) * top_k_weights[tp[0], tp[1], None]
            final.index_add_(0, tp[0], y.to(final.dtype))
        return final

    def close(self) -> None:
        self.buffer = self._gu = self._dn = None
