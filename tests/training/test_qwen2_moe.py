"""The Qwen2-MoE family in training/: the shipped-size config's topology and size, the router hooks of
both families, a tiny run that trains, exports and reloads, and a corpus that reuses spice-mini's tokenizer."""
import csv
import json
import math

import numpy as np
import pytest
import torch

from training import corpus, export, train
from training.checkpoint_check import verify_checkpoint
from training.model_config import ARCHITECTURES, CONFIGS, build_config, config_from_dict
from training.stories import training_document

torch.set_num_threads(1)
MAX_SHARD_BYTES = 9_000_000


def _meta_model(name: str):
    """The named config's model without allocating or initialising weights (shapes only)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(build_config(name, 8192, 512), dtype=torch.bfloat16)


def test_train_config_names_are_the_model_configs():
    assert train.CONFIG_NAMES == tuple(CONFIGS)


def test_qwen2_mini_has_the_57b_a14b_topology():
    cfg = build_config("qwen2-mini", 8192, 512)
    assert cfg.model_type == "qwen2_moe" and cfg.num_hidden_layers == 28
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob) == (64, 8, False)
    assert cfg.decoder_sparse_step == 1 and cfg.mlp_only_layers == []
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.qkv_bias) == (2, 1, 128, True)
    assert cfg.rope_parameters["rope_theta"] == 1e6 and cfg.tie_word_embeddings and not cfg.output_router_logits
    model = _meta_model("qwen2-mini")
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.out_features == 2 * 128 and attn.k_proj.out_features == attn.v_proj.out_features == 128
    assert attn.q_proj.bias is not None and attn.k_proj.bias is not None and attn.o_proj.bias is None
    for layer in model.model.layers:
        assert layer.mlp.experts.gate_up_proj.shape == (64, 2 * 16, 128)
        assert layer.mlp.shared_expert.gate_proj.out_features == 128
        assert layer.mlp.shared_expert_gate.weight.shape == (1, 128)


def test_qwen2_mini_fits_40_mb_in_bf16():
    params = sum(p.numel() for p in _meta_model("qwen2-mini").parameters())
    assert params == 16_441_984
    assert params * 2 <= 40_000_000


def test_qwen2_mini_export_shards_stay_under_9_mb(tmp_path):
    model = _meta_model("qwen2-mini").to_empty(device="cpu")     # values irrelevant: only sizes are checked
    model.save_pretrained(str(tmp_path), max_shard_size=export.MAX_SHARD_SIZE)
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert len(shards) > 1 and all(p.stat().st_size <= MAX_SHARD_BYTES for p in shards)


@pytest.mark.parametrize("name", ["tiny", "qwen2-tiny"])
def test_router_capture_hooks_every_moe_layer_and_gives_a_positive_balance_loss(name):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = build_config(name, 8192, 512)
    model = AutoModelForCausalLM.from_config(cfg)
    capture = train.RouterCapture(model)
    moe_layers = cfg.num_hidden_layers - getattr(cfg, "first_k_dense_replace", 0)
    assert len(capture.handles) == moe_layers
    model(input_ids=torch.randint(4, 8192, (2, 8)))
    logits, topk = capture.captured[0]
    assert logits.shape == (16, cfg.num_experts) and topk.shape == (16, cfg.num_experts_per_tok)
    aux = float(capture.load_balance_loss(cfg.num_experts).detach())
    assert math.isfinite(aux) and aux > 0 and not capture.captured


@pytest.mark.parametrize("name", ["mini", "qwen2-mini"])
def test_a_saved_config_is_rebuilt_in_its_own_family(name):
    cfg = build_config(name, 8192, 512)
    back = config_from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert type(back) is type(cfg) and back.to_dict() == cfg.to_dict()


def _corpus(tmp_path, shipped_dir):
    """A corpus directory with spice-mini's tokenizer reused and one small prose array."""
    data = tmp_path / "data"
    tok = corpus.reuse_tokenizer(shipped_dir / "tokenizer.json", data / "tokenizer")
    (data / "prose").mkdir()
    np.save(data / "prose" / "fake.train.npy",
            corpus.encode_documents(tok, [training_document(s) for s in range(40)]))
    (data / "manifest.json").write_text(json.dumps({"vocab_size": tok.get_vocab_size()}))
    return data


def test_corpus_reuses_the_shipped_tokenizer_byte_for_byte(tmp_path, shipped_dir):
    data = _corpus(tmp_path, shipped_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (data / "tokenizer" / name).read_bytes() == (shipped_dir / name).read_bytes()


def test_corpus_refuses_a_tokenizer_without_its_config(tmp_path, shipped_dir):
    lone = tmp_path / "lone" / "tokenizer.json"
    lone.parent.mkdir()
    lone.write_bytes((shipped_dir / "tokenizer.json").read_bytes())
    with pytest.raises(corpus.TokenizerFileError, match="--tokenizer"):
        corpus.reuse_tokenizer(lone, tmp_path / "out")


def test_qwen2_tiny_trains_exports_and_the_export_generates(tmp_path, shipped_dir):
    from transformers import AutoModelForCausalLM

    data = _corpus(tmp_path, shipped_dir)
    run = tmp_path / "run"
    assert train.main(["--data", str(data), "--out", str(run), "--config", "qwen2-tiny", "--device", "cpu",
                       "--batch", "4", "--seq", "32", "--workers", "0", "--log-every", "1", "--max-steps", "8",
                       "--lr", "1e-2", "--warmup-steps", "1"]) == 0
    with (run / "loss.csv").open() as f:
        rows = list(csv.DictReader(f))
    lm = [float(r["lm_loss"]) for r in rows]
    aux = [float(r["aux_loss"]) for r in rows]
    assert len(lm) == 8 and all(math.isfinite(x) for x in lm + aux)
    assert np.mean(lm[-3:]) < np.mean(lm[:3]) and min(aux) > 0

    out = tmp_path / "model"
    export.export([run], data, out)
    verify_checkpoint(out)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURES["qwen2_moe"]] == ["Qwen2MoeForCausalLM"]
    assert config["head_dim"] == 24 and config["qkv_bias"]
    assert (out / "tokenizer.json").read_bytes() == (shipped_dir / "tokenizer.json").read_bytes()
    from safetensors import safe_open
    keys = set(safe_open(str(out / "model.safetensors"), "pt").keys())
    assert {"model.layers.2.mlp.experts.7.gate_proj.weight", "model.layers.2.mlp.shared_expert_gate.weight",
            "model.layers.0.self_attn.k_proj.bias"} <= keys

    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert type(model).__name__ == "Qwen2MoeForCausalLM"
    prompt = torch.tensor([[0, 1, 100, 200]])
    generated = model.generate(prompt, max_new_tokens=6, do_sample=False)
    assert generated.shape == (1, 10) and int(generated.max()) < 8192


def test_shipped_configs_keep_bf16_expert_rows_16_byte_aligned():
    # The GPU's grouped matmul (the fast experts kernel in training) refuses rows that are not 16-byte aligned.
    for name in ("mini", "qwen2-mini"):
        cfg = build_config(name, 8192, 512)
        widths = [cfg.hidden_size, cfg.moe_intermediate_size]
        widths += [getattr(cfg, "shared_expert_intermediate_size", 0) or 0]
        assert all(w * 2 % 16 == 0 for w in widths), (name, widths)
