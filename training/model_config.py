"""The shipped model's shape: DeepSeek-V2-Lite's topology, narrowed to fit 40 MB in bf16.

Kept from V2-Lite (what routing-dependent behaviour depends on): 27 layers with the first
dense, 64 routed experts, top-6 greedy routing without renormalisation, scaling factor 1.0,
2 always-on shared experts, MLA attention with ``qk_rope_head_dim`` 64 and no query LoRA.
Narrowed: hidden 128, 2 heads, expert width 24, dense width 384, vocabulary 8,192 (tied).
``num_key_value_heads`` must equal ``num_attention_heads`` for MLA under SDPA.
"""
from __future__ import annotations

from transformers import DeepseekV2Config

from training.tokenizer import VOCAB_SIZE

MAX_POSITIONS = 512


def mini_config(vocab_size: int = VOCAB_SIZE, max_positions: int = MAX_POSITIONS, **overrides) -> DeepseekV2Config:
    kwargs = dict(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=384, moe_intermediate_size=24,
        num_hidden_layers=27, first_k_dense_replace=1, num_attention_heads=2, num_key_value_heads=2,
        n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2, topk_method="greedy",
        norm_topk_prob=False, routed_scaling_factor=1.0, n_group=1, topk_group=1,
        kv_lora_rank=64, q_lora_rank=None, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64,
        max_position_embeddings=max_positions, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=True, hidden_act="silu",
        bos_token_id=0, eos_token_id=0, pad_token_id=3, use_cache=True,
    )
    kwargs.update(overrides)
    return DeepseekV2Config(**kwargs)


def tiny_config(vocab_size: int = VOCAB_SIZE) -> DeepseekV2Config:
    """Same family and routing rules in a few layers: for tests of the training script."""
    return mini_config(vocab_size, num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=2,
                       hidden_size=32, intermediate_size=64, moe_intermediate_size=8, kv_lora_rank=16,
                       qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16)


CONFIGS = {"mini": mini_config, "tiny": tiny_config}
