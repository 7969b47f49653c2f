"""Benchmark-only models built in memory: random-weight models of a real model's shape.

Random weights route unrealistically (near-uniform), so these are a stress case for the
mechanisms and the timing, not a quality or hit-rate reference. Weights are initialised
on the target device (fast on a GPU) and offloaded afterwards by `offload_model`.
"""
from __future__ import annotations

import os

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


def available_host_bytes() -> int | None:
    """Memory a new allocation can get: MemAvailable (page cache counts as free), capped by a
    cgroup (container) limit; None where neither can be read."""
    avail = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    try:
        limit, used = (open(f"/sys/fs/cgroup/memory.{n}").read().strip() for n in ("max", "current"))
        if limit != "max":
            avail = min(avail, int(limit) - int(used))
    except (OSError, ValueError):
        pass
    return avail


def check_host_memory(needed_bytes: int, what: str) -> None:
    """Refuse, before allocating, what cannot fit in host memory (with a 10% margin)."""
    avail = available_host_bytes()
    if avail is not None and needed_bytes > 0.9 * avail:
        raise ConfigError(f"{what} needs about {needed_bytes / 1e9:.1f} GB of host memory but only "
                          f"{avail / 1e9:.1f} GB is available: use a machine with more memory (or a smaller model)")


def load_safetensors_model(path, dtype="auto"):
    """A checkpoint folder as a transformers model, from safetensors only (pickled .bin weights are
    refused: loading them can run code); any loading failure becomes a ModelLoadError."""
    from transformers import AutoModelForCausalLM

    from spice_core.errors import ModelLoadError
    from spice_core.model.loader import _safetensors_files, read_config

    read_config(path)
    _safetensors_files(path)
    try:
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, use_safetensors=True,
                                                    trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - transformers raises many types for bad checkpoints
        raise ModelLoadError(f"--model {path}: transformers could not load it ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from e


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
