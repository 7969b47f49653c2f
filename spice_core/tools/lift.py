"""`python -m spice_core lift`: the shipped miniature, lifted exactly into DeepSeek-V2-Lite's shapes.

Every weight is zero-padded into the real model's tensor shapes so the lifted model
computes the same function as the miniature while every copy and kernel has
DeepSeek-V2-Lite's size (hidden 2048, 16 heads, kv_lora_rank 512, qk_nope 128,
qk_rope 64, v 128, experts and shared experts of width 1408, dense width 10944). The
vocabulary stays the miniature's (8k rows instead of 102k): only the embedding and LM
head differ in size from the real model.

Why it is exact (in real arithmetic):
- padded hidden dims are zero everywhere, so they stay zero through every layer;
- RMSNorm over H dims of a vector with only h non-zero dims has rms_H^2 = (h/H) rms_h^2,
  so gains are scaled by sqrt(h/H) and eps by h/H (per norm: hidden norms and the
  kv_a_layernorm, whose width grows 64 -> 512, differ);
- extra heads have zero queries, keys, values and output columns: they add nothing;
- extra qk_nope / v dims are zero; the softmax scale 1/sqrt(qk_head_dim) shrinks with the
  wider heads, so each attention module's scale is multiplied by sqrt(192/128) to keep every
  score the same;
- padded expert / MLP widths have zero gate, up and down weights: act(0) * 0 = 0.
In bf16 the kv_a_layernorm gain factor sqrt(64/512) rounds, and GEMMs over wider inner
dimensions accumulate in a different order: logits agree to bf16 noise, not bit for bit
(tests/engine/test_lift.py checks exactness in fp32).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from spice_core.errors import ConfigError


def _lift_config(mini_cfg, overrides: dict | None = None):
    """DeepSeek-V2-Lite's config with the miniature's vocabulary; ``overrides`` (dry runs on small
    machines) may narrow widths, never the topology."""
    from spice_core.tools.bench_models import deepseek_v2_lite_config

    cfg = deepseek_v2_lite_config(vocab_size=mini_cfg.vocab_size,
                                  max_positions=mini_cfg.max_position_embeddings)
    for k, v in (overrides or {}).items():
        if k not in ("hidden_size", "num_attention_heads", "num_key_value_heads", "qk_nope_head_dim", "v_head_dim",
                     "kv_lora_rank", "moe_intermediate_size", "intermediate_size"):
            raise ConfigError(f"lift override {k!r} is not a width: only widths may change")
        setattr(cfg, k, v)
    if getattr(cfg, "head_dim", None) is not None:
        cfg.head_dim = cfg.qk_rope_head_dim
    cfg.qk_head_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    cfg.tie_word_embeddings = mini_cfg.tie_word_embeddings
    cfg.rope_theta = getattr(mini_cfg, "rope_theta", 10000.0)
    if hasattr(mini_cfg, "rope_parameters"):
        cfg.rope_parameters = mini_cfg.rope_parameters
    cfg.rms_norm_eps = mini_cfg.rms_norm_eps
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = mini_cfg.bos_token_id, mini_cfg.eos_token_id, \
        getattr(mini_cfg, "pad_token_id", None)
    for name in ("num_hidden_layers", "n_routed_experts", "num_experts_per_tok", "first_k_dense_replace",
                 "n_shared_experts", "qk_rope_head_dim", "topk_method", "routed_scaling_factor"):
        if getattr(mini_cfg, name) != getattr(cfg, name):
            raise ConfigError(f"lift needs a miniature with DeepSeek-V2-Lite's topology: {name} is "
                              f"{getattr(mini_cfg, name)!r}, the real model has {getattr(cfg, name)!r}")
    if mini_cfg.q_lora_rank is not None:
        raise ConfigError("lift supports q_lora_rank None (as DeepSeek-V2-Lite)")
    return cfg


@torch.no_grad()
def lift_weights(mini, big) -> None:
    """Copy ``mini``'s weights into ``big`` (DeepSeek-V2-Lite shapes), zero-padded and rescaled."""
    mc, bc = mini.config, big.config
    h, H = mc.hidden_size, bc.hidden_size
    n, N = mc.num_attention_heads, bc.num_attention_heads
    dn, Dn = mc.qk_nope_head_dim, bc.qk_nope_head_dim
    r = mc.qk_rope_head_dim
    dv, Dv = mc.v_head_dim, bc.v_head_dim
    kl, KL = mc.kv_lora_rank, bc.kv_lora_rank
    q_scale = math.sqrt((Dn + r) / (dn + r))
    g_hidden = math.sqrt(h / H)
    g_kv = math.sqrt(kl / KL)
    for p in big.parameters():
        p.zero_()
    src = dict(mini.named_parameters())
    dst = dict(big.named_parameters())

    def put(name, value, *slices):
        dst[name][slices].copy_(value.to(dst[name].dtype))

    for name, w in src.items():
        if name not in dst:
            raise ConfigError(f"lift: parameter {name} has no counterpart in the lifted model")
        if name.endswith("kv_a_layernorm.weight"):
            put(name, w * g_kv, slice(0, kl))
        elif name.endswith("norm.weight"):
            put(name, w * g_hidden, slice(0, h))
        elif name.endswith("q_proj.weight"):
            wq = w.view(n, dn + r, h)
            d = dst[name].view(N, Dn + r, H)
            d[:n, :dn, :h].copy_(wq[:, :dn])
            d[:n, Dn:Dn + r, :h].copy_(wq[:, dn:])
        elif name.endswith("kv_a_proj_with_mqa.weight"):
            put(name, w[:kl], slice(0, kl), slice(0, h))
            put(name, w[kl:], slice(KL, KL + r), slice(0, h))
        elif name.endswith("kv_b_proj.weight"):
            wb = w.view(n, dn + dv, kl)
            d = dst[name].view(N, Dn + Dv, KL)
            d[:n, :dn, :kl].copy_(wb[:, :dn])
            d[:n, Dn:Dn + dv, :kl].copy_(wb[:, dn:])
        elif name.endswith("o_proj.weight"):
            wo = w.view(h, n, dv)
            d = dst[name].view(H, N, Dv)
            d[:h, :n, :dv].copy_(wo)
        elif name.endswith("experts.gate_up_proj"):
            i = w.shape[1] // 2
            I_ = dst[name].shape[1] // 2
            put(name, w[:, :i], slice(None), slice(0, i), slice(0, h))
            put(name, w[:, i:], slice(None), slice(I_, I_ + i), slice(0, h))
        elif name.endswith("experts.down_proj"):
            put(name, w, slice(None), slice(0, h), slice(0, w.shape[2]))
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            put(name, w, slice(0, w.shape[0]), slice(0, h))
        elif name.endswith("down_proj.weight"):
            put(name, w, slice(0, h), slice(0, w.shape[1]))
        elif name.endswith("mlp.gate.weight"):
            put(name, w, slice(None), slice(0, h))
        elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
            put(name, w, slice(None), slice(0, h))
        else:
            raise ConfigError(f"lift: no rule for parameter {name} {tuple(w.shape)}")
    # Softmax scale: keep the miniature's 1/sqrt(dn + r) instead of the wider heads' 1/sqrt(Dn + r),
    # set on the attention modules (exact; scaling the query weights instead would round in bf16).
    for mod in big.modules():
        if hasattr(mod, "scaling") and hasattr(mod, "qk_head_dim"):
            mod.scaling = mod.scaling * q_scale
    eps = mc.rms_norm_eps
    for mod_name, mod in big.named_modules():
        if hasattr(mod, "variance_epsilon"):
            mod.variance_epsilon = eps * (kl / KL if mod_name.endswith("kv_a_layernorm") else h / H)


