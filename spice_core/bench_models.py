"""Benchmark-only models built in memory: random-weight models of a real model's shape.

Random weights route unrealistically (near-uniform), so these are a stress case for the
mechanisms and the timing, not a quality or hit-rate reference. Weights are initialised
on the target device (fast on a GPU) and offloaded afterwards by `offload_model`.
"""
from __future__ import annotations

import torch

from spice_core.errors import ConfigError


def deepseek_v2_lite_config(vocab_size: int = 102400, max_positions: int = 4096):
    from transformers import DeepseekV2Config

    return DeepseekV2Config(
        vocab_size=vocab_size, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, n_shared_experts=2,
        n_routed_experts=64, num_experts_per_tok=6, first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=None,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, topk_method="greedy", n_group=1, topk_group=1,
        routed_scaling_factor=1.0, norm_topk_prob=False, max_position_embeddings=max_positions,
        tie_word_embeddings=False, architectures=["DeepseekV2ForCausalLM"])


def tiny_deepseek_config():
    from transformers import DeepseekV2Config

    return DeepseekV2Config(
        vocab_size=256, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=5,
        num_attention_heads=2, num_key_value_heads=2, n_shared_experts=1, n_routed_experts=16, num_experts_per_tok=4,
        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=8, max_position_embeddings=512, architectures=["DeepseekV2ForCausalLM"])


SHAPES = {"deepseek-v2-lite": deepseek_v2_lite_config, "tiny-deepseek": tiny_deepseek_config}


def random_model(shape: str, device: str, seed: int = 0, check_memory=None):
    """(model with fused experts on ``device``, None tokenizer, description)."""
    from transformers import AutoModelForCausalLM

    if shape not in SHAPES:
        raise ConfigError(f"random model shape {shape!r} is unknown: choose from {', '.join(SHAPES)}")
    cfg = SHAPES[shape]()
    dtype = torch.bfloat16 if device != "cpu" or shape != "tiny-deepseek" else torch.float32
    n_params_est = _estimate_params(cfg)
    if check_memory is not None:
        check_memory(n_params_est * torch.empty((), dtype=dtype).element_size())
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "gate.weight" in name and p.dim() == 2:
                p.normal_(0.0, 0.5 / p.shape[1] ** 0.5 * 8)   # decisive, varied routing
    return model.eval(), None, f"random:{shape}"


def _estimate_params(cfg) -> int:
    h, L = cfg.hidden_size, cfg.num_hidden_layers
    experts = (L - cfg.first_k_dense_replace) * cfg.n_routed_experts * 3 * h * cfg.moe_intermediate_size
    return experts + 2 * cfg.vocab_size * h + L * (3 * h * cfg.intermediate_size // 4 + 8 * h * h)
