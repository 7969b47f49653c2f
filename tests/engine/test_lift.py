"""Lifting a DeepSeek-V2 miniature into wider shapes computes the same function."""
import torch
from transformers import AutoModelForCausalLM, DeepseekV2Config

from spice_core.tools.lift import lift_weights


def _cfg(**kw):
    base = dict(vocab_size=64, num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2,
                n_shared_experts=2, q_lora_rank=None, qk_rope_head_dim=8, max_position_embeddings=128,
                tie_word_embeddings=True, rms_norm_eps=1e-6, topk_method="greedy", routed_scaling_factor=1.0)
    base.update(kw)
    return DeepseekV2Config(**base)


def test_lifted_model_matches_the_miniature_in_fp32():
    torch.manual_seed(0)
    mini_cfg = _cfg(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, qk_nope_head_dim=8, v_head_dim=8,
                    kv_lora_rank=16, moe_intermediate_size=12, intermediate_size=40)
    big_cfg = _cfg(hidden_size=96, num_attention_heads=4, num_key_value_heads=4, qk_nope_head_dim=24, v_head_dim=16,
                   kv_lora_rank=48, moe_intermediate_size=20, intermediate_size=72)
    mini = AutoModelForCausalLM.from_config(mini_cfg).eval()
    with torch.no_grad():
        for p in mini.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
            else:
                p.uniform_(0.5, 1.5)   # non-trivial norm gains
    big = AutoModelForCausalLM.from_config(big_cfg).eval()
    lift_weights(mini, big)
    ids = torch.tensor([[3, 9, 27, 5, 11, 40, 2, 7]])
    with torch.no_grad():
        a, b = mini(ids).logits, big(ids).logits
        ga = mini.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
        gb = big.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert (a - b).abs().max().item() < 1e-4 * max(1.0, a.abs().max().item())
    assert torch.equal(ga, gb)
