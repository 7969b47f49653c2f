"""Supported MoE families and their small differences.

Routing itself (softmax, top-k, renormalisation, DeepSeek's scaling and group-limited
top-k) runs in each family's untouched router module (`mlp.gate`), so it is exact by
construction. What differs and matters to the engine is listed here: the shared expert
(for LoRE targets and the draft rollout) and the checkpoint's per-expert key names.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Family:
    name: str
    architecture: str
    expert_key_formats: tuple[str, ...]   # per-expert checkpoint keys ({L} layer, {E} expert)
    shared_attr: str | None               # attribute of the MoE block holding the shared expert(s)
    shared_gate_attr: str | None = None   # Qwen2-MoE gates its shared expert with a sigmoid

    def shared_output(self, mlp: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """The shared expert's contribution for MoE input ``x`` [T,H], as the block adds it."""
        if self.shared_attr is None:
            return None
        out = getattr(mlp, self.shared_attr)(x)
        if self.shared_gate_attr is not None:
            out = torch.sigmoid(getattr(mlp, self.shared_gate_attr)(x)) * out
        return out


_PER_EXPERT = ("model.layers.{L}.mlp.experts.{E}.gate_proj.weight",
               "model.layers.{L}.mlp.experts.{E}.up_proj.weight",
               "model.layers.{L}.mlp.experts.{E}.down_proj.weight")
_MIXTRAL = ("model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight",
            "model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight",
            "model.layers.{L}.block_sparse_moe.experts.{E}.w2.weight")

FAMILIES = {
    f.architecture: f
    for f in (
        Family("deepseek_v2", "DeepseekV2ForCausalLM", _PER_EXPERT, "shared_experts"),
        Family("qwen2_moe", "Qwen2MoeForCausalLM", _PER_EXPERT, "shared_expert", "shared_expert_gate"),
        Family("mixtral", "MixtralForCausalLM", _MIXTRAL + _PER_EXPERT, None),
        Family("olmoe", "OlmoeForCausalLM", _PER_EXPERT, None),
        Family("qwen3_moe", "Qwen3MoeForCausalLM", _PER_EXPERT, None),
    )
}
# Fused layouts some exporters write instead of per-expert keys.
FUSED_KEY_FORMATS = ("model.layers.{L}.mlp.experts.gate_up_proj", "model.layers.{L}.mlp.experts.down_proj")

SUPPORTED_ARCHITECTURES = tuple(FAMILIES)


def is_moe_block(mlp: nn.Module) -> bool:
    """Structural test: an MoE block has a router ``gate`` and an ``experts`` module."""
    return hasattr(mlp, "gate") and hasattr(mlp, "experts")


def router_weight_rule(config) -> tuple[bool, float]:
    """How the family's router turns its softmax q over all experts into the weights of its top-k: (renormalised
    over the top-k, then scaled by). What the draft's predicted weights follow (predictor/draft.py)."""
    model_type = getattr(config, "model_type", "")
    if model_type == "mixtral":
        return True, 1.0
    if model_type == "deepseek_v2":
        return False, float(getattr(config, "routed_scaling_factor", 1.0) or 1.0)
    return bool(getattr(config, "norm_topk_prob", False)), 1.0
