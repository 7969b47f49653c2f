"""The shipped miniatures' shapes: a real MoE model's topology, narrowed to fit 40 MB in bf16.

Two families, each a ``*-mini`` config to ship and a ``*-tiny`` one for tests (same features,
few layers and experts); ``build_config`` picks by name and ``config_from_dict`` rebuilds a saved
config of either family. The families' configs name the routed-expert count differently
(DeepSeek ``n_routed_experts``, Qwen2-MoE ``num_experts``); both answer to ``cfg.num_experts``.

spice-mini, DeepSeek-V2-Lite. Kept from V2-Lite (what routing-dependent behaviour depends on): 27 layers with the first
dense, 64 routed experts, top-6 greedy routing without renormalisation, scaling factor 1.0,
2 always-on shared experts, MLA attention with ``qk_rope_head_dim`` 64 and no query LoRA.
Narrowed: hidden 128, 2 heads, expert width 24, dense width 384, vocabulary 8,192 (tied).
``num_key_value_heads`` must equal ``num_attention_heads`` for MLA under SDPA.

Qwen2-MoE, Qwen2-57B-A14B. Kept from 57B-A14B: 28 layers, all MoE, 64 routed experts with
top-8 softmax routing without renormalisation, one shared expert behind its sigmoid gate,
grouped-query attention (2 query heads per key/value head) with q/k/v biases, rotary head
dim 128 (``head_dim``, decoupled from hidden / heads), rope theta 1e6. Narrowed: hidden 128,
2 heads and 1 key/value head, expert width 16, shared expert width 128, vocabulary 8,192 (tied;
spice-mini's tokenizer). 16,441,984 parameters, 32.9 MB in bf16. Widths are multiples of 8 so
that bf16 rows are 16-byte aligned: at width 20 the GPU's grouped matmul refuses the experts
("strides should be multiple of 16 bytes") and training falls back to a per-expert loop, 15x slower.
"""
from __future__ import annotations

from transformers import DeepseekV2Config, PreTrainedConfig, Qwen2MoeConfig

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


def qwen2_mini_config(vocab_size: int = VOCAB_SIZE, max_positions: int = MAX_POSITIONS,
                      **overrides) -> Qwen2MoeConfig:
    kwargs = dict(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256, moe_intermediate_size=16,
        shared_expert_intermediate_size=128, num_hidden_layers=28, decoder_sparse_step=1, mlp_only_layers=[],
        num_attention_heads=2, num_key_value_heads=1, head_dim=128, qkv_bias=True,
        num_experts=64, num_experts_per_tok=8, norm_topk_prob=False,
        output_router_logits=False, router_aux_loss_coef=0.01, use_sliding_window=False,
        max_position_embeddings=max_positions, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=True, hidden_act="silu",
        bos_token_id=0, eos_token_id=0, pad_token_id=3, use_cache=True,
    )
    kwargs.update(overrides)
    return Qwen2MoeConfig(**kwargs)


def qwen2_tiny_config(vocab_size: int = VOCAB_SIZE) -> Qwen2MoeConfig:
    """Qwen2-MoE's features (gated shared expert, GQA with biases, decoupled head dim) in a few layers."""
    return qwen2_mini_config(vocab_size, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
                             hidden_size=32, intermediate_size=64, moe_intermediate_size=8,
                             shared_expert_intermediate_size=16, head_dim=24)


CONFIGS = {"mini": mini_config, "tiny": tiny_config, "qwen2-mini": qwen2_mini_config, "qwen2-tiny": qwen2_tiny_config}
# The shipped sizes take the training sequence length as their context; the test sizes keep the default.
SEQ_SIZED = ("mini", "qwen2-mini")
ARCHITECTURES = {"deepseek_v2": "DeepseekV2ForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}
_CONFIG_CLASSES = {"deepseek_v2": DeepseekV2Config, "qwen2_moe": Qwen2MoeConfig}


def build_config(name: str, vocab_size: int, seq_len: int) -> PreTrainedConfig:
    """The named config of ``CONFIGS`` for a corpus of ``vocab_size`` ids, trained at ``seq_len``."""
    if name in SEQ_SIZED:
        return CONFIGS[name](vocab_size=vocab_size, max_positions=seq_len)
    return CONFIGS[name](vocab_size=vocab_size)


def config_from_dict(cfg_dict: dict) -> PreTrainedConfig:
    """A config saved with ``to_dict()`` (``train_state.json``) rebuilt in its own family."""
    cfg_dict = dict(cfg_dict)
    model_type = cfg_dict.get("model_type")
    if model_type not in _CONFIG_CLASSES:
        raise ValueError(f"config model_type {model_type!r} is not one of {sorted(_CONFIG_CLASSES)}")
    for key in ("architectures", "model_type", "transformers_version", "dtype", "torch_dtype"):
        cfg_dict.pop(key, None)
    return _CONFIG_CLASSES[model_type](**cfg_dict)
