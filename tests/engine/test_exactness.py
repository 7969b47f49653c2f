"""Exact policies reproduce stock transformers: greedy tokens over 32 steps and logits."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from spice_core.api import RunSettings
from tiny_models import EXTRA_FAMILIES, FAMILIES

EXACT = ["resident", "on_demand", "lru", "cpu_compute", "gate_prefetch", "spice_prefetch", "oracle_prefetch",
         "spice", "spice_no_lore", "spice_no_cpu"]
PROMPT = [5, 17, 33, 2, 9, 41, 7]


@pytest.fixture(scope="module")
def references(tiny_dirs):
    refs = {}
    for fam, d in tiny_dirs.items():
        model = AutoModelForCausalLM.from_pretrained(d).eval()
        with torch.no_grad():
            out = model.generate(torch.tensor([PROMPT]), max_new_tokens=32, min_new_tokens=32, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        refs[fam] = (model, out.sequences[0, len(PROMPT):].tolist(), out.logits[-1][0].float())
    return refs


@pytest.mark.parametrize("family", FAMILIES + EXTRA_FAMILIES)
@pytest.mark.parametrize("policy", EXACT)
def test_exact_policy_matches_stock_generate_tokens_and_final_logits(engines, references, family, policy):
    model, ref_tokens, ref_last_logits = references[family]
    run = engines[family].start_ids(PROMPT, RunSettings(policy=policy, cache_frac=0.4, max_new_tokens=32,
                                                        tau_approx=0.0))
    tokens = [s.token_id for s in run]
    assert tokens == ref_tokens[: len(tokens)]
    if len(tokens) == 32:
        assert torch.allclose(run.last_logits.float(), ref_last_logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES + EXTRA_FAMILIES)
def test_teacher_forced_logits_match_stock_forward(engines, references, family):
    model, ref_tokens, _ = references[family]
    ids = PROMPT + ref_tokens[:16]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].float()
    for policy in ("lru", "on_demand", "cpu_compute"):
        got = engines[family].logits_for(ids, RunSettings(policy=policy, cache_frac=0.4))
        assert (got - ref).abs().max().item() < 1e-4


def test_deepseek_group_limited_routing_is_exercised(tiny_dirs):
    import json
    cfg = json.loads((tiny_dirs["deepseek_v2_grouped"] / "config.json").read_text())
    assert cfg["topk_method"] == "group_limited_greedy" and cfg["n_group"] > 1


def test_qwen2_moe_dense_mlp_only_layer_is_not_offloaded(engines):
    lm = engines["qwen2_moe"].lm
    assert 1 not in lm.moe_layers and set(lm.moe_layers) == {0, 2, 3}


def test_qwen2_moe_gqa_has_the_real_models_attention_and_shared_expert(tiny_dirs, engines):
    """Qwen2-57B-A14B's features the plain tiny lacks: fewer KV heads than query heads, q/k/v biases that are
    not zero, every layer MoE, the sigmoid-gated shared expert."""
    model = engines["qwen2_moe_gqa"].lm.model
    cfg = model.config
    assert cfg.num_key_value_heads < cfg.num_attention_heads and cfg.qkv_bias and cfg.mlp_only_layers == []
    attn = model.model.layers[0].self_attn
    assert all(getattr(attn, f"{p}_proj").bias.abs().sum() > 0 for p in "qkv")
    assert engines["qwen2_moe_gqa"].lm.moe_layers == tuple(range(cfg.num_hidden_layers))
    assert engines["qwen2_moe_gqa"].lm.family.shared_gate_attr == "shared_expert_gate"
