"""Lifting a DeepSeek-V2 or Qwen2-MoE miniature into wider shapes computes the same function."""
import pytest
import torch
from transformers import AutoModelForCausalLM, DeepseekV2Config

from spice_core.tools.lift import lift_weights
from tiny_models import build_qwen2_miniature, qwen2_miniature_config


def _cfg(**kw):
    base = dict(vocab_size=64, num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2,
                n_shared_experts=2, q_lora_rank=None, qk_rope_head_dim=8, max_position_embeddings=128,
                tie_word_embeddings=True, rms_norm_eps=1e-6, topk_method="greedy", routed_scaling_factor=1.0)
    base.update(kw)
    return DeepseekV2Config(**base)


def _assert_same_model(mini, big) -> None:
    """The lifted model computes what the miniature does: logits within fp32 noise, identical greedy tokens."""
    ids = torch.tensor([[3, 9, 27, 5, 11, 40, 2, 7]])
    with torch.no_grad():
        a, b = mini(ids).logits, big(ids).logits
        ga = mini.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
        gb = big.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert (a - b).abs().max().item() < 1e-4 * max(1.0, a.abs().max().item())
    assert torch.equal(ga, gb)

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
    _assert_same_model(mini, big)


# ---------------------------------------------------------------- Qwen2-MoE (Qwen2-57B-A14B)
def _qwen2(**kw):
    from transformers import Qwen2MoeConfig

    base = dict(vocab_size=64, num_hidden_layers=3, num_experts=8, num_experts_per_tok=3, norm_topk_prob=False,
                decoder_sparse_step=1, mlp_only_layers=[], head_dim=16, qkv_bias=True, max_position_embeddings=128,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True,
                rms_norm_eps=1e-6)
    return Qwen2MoeConfig(**(base | kw))


