"""The shipped checkpoint: DeepSeek-V2-Lite's topology, size limits, deterministic greedy output
(through plain transformers and through the engine). Its routing statistics: test_shipped_routing.py."""
import json

import pytest

from training.checkpoint_check import verify_checkpoint


def test_topology_matches_deepseek_v2_lite(shipped_dir):
    cfg = json.loads((shipped_dir / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV2ForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["first_k_dense_replace"]) == (27, 1)
    assert (cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["n_shared_experts"]) == (64, 6, 2)
    assert cfg["topk_method"] == "greedy" and cfg["norm_topk_prob"] is False and cfg["routed_scaling_factor"] == 1.0
    assert cfg["q_lora_rank"] is None and cfg["qk_rope_head_dim"] == 64
    assert cfg["num_key_value_heads"] == cfg["num_attention_heads"]


def test_checkpoint_is_small_sharded_and_per_expert(shipped_dir):
    verify_checkpoint(shipped_dir)
    keys = json.loads((shipped_dir / "model.safetensors.index.json").read_text())["weight_map"]
    shards = [shipped_dir / name for name in sorted(set(keys.values()))]     # calibration files may sit beside them
    assert sum(p.stat().st_size for p in shards) <= 40_000_000
    assert all(p.stat().st_size <= 9_000_000 for p in shards)
    for part in ("gate_proj", "up_proj", "down_proj"):
        assert f"model.layers.1.mlp.experts.63.{part}.weight" in keys
        assert f"model.layers.26.mlp.experts.0.{part}.weight" in keys


def _greedy(model, tokenizer, prompt, n):
    enc = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=n, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return enc["input_ids"][0].tolist(), out[0, enc["input_ids"].shape[1]:].tolist()


def test_greedy_output_is_deterministic_and_the_cards_is_a_greedy_path(shipped_model, shipped_tokenizer, shipped_eval,
                                                                       greedy_up_to_ties):
    """Two runs here agree; each, and the card's tokens (recorded on another CPU, whose bf16 kernels
    may break a near-tie the other way), are greedy choices of these weights up to bf16 ties."""
    ref = shipped_eval["greedy_reference"]
    prompt, first = _greedy(shipped_model, shipped_tokenizer, ref["prompt"], ref["max_new_tokens"])
    _, second = _greedy(shipped_model, shipped_tokenizer, ref["prompt"], ref["max_new_tokens"])
    assert first == second
    greedy_up_to_ties(shipped_model, prompt, first)
    greedy_up_to_ties(shipped_model, prompt, ref["token_ids"])
    for tokens in (first, ref["token_ids"]):
        story = shipped_tokenizer.decode(tokens)
        assert "cat" in story and "ball" in story, story


def test_engine_loads_the_shipped_model_and_matches_transformers_up_to_ties(shipped_dir, shipped_eval, shipped_model,
                                                                            greedy_up_to_ties):
    """bf16 logits tie often on this model (the generator draws adjectives uniformly, so several
    continuations are equally likely): two correct compute paths may break a tie differently, and then
    go on from different tokens. So every token the engine chooses must be transformers' greedy choice
    after the engine's own tokens before it (on the same weights, in this process), up to a bf16 tie."""
    engine_mod = pytest.importorskip("spice_core.engine")
    from spice_core.api import RunSettings
    from spice_core.tools.quality import greedy_tokens
    from transformers import AutoTokenizer

    ref = shipped_eval["greedy_reference"]
    tok = AutoTokenizer.from_pretrained(str(shipped_dir))
    prompt = list(tok.apply_chat_template([{"role": "user", "content": ref["prompt"]}], add_generation_prompt=True,
                                          return_dict=True)["input_ids"])
    engine = engine_mod.SpiceEngine.load(shipped_dir, device="cpu")
    tokens = greedy_tokens(engine, prompt, RunSettings(policy="resident"), ref["max_new_tokens"])
    assert len(tokens) == ref["max_new_tokens"]
    greedy_up_to_ties(shipped_model, prompt, tokens)
