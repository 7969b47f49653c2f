"""Tiny random checkpoints of the five supported MoE families, built offline in the tests.

Each is saved with `save_pretrained` (safetensors, per-expert keys as real checkpoints)
into a temporary folder. Sizes are chosen so a 32-token greedy run takes well under a
second on one CPU thread.
"""
from __future__ import annotations

from pathlib import Path

import torch

FAMILIES = ("deepseek_v2", "deepseek_v2_grouped", "qwen2_moe", "mixtral", "olmoe", "qwen3_moe")
# Built beside FAMILIES (tiny_dirs, engines) but only in the exactness tests' parametrisation.
EXTRA_FAMILIES = ("qwen2_moe_gqa",)


def tiny_config(family: str):
    from transformers import (DeepseekV2Config, MixtralConfig, OlmoeConfig, Qwen2MoeConfig, Qwen3MoeConfig)

    common = dict(vocab_size=96, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                  max_position_embeddings=256, tie_word_embeddings=False)
    if family.startswith("deepseek_v2"):
        grouped = family == "deepseek_v2_grouped"
        cfg = DeepseekV2Config(
            **common, num_hidden_layers=4, intermediate_size=48, moe_intermediate_size=16, n_routed_experts=8,
            num_experts_per_tok=3, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None,
            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, routed_scaling_factor=1.5 if grouped else 1.0,
            topk_method="group_limited_greedy" if grouped else "greedy", n_group=4 if grouped else 1,
            topk_group=2 if grouped else 1, norm_topk_prob=False)
    elif family == "qwen2_moe":
        cfg = Qwen2MoeConfig(**common, num_hidden_layers=4, intermediate_size=48, moe_intermediate_size=16,
                             shared_expert_intermediate_size=24, num_experts=8, num_experts_per_tok=2,
                             norm_topk_prob=False, mlp_only_layers=[1], decoder_sparse_step=1)
    elif family == "qwen2_moe_gqa":
        # What Qwen2-57B-A14B has and the plain entry lacks: grouped-query attention (2 query heads per KV
        # head) with q/k/v biases (Qwen2-MoE's default, randomised in build_tiny), every layer MoE.
        cfg = Qwen2MoeConfig(**(common | {"num_key_value_heads": 2}), num_hidden_layers=3, intermediate_size=48,
                             moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=8,
                             num_experts_per_tok=3, norm_topk_prob=False, mlp_only_layers=[], decoder_sparse_step=1,
                             qkv_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    elif family == "mixtral":
        cfg = MixtralConfig(**common, num_hidden_layers=3, intermediate_size=16, num_local_experts=6,
                            num_experts_per_tok=2)
    elif family == "olmoe":
        cfg = OlmoeConfig(**common, num_hidden_layers=3, intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                          norm_topk_prob=False)
    elif family == "qwen3_moe":
        cfg = Qwen3MoeConfig(**common, num_hidden_layers=3, intermediate_size=48, moe_intermediate_size=16,
                             num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, head_dim=8)
    else:
        raise ValueError(family)
    return cfg


def build_tiny(family: str, out_dir: Path, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(family)
    model = AutoModelForCausalLM.from_config(cfg)
    # Larger-than-default init so routing is decisive and logits are not all ~equal.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15)
            elif family in EXTRA_FAMILIES and name.endswith("_proj.bias"):
                p.normal_(0.0, 0.15)          # biases the attention actually depends on
    model.save_pretrained(out_dir)
    save_tiny_tokenizer(out_dir, cfg.vocab_size)
    return out_dir


WORDS = ("the cat dog ball sun tree girl boy ran saw a big small red blue happy sad and to of with in on was "
         "is it he she they played found lost home day night friend mom dad said hello story tell me about").split()


def save_tiny_tokenizer(out_dir: Path, vocab_size: int = 96) -> None:
    """A word-level tokenizer over a small English word list (ids < vocab_size), with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<eos>", "<|user|>", "<|assistant|>"]
    vocab = {w: i for i, w in enumerate(specials + WORDS)}
    assert len(vocab) <= vocab_size
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>",
                                   additional_special_tokens=["<|user|>", "<|assistant|>"])
    fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    fast.save_pretrained(out_dir)


def qwen2_miniature_config(**widths):
    """A miniature of Qwen2-57B-A14B's topology, as the shipped spice-mini-qwen2: 28 layers all MoE, 64 experts
    top-8 without renormalisation, a gated shared expert, 2 query heads on 1 KV head of head_dim 128 with
    q/k/v biases, rope_theta 1e6. ``widths`` narrow it for tests (hidden_size, moe_intermediate_size, ...)."""
    from transformers import Qwen2MoeConfig

    base = dict(vocab_size=8192, hidden_size=128, intermediate_size=256, moe_intermediate_size=16,
                shared_expert_intermediate_size=128, num_hidden_layers=28, num_attention_heads=2, num_key_value_heads=1,
                head_dim=128, num_experts=64, num_experts_per_tok=8, norm_topk_prob=False, decoder_sparse_step=1,
                mlp_only_layers=[], qkv_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                rms_norm_eps=1e-6, max_position_embeddings=512, tie_word_embeddings=True, use_sliding_window=False,
                bos_token_id=0, eos_token_id=1, architectures=["Qwen2MoeForCausalLM"])
    return Qwen2MoeConfig(**(base | widths))


def build_qwen2_miniature(out_dir: Path, seed: int = 0, **widths) -> Path:
    """A random `qwen2_miniature_config` checkpoint (decisive routing, random biases and norm gains) with the
    word-level test tokenizer, saved as a shipped model is."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = qwen2_miniature_config(**({"vocab_size": 96} | widths))
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.15)
            elif name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.15)
    model.save_pretrained(out_dir)
    save_tiny_tokenizer(out_dir, cfg.vocab_size)
    return out_dir


def write_heldout(folder: Path, tag: str) -> None:
    """A minimal spice-heldout.json.gz whose every text names ``tag``."""
    import gzip
    import json

    from spice_core.heldout import HELDOUT_FILENAME, HELDOUT_FORMAT

    halves = {"calibration": [f"the {tag} story of a cat"], "eval": [f"the {tag} story of a dog"]}
    data = {"format": HELDOUT_FORMAT, "stories": halves, "prose": {"calibration": [], "eval": []},
            "prose_domains": {"calibration": [], "eval": []}, "prompts": [{"text": f"the {tag} dog"}],
            "long_stories": [f"the {tag} sun"]}
    with gzip.open(folder / HELDOUT_FILENAME, "wt") as f:
        json.dump(data, f)