def lifted_model(mini_dir: Path, device: str, check_memory=None, overrides: dict | None = None):
    """(lifted model with fused experts on ``device``, tokenizer, description)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from spice_core.tools.bench_models import _estimate_params, load_safetensors_model
    from spice_core.errors import ModelLoadError
    from spice_core.model.loader import _load_tokenizer, _safetensors_files, read_config, resolve_model_path

    path = resolve_model_path(str(mini_dir))
    read_config(path)
    _safetensors_files(path)
    try:
        mini_cfg = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - config classes raise many types
        raise ModelLoadError(f"--model {path}: config.json cannot be read by transformers ({e})") from e
    cfg = _lift_config(mini_cfg, overrides)       # the topology is checked before any weight is read
    if check_memory is not None:
        check_memory(_estimate_params(cfg) * 2)
    mini = load_safetensors_model(path, dtype=torch.bfloat16).eval()
    with torch.device(device):
        big = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    big.eval()
    lift_weights(mini.to(device), big)
    return big, _load_tokenizer(path), f"lift:{path.name}"


@torch.no_grad()
def verify(mini_dir: Path, device: str, prompts: list[str], max_new_tokens: int = 32, big=None, tok=None) -> dict:
    """Greedy tokens and logits of the miniature vs the lifted model, same device, same prompts."""
    from spice_core.tools.bench_models import load_safetensors_model

    if big is None:
        big, tok, _ = lifted_model(mini_dir, device, check_memory=memory_check(device))
    if tok is None:
        raise ConfigError(f"--model {mini_dir}: has no tokenizer files: lift verifies with text prompts")
    mini = load_safetensors_model(Path(mini_dir), dtype=torch.bfloat16).to(device).eval()
    same, total, max_diff = 0, 0, 0.0
    for text in prompts:
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]], device=device)
        a = mini.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
        b = big.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
        n = min(a.shape[1], b.shape[1])
        same += int((a[0, :n] == b[0, :n]).sum()) - ids.shape[1]
        total += n - ids.shape[1]
        la, lb = mini(a).logits.float(), big(a).logits.float()
        max_diff = max(max_diff, float((la - lb).abs().max()))
    return {"greedy_token_agreement": same / max(1, total), "max_abs_logit_diff": max_diff,
            "logit_scale": float(la.abs().max()), "tokens_compared": total}


def memory_check(device: str):
    """A check of the lifted model's bytes against the memory it is built in: the GPU's free memory on
    CUDA (host memory holds only the miniature then), else the host's available memory."""
    from spice_core.tools.bench_models import check_host_memory

    def check(needed_bytes: int) -> None:
        if str(device).startswith("cuda"):
            free, _ = torch.cuda.mem_get_info(torch.device(device))
            if needed_bytes > 0.9 * free:
                raise ConfigError(f"the lifted model needs about {needed_bytes / 1e9:.1f} GB of GPU memory but only "
                                  f"{free / 1e9:.1f} GB is free on {device}: free the GPU or use a larger one")
        else:
            check_host_memory(needed_bytes, "the lifted model")
    return check


