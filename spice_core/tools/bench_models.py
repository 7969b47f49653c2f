"""The models bench runs: a checkpoint, a lift of one, or random-weight models of a real model's shape built in memory.

Random weights route unrealistically (near-uniform), so these are a stress case for the
mechanisms and the timing, not a quality or hit-rate reference. Weights are initialised
on the target device (fast on a GPU) and offloaded afterwards by `offload_model`.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from spice_core.errors import ConfigError
from spice_core.units import format_bytes


def deepseek_v2_lite_config(vocab_size: int = 102400, max_positions: int = 4096):
    from transformers import DeepseekV2Config

    return DeepseekV2Config(
        vocab_size=vocab_size, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, n_shared_experts=2,
        n_routed_experts=64, num_experts_per_tok=6, first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=None,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, topk_method="greedy", n_group=1, topk_group=1,
        routed_scaling_factor=1.0, norm_topk_prob=False, max_position_embeddings=max_positions,
        tie_word_embeddings=False, architectures=["DeepseekV2ForCausalLM"])


def qwen2_57b_a14b_config(vocab_size: int = 151936, max_positions: int = 131072):
    """Qwen/Qwen2-57B-A14B's config.json: 28 layers, all MoE; 28 query heads in 4 KV groups of head_dim 128 with
    q/k/v biases; 64 routed experts of width 2560, top-8 without renormalisation; one shared expert of width
    20480 behind a sigmoid gate; rope_theta 1e6; no sliding window."""
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        vocab_size=vocab_size, hidden_size=3584, intermediate_size=18944, moe_intermediate_size=2560,
        shared_expert_intermediate_size=20480, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
        head_dim=128, num_experts=64, num_experts_per_tok=8, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[], qkv_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6, use_sliding_window=False, max_position_embeddings=max_positions,
        tie_word_embeddings=False, architectures=["Qwen2MoeForCausalLM"])


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


def check_host_memory(needed_bytes: int, what: str,
                      fix: str = "use a machine with more memory (or a smaller model)") -> None:
    """Refuse, before allocating, what cannot fit in host memory (with a 10% margin); ``fix`` says what to change."""
    avail = available_host_bytes()
    if avail is not None and needed_bytes > 0.9 * avail:
        raise ConfigError(f"{what} needs about {format_bytes(needed_bytes)} of host memory but only "
                          f"{format_bytes(avail)} is available: {fix}")


def load_safetensors_model(path, dtype="auto", experts_implementation: str | None = None):
    """A checkpoint folder as a transformers model, from safetensors only (pickled .bin weights are
    refused: loading them can run code); any loading failure becomes a ModelLoadError.
    ``experts_implementation`` "eager": transformers' per-expert loop, which the engine's expert math
    mirrors, instead of its grouped GEMM (which also refuses bf16 expert rows that are not 16-byte aligned,
    as narrow test widths have)."""
    from transformers import AutoModelForCausalLM

    from spice_core.errors import ModelLoadError
    from spice_core.model.loader import _safetensors_files, read_config

    read_config(path)
    _safetensors_files(path)
    try:
        extra = {"experts_implementation": experts_implementation} if experts_implementation else {}
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, use_safetensors=True,
                                                    trust_remote_code=False, **extra)
    except Exception as e:  # noqa: BLE001 - transformers raises many types for bad checkpoints
        raise ModelLoadError(f"--model {path}: transformers could not load it ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from e


SHAPES = {"deepseek-v2-lite": deepseek_v2_lite_config, "qwen2-57b-a14b": qwen2_57b_a14b_config,
          "tiny-deepseek": tiny_deepseek_config}


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
    return sum(param_counts(cfg))


def param_counts(cfg) -> tuple[int, int]:
    """(routed-expert parameters, all other parameters) of a DeepSeek-V2 or Qwen2-MoE config, counted from its
    widths without building anything (checks run before any model is made)."""
    h, L, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    embed = V * h * (1 if cfg.tie_word_embeddings else 2) + h                     # + the final norm
    if cfg.model_type == "qwen2_moe":
        moe = [i for i in range(L) if i not in (cfg.mlp_only_layers or [])
               and cfg.num_experts > 0 and (i + 1) % cfg.decoder_sparse_step == 0]
        n, k = cfg.num_attention_heads, cfg.num_key_value_heads
        d = getattr(cfg, "head_dim", None) or h // n
        attn = h * n * d + 2 * h * k * d + n * d * h + (n * d + 2 * k * d) * int(cfg.qkv_bias)
        shared = 3 * h * cfg.shared_expert_intermediate_size + h + cfg.num_experts * h   # + its gate, the router
        routed = len(moe) * cfg.num_experts * 3 * h * cfg.moe_intermediate_size
    elif cfg.model_type == "deepseek_v2":
        moe = [i for i in range(L) if i >= cfg.first_k_dense_replace]
        n, r = cfg.num_attention_heads, cfg.qk_rope_head_dim
        kl, dn, dv = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.v_head_dim
        q = h * n * (dn + r) if cfg.q_lora_rank is None else \
            h * cfg.q_lora_rank + cfg.q_lora_rank + cfg.q_lora_rank * n * (dn + r)
        attn = q + h * (kl + r) + kl + kl * n * (dn + dv) + n * dv * h
        shared = 3 * h * cfg.moe_intermediate_size * (cfg.n_shared_experts or 0) + cfg.n_routed_experts * h
        routed = len(moe) * cfg.n_routed_experts * 3 * h * cfg.moe_intermediate_size
    else:
        raise ConfigError(f"no parameter count for model type {cfg.model_type!r}: use a DeepSeek-V2 or Qwen2-MoE model")
    dense = (L - len(moe)) * 3 * h * cfg.intermediate_size
    other = embed + L * (attn + 2 * h) + len(moe) * shared + dense
    return routed, other


def cpu_float32_offload_dtype(path: Path, device: str) -> torch.dtype | None:
    """On the CPU, a half-precision checkpoint computes in float32, as `load_model(float32_on_cpu=True)` does for the
    app and the quality tools (half-precision matmuls there are several times slower: a modeled bench of the shipped
    model spent ~0.6 s a token in bf16 kernels on a loaded 2-core machine); the checkpoint's dtype, which budgets, byte counts and modeled
    times keep counting in, or None where the model computes in its own dtype."""
    from spice_core.model.loader import HALF_DTYPES, read_config

    if torch.device(device).type != "cpu":
        return None
    cfg = read_config(path)
    return HALF_DTYPES.get(str(cfg.get("dtype") or cfg.get("torch_dtype") or ""))


def model_folder(spec: str, flag: str = 'the config\'s "model"') -> Path | None:
    """The checkpoint folder behind a bench model spec (a lift:'s miniature); None for random: models. ``flag``: what
    errors call the spec."""
    if spec.startswith("random:"):
        return None
    from spice_core.model.loader import resolve_model_path
    return resolve_model_path(spec.split(":", 1)[1] if spec.startswith("lift:") else spec, flag)