def _randomise(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 or name.endswith("bias"):
                p.normal_(0, 0.2)
            else:
                p.uniform_(0.5, 1.5)   # non-trivial norm gains
    return model


def test_lifted_qwen2_moe_matches_the_miniature_in_fp32_with_gqa_groups_kept():
    """4 query heads on 2 KV heads lifted into 9 on 3: mini head 2 (KV head 1) must land in lifted KV group 1
    (slot 3), not at index 2 (group 0); biases, the gated shared expert and padded widths stay exact."""
    from spice_core.tools.lift import head_slots

    torch.manual_seed(0)
    mini = _randomise(AutoModelForCausalLM.from_config(_qwen2(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, moe_intermediate_size=12,
        shared_expert_intermediate_size=20, intermediate_size=40)).eval())
    big = AutoModelForCausalLM.from_config(_qwen2(
        hidden_size=80, num_attention_heads=9, num_key_value_heads=3, moe_intermediate_size=20,
        shared_expert_intermediate_size=36, intermediate_size=72)).eval()
    assert head_slots(4, 2, 9, 3) == [0, 1, 3, 4]
    lift_weights(mini, big)
    _assert_same_model(mini, big)


@pytest.fixture(scope="module")
def qwen2_mini(tmp_path_factory):
    """A random miniature with Qwen2-57B-A14B's topology (28 MoE layers, 64 experts top-8), narrow widths."""
    return build_qwen2_miniature(tmp_path_factory.mktemp("qwen2-mini") / "spice-mini-qwen2", hidden_size=32,
                                 moe_intermediate_size=4, shared_expert_intermediate_size=8)


NARROW = {"hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2, "moe_intermediate_size": 6,
          "shared_expert_intermediate_size": 12}


def test_streamed_qwen2_lift_equals_the_whole_lift_and_computes_the_miniatures_function(qwen2_mini):
    """The streamed lift (experts padded one at a time into the host slab) holds the same bytes as the whole
    model built and then offloaded, and in fp32 reproduces the miniature's greedy tokens and logits."""
    from spice_core.model.loader import offload_model
    from spice_core.tools.lift import lifted_model, lifted_whole, verify

    lm, tok, desc = lifted_model(qwen2_mini, "cpu", overrides=NARROW, dtype=torch.float32)
    hf, _, _ = lifted_whole(qwen2_mini, "cpu", overrides=NARROW, dtype=torch.float32)
    whole = offload_model(hf, torch.device("cpu"), tokenizer=tok)
    assert desc == "lift:spice-mini-qwen2" and lm.layout.hidden == 48 and lm.layout.intermediate == 6
    assert lm.moe_layers == tuple(range(28)) and lm.n_experts == 64 and lm.top_k == 8
    assert torch.equal(lm.host._slab, whole.host._slab)
    streamed_params = dict(lm.model.named_parameters())
    for name, p in whole.model.named_parameters():
        assert torch.equal(p, streamed_params[name]), name
    res = verify(qwen2_mini, "cpu", ["the cat saw a big red ball", "tell me a story about the dog"], 8, lifted=lm)
    assert res["greedy_token_agreement"] == 1.0 and res["tokens_compared"] == 16
    assert res["max_abs_logit_diff"] < 1e-4 * max(1.0, res["logit_scale"])


def test_qwen2_lift_refuses_another_rope_theta_and_unknown_widths(tmp_path):
    from spice_core.errors import ConfigError
    from spice_core.tools.lift import lift_config

    with pytest.raises(ConfigError, match="rope_theta"):
        lift_config(qwen2_miniature_config(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
    with pytest.raises(ConfigError, match="not a width of Qwen2-57B-A14B"):
        lift_config(qwen2_miniature_config(), {"kv_lora_rank": 8})
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        lift_config(qwen2_miniature_config(num_experts_per_tok=6))
    cfg = lift_config(qwen2_miniature_config())
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (3584, 28, 4, 128)
    assert (cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size, cfg.vocab_size) == (2560, 20480, 8192)


def test_lift_widths_of_the_bench_config_are_every_familys():
    from spice_core.tools.bench_config import LIFT_WIDTHS as CONFIG_WIDTHS
    from spice_core.tools.lift import LIFT_WIDTHS

    assert set(CONFIG_WIDTHS) == set(LIFT_WIDTHS)


def test_full_qwen2_lift_holds_the_experts_once_in_host_memory():
    """The numbers behind streaming: 64 x 28 experts of 55 MB are 98.7 GB; streamed, the host holds them once
    (plus two experts of scratch); built whole on the CPU it held the model and the slab, over 2x that."""
    from spice_core.tools.lift import lift_config, memory_needs

    cfg = lift_config(qwen2_miniature_config())
    routed = 64 * 28 * 3 * 3584 * 2560 * 2
    assert round(routed / 1e9, 1) == 98.7
    host, gpu = memory_needs(cfg, "cuda", whole=False)
    assert routed < host < routed + 0.2e9 and 13e9 < gpu < 15e9
    host_cpu, _ = memory_needs(cfg, "cpu", whole=False)
    assert host_cpu < routed + 15e9
    whole_cpu, _ = memory_needs(cfg, "cpu", whole=True)
    assert whole_cpu > 2 * routed


def test_lift_refuses_when_host_memory_is_short_before_building(qwen2_mini, monkeypatch):
    import spice_core.tools.bench_models as bm
    from spice_core.errors import ConfigError
    from spice_core.tools.lift import lifted_model

    monkeypatch.setattr(bm, "available_host_bytes", lambda: 1000)
    monkeypatch.setattr(bm, "load_safetensors_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ConfigError) as err:
        lifted_model(qwen2_mini, "cpu")
    msg = str(err.value)
    assert "\n" not in msg and "host memory" in msg and "lift_overrides" in msg
    assert "needs about 113 GB of host memory but only 1.00 kB is available" in msg     # not "0.0 GB"


@pytest.fixture(scope="module")
def calibrated_qwen2_mini(qwen2_mini, tmp_path_factory):
    """The random Qwen2 miniature with draft heads and LoRE factors beside it, as `calibrate` writes them."""
    import shutil

    from spice_core.tools.calibrate import calibrate

    d = tmp_path_factory.mktemp("qwen2-calibrated") / "spice-mini-qwen2"
    shutil.copytree(qwen2_mini, d)
    calibrate(d, max_tokens=1500, seq_len=64, distances=2, epochs=3, lore=True, lore_max_rank=4)
    return d


def test_lifted_qwen2_draft_heads_and_lore_compute_the_miniatures_values(calibrated_qwen2_mini):
    """Padded to the lifted hidden width, the draft heads give the miniature's logits and each LoRE surrogate
    (with its share of the gated shared expert) the miniature's output, zero on the padded dims."""
    from spice_core.model.loader import load_model
    from spice_core.predictor.artifacts import load_artifacts_if_present
    from spice_core.tools.lift import lift_artifacts, lifted_model
    from spice_core.types import ExpertKey

    mini = load_model(calibrated_qwen2_mini, "cpu")
    lm, _, _ = lifted_model(calibrated_qwen2_mini, "cpu", overrides=NARROW, dtype=torch.float32)
    mine, lifted = load_artifacts_if_present(mini), lift_artifacts(calibrated_qwen2_mini, lm)
    assert lifted.draft is not None and lifted.lore is not None and lifted.popularity == mine.popularity
    h, H = mini.layout.hidden, lm.layout.hidden
    x = torch.randn(2, h, generator=torch.Generator().manual_seed(0))
    xp = torch.cat([x, torch.zeros(2, H - h)], dim=1)
    for layer in (0, 13, 27):
        assert torch.allclose(mine.draft.head_logits(layer, x[:1]), lifted.draft.head_logits(layer, xp[:1]), atol=1e-5)
        for e in (0, 31, 63):
            key = ExpertKey(layer, e)
            a, b = mine.lore.apply(key, x), lifted.lore.apply(key, xp)
            assert torch.allclose(a, b[:, :h], atol=1e-5) and b[:, h:].abs().max() == 0
        # the surrogates' shared-expert term: the lifted block's gated shared expert on the padded input
        s_mini, s_big = mine.lore.shared_fn(layer, x), lifted.lore.shared_fn(layer, xp)
        assert torch.allclose(s_mini, s_big[:, :h], atol=1e-5) and s_big[:, h:].abs().max() == 0


def test_bench_lifts_a_qwen2_miniature_streams_it_and_uses_its_padded_artifacts(calibrated_qwen2_mini, tmp_path):
    import json

    from spice_core.tools.bench import _load_config, run_bench

    cfg = {"model": f"lift:{calibrated_qwen2_mini}", "lift_overrides": NARROW, "timing": "modeled",
           "shape": "qwen2-57b-a14b", "policies": ["lru", "spice"], "budgets": [0.25],
           "prompts": {"random_ids": 1, "length": 6}, "max_new_tokens": 3, "verify_lift": True}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    records = {r["policy"]: r for r in run_bench(_load_config(path), tmp_path / "out", "cpu")}
    assert records["lru"]["model"] == "lift:spice-mini-qwen2" and records["lru"]["shape"] == "qwen2-57b-a14b"
    assert records["spice"]["greedy_agreement"] == 1.0
    assert not any("gate predictor" in n for n in records["spice"]["notes"]), records["spice"]["notes"]
    check = records["lru"]["lift_check"]
    assert check["tokens_compared"] > 0 and check["greedy_token_agreement"] > 0.9