def add_cli(sub) -> None:
    from spice_core.tools import args as ca

    p = sub.add_parser("lift", help="lift the miniature into DeepSeek-V2-Lite shapes and verify it")
    p.add_argument("--model", default=None, help="the miniature (default: the shipped model)")
    p.add_argument("--device", type=ca.device, default=None)
    p.add_argument("--max-new-tokens", type=ca.int_in(1, 1024), default=32)
    p.set_defaults(func=run)


def run(args) -> int:
    import json

    from spice_core.heldout import DEFAULT_PROMPTS
    from spice_core.model.loader import resolve_model_path

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    res = verify(resolve_model_path(args.model), device, list(DEFAULT_PROMPTS[:4]), args.max_new_tokens)
    print(json.dumps(res, indent=1))
    return 0


def lift_artifacts(mini_dir: Path, big_lm):
    """The miniature's calibration artifacts (draft heads, LoRE factors, popularity), zero-padded
    to the lifted model's hidden width: the lifted model's MoE inputs equal the miniature's in
    the first h dims and are zero beyond, so padded heads and surrogates compute the same values.
    None when the miniature has no artifacts."""
    from spice_core.model.loader import load_model
    from spice_core.predictor.artifacts import Artifacts, load_artifacts_if_present
    from spice_core.predictor.draft import DraftPredictor

    mini_lm = load_model(mini_dir, "cpu")
    arts = load_artifacts_if_present(mini_lm)
    if arts is None:
        return None
    h, H = mini_lm.layout.hidden, big_lm.layout.hidden

    def pad(t: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(*t.shape[:-1], H, dtype=t.dtype)
        out[..., :h] = t
        return out

    lifted = Artifacts(popularity=arts.popularity, calibration=arts.calibration)
    if arts.draft is not None:
        d = arts.draft.tensors()
        lifted.draft = DraftPredictor(arts.draft.moe_layers, pad(d["weight"]), d["bias"], d["calib"],
                                      arts.draft.top_k, device=big_lm.device)
    if arts.lore is not None:
        from spice_core.lore.bank import LoreBank, LoreLayer, shared_fn_for

        src = arts.lore
        layers = {layer: LoreLayer(G=pad(ly.G), U=pad(ly.U), T=ly.T, C=pad(ly.C), alpha=ly.alpha)
                  for layer, ly in src.layers.items()}
        lifted.lore = LoreBank(layers, hidden=H, expert_width=big_lm.layout.intermediate, n_experts=src.n_experts,
                               act=src.act, dtype=big_lm.layout.dtype, shared_fn=shared_fn_for(big_lm),
                               device="cpu", target_device=big_lm.device, rank=src.rank,
                               fingerprint="lifted:" + src.fingerprint, info=src.info)
    return lifted
