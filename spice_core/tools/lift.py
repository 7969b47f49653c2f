"""`python -m spice_core lift`: a shipped miniature, lifted exactly into its real model's tensor shapes.

    miniature ─► its family's real config (bench_models) with the miniature's vocabulary, topology checked
             ─► memory checked ─► skeleton on the meta device ─► non-expert weights zero-padded on device
             ─► routed experts padded one at a time straight into the HostStore slab ─► LoadedModel

    DeepseekV2ForCausalLM ─► DeepSeek-V2-Lite: hidden 2048, 16 heads, kv_lora_rank 512, qk_nope 128,
                             qk_rope 64, v 128, routed and shared experts of width 1408, dense width 10944
    Qwen2MoeForCausalLM   ─► Qwen2-57B-A14B: hidden 3584, 28 query heads in 4 KV groups of head_dim 128
                             (q/k/v biases), routed experts of width 2560, one gated shared expert of width 20480

Every copy and kernel then has the real model's size while the lifted model computes the miniature's
function. The vocabulary stays the miniature's (8k rows instead of 102k / 152k): only the embedding and
LM head differ in size from the real model.

Why it is exact (in real arithmetic):
- padded hidden dims are zero everywhere, so they stay zero through every layer;
- RMSNorm over H dims of a vector with only h non-zero dims has rms_H^2 = (h/H) rms_h^2,
  so gains are scaled by sqrt(h/H) and eps by h/H (per norm: hidden norms and DeepSeek's
  kv_a_layernorm, whose width grows 64 -> 512, differ);
- extra heads have zero queries, keys, values (weights and biases) and output columns: they add nothing;
- grouped-query attention: mini query head i, which reads mini KV head i // g, goes to slot i % g of the
  lifted KV group i // g (Qwen2-57B-A14B has 7 query heads per KV head), so it reads the same keys;
- DeepSeek: extra qk_nope / v dims are zero; the softmax scale 1/sqrt(qk_head_dim) shrinks with the
  wider heads, so each attention module's scale is multiplied by sqrt(192/128) to keep every score the
  same. Qwen2: head_dim stays 128 (the miniature's must equal it), and so does rope_theta (1e6): RoPE
  pairs dims by head_dim and rope_theta, which padding cannot change;
- padded expert / MLP widths have zero gate, up and down weights: act(0) * 0 = 0; the shared expert's
  sigmoid gate reads only the first h dims, so it is unchanged.
In bf16 the kv_a_layernorm gain factor sqrt(64/512) rounds, and GEMMs over wider inner dimensions
accumulate in a different order: logits agree to bf16 noise, not bit for bit (tests/engine/test_lift.py
checks exactness in fp32).

Memory. The routed experts (98.7 GB for Qwen2-57B-A14B, 28.8 GB for DeepSeek-V2-Lite in bf16) are never
whole anywhere but in the one host slab: `PaddedExperts` stand in for the fused experts modules, and
`offload_model` reads each expert from them padded into a reused buffer and copies it into its row, so
the host peak is the slab plus one expert (plus, on the CPU, the non-expert weights). `lifted_whole` builds
the whole fused model on the device instead, for what needs transformers' own experts (a reference
`generate`); it costs the experts twice until `offload_model` has moved them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from spice_core.errors import ConfigError
from spice_core.units import format_bytes

REAL_ROPE_THETA = {"qwen2_moe": 1000000.0}     # by model type; DeepSeek-V2-Lite keeps the miniature's


@dataclass(frozen=True)
class _Lift:
    """What differs between families: the real model, the widths a dry run may narrow, the topology the
    miniature must share, and the attention weights' rules."""

    real: str                                   # the real model's name, for messages
    config: str                                 # bench_models function giving its config
    widths: tuple[str, ...]                     # config keys a lift override may change
    topology: tuple[str, ...]                   # config keys the miniature must share with the real model
    attention: Callable                         # (name, w, dst, mini_cfg, big_cfg) -> True when it placed w
    finish: Callable                            # (big, mini_cfg, big_cfg): softmax scales and norm eps


def _value(cfg, name: str):
    """A config value as the model reads it (Qwen2's head_dim defaults to hidden / heads)."""
    if name == "head_dim":
        return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return getattr(cfg, name, None)


def _rope_theta(cfg) -> float | None:
    params = getattr(cfg, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", None))
    return None if theta is None else float(theta)


def head_slots(n: int, k: int, N: int, K: int) -> list[int]:
    """Lifted query-head index of each of the miniature's ``n`` query heads (``k`` KV heads) among ``N`` heads
    in ``K`` KV groups: head i reads KV head i // g in both (g = n/k, G = N/K), at slot i % g of its group."""
    g, G = n // k, N // K
    return [(i // g) * G + i % g for i in range(n)]


# ---------------------------------------------------------------- DeepSeek-V2 (MLA)
def _deepseek_attention(name, w, dst, mc, bc) -> bool:
    h, H = mc.hidden_size, bc.hidden_size
    n, N = mc.num_attention_heads, bc.num_attention_heads
    dn, Dn, r = mc.qk_nope_head_dim, bc.qk_nope_head_dim, mc.qk_rope_head_dim
    dv, Dv = mc.v_head_dim, bc.v_head_dim
    kl, KL = mc.kv_lora_rank, bc.kv_lora_rank
    if name.endswith("kv_a_layernorm.weight"):
        dst[:kl] = w * math.sqrt(kl / KL)
    elif name.endswith("q_proj.weight"):
        wq, d = w.view(n, dn + r, h), dst.view(N, Dn + r, H)
        d[:n, :dn, :h] = wq[:, :dn]
        d[:n, Dn:Dn + r, :h] = wq[:, dn:]
    elif name.endswith("kv_a_proj_with_mqa.weight"):
        dst[:kl, :h] = w[:kl]
        dst[KL:KL + r, :h] = w[kl:]
    elif name.endswith("kv_b_proj.weight"):
        wb, d = w.view(n, dn + dv, kl), dst.view(N, Dn + Dv, KL)
        d[:n, :dn, :kl] = wb[:, :dn]
        d[:n, Dn:Dn + dv, :kl] = wb[:, dn:]
    elif name.endswith("o_proj.weight"):
        dst.view(H, N, Dv)[:h, :n, :dv] = w.view(h, n, dv)
    else:
        return False
    return True


def _deepseek_finish(big, mc, bc) -> None:
    # Softmax scale: keep the miniature's 1/sqrt(dn + r) instead of the wider heads' 1/sqrt(Dn + r),
    # set on the attention modules (exact; scaling the query weights instead would round in bf16).
    q_scale = math.sqrt((bc.qk_nope_head_dim + bc.qk_rope_head_dim) / (mc.qk_nope_head_dim + mc.qk_rope_head_dim))
    for mod in big.modules():
        if hasattr(mod, "scaling") and hasattr(mod, "qk_head_dim"):
            mod.scaling = mod.scaling * q_scale
    for mod_name, mod in big.named_modules():
        if hasattr(mod, "variance_epsilon"):
            ratio = mc.kv_lora_rank / bc.kv_lora_rank if mod_name.endswith("kv_a_layernorm") \
                else mc.hidden_size / bc.hidden_size
            mod.variance_epsilon = mc.rms_norm_eps * ratio


# ---------------------------------------------------------------- Qwen2-MoE (GQA with biases)
def _qwen2_attention(name, w, dst, mc, bc) -> bool:
    h, H, d = mc.hidden_size, bc.hidden_size, _value(mc, "head_dim")
    n, k = mc.num_attention_heads, mc.num_key_value_heads
    N, K = bc.num_attention_heads, bc.num_key_value_heads
    slots = torch.tensor(head_slots(n, k, N, K))
    if name.endswith("q_proj.weight"):
        dst.view(N, d, H)[slots, :, :h] = w.view(n, d, h)
    elif name.endswith("q_proj.bias"):
        dst.view(N, d)[slots] = w.view(n, d)
    elif name.endswith(("k_proj.weight", "v_proj.weight")):
        dst.view(K, d, H)[:k, :, :h] = w.view(k, d, h)
    elif name.endswith(("k_proj.bias", "v_proj.bias")):
        dst.view(K, d)[:k] = w.view(k, d)
    elif name.endswith("o_proj.weight"):
        dst.view(H, N, d)[:h, slots] = w.view(h, n, d)
    else:
        return False
    return True


def _qwen2_finish(big, mc, bc) -> None:
    for mod in big.modules():
        if hasattr(mod, "variance_epsilon"):
            mod.variance_epsilon = mc.rms_norm_eps * mc.hidden_size / bc.hidden_size


LIFTS = {      # by model type (DeepseekV2ForCausalLM, Qwen2MoeForCausalLM)
    "deepseek_v2": _Lift(
        "DeepSeek-V2-Lite", "deepseek_v2_lite_config",
        ("hidden_size", "num_attention_heads", "num_key_value_heads", "qk_nope_head_dim", "v_head_dim",
         "kv_lora_rank", "moe_intermediate_size", "intermediate_size"),
        ("num_hidden_layers", "n_routed_experts", "num_experts_per_tok", "first_k_dense_replace", "n_shared_experts",
         "qk_rope_head_dim", "topk_method", "routed_scaling_factor"),
        _deepseek_attention, _deepseek_finish),
    "qwen2_moe": _Lift(
        "Qwen2-57B-A14B", "qwen2_57b_a14b_config",
        ("hidden_size", "num_attention_heads", "num_key_value_heads", "moe_intermediate_size",
         "shared_expert_intermediate_size", "intermediate_size"),
        ("num_hidden_layers", "num_experts", "num_experts_per_tok", "norm_topk_prob", "decoder_sparse_step",
         "mlp_only_layers", "head_dim", "qkv_bias", "use_sliding_window", "hidden_act"),
        _qwen2_attention, _qwen2_finish),
}
LIFT_WIDTHS = tuple(dict.fromkeys(w for lift in LIFTS.values() for w in lift.widths))


def _family(mini_cfg) -> _Lift:
    kind = getattr(mini_cfg, "model_type", "?")
    if kind not in LIFTS:
        raise ConfigError(f"lift has no real model for model type {kind!r}: use a DeepseekV2ForCausalLM or "
                          "Qwen2MoeForCausalLM miniature")
    return LIFTS[kind]


def lift_config(mini_cfg, overrides: dict | None = None):
    """The real model's config with the miniature's vocabulary, context, norm eps and special tokens;
    ``overrides`` (dry runs on small machines) may narrow widths, never the topology."""
    from spice_core.tools import bench_models

    lift = _family(mini_cfg)
    cfg = getattr(bench_models, lift.config)(vocab_size=mini_cfg.vocab_size,
                                            max_positions=mini_cfg.max_position_embeddings)
    for k, v in (overrides or {}).items():
        if k not in lift.widths:
            raise ConfigError(f"lift override {k!r} is not a width of {lift.real}: only "
                              f"{', '.join(lift.widths)} may change")
        setattr(cfg, k, v)
    if cfg.model_type == "deepseek_v2":
        if getattr(cfg, "head_dim", None) is not None:
            cfg.head_dim = cfg.qk_rope_head_dim
        cfg.qk_head_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        if mini_cfg.q_lora_rank is not None:
            raise ConfigError("lift supports q_lora_rank None (as DeepSeek-V2-Lite)")
    for name in lift.topology:
        if _value(mini_cfg, name) != _value(cfg, name):
            raise ConfigError(f"lift needs a miniature with {lift.real}'s topology: {name} is "
                              f"{_value(mini_cfg, name)!r}, the real model has {_value(cfg, name)!r}")
    real_theta = REAL_ROPE_THETA.get(cfg.model_type)
    if real_theta is not None and _rope_theta(mini_cfg) != real_theta:
        raise ConfigError(f"lift needs the miniature's rope_theta to equal {lift.real}'s {real_theta:g} (RoPE cannot "
                          f"be padded), it is {_rope_theta(mini_cfg)!r}: retrain it with rope_theta {real_theta:g}")
    _check_heads(lift, mini_cfg, cfg)
    cfg.tie_word_embeddings = mini_cfg.tie_word_embeddings
    if hasattr(mini_cfg, "rope_parameters"):
        cfg.rope_parameters = dict(mini_cfg.rope_parameters)
    cfg.rms_norm_eps = mini_cfg.rms_norm_eps
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = mini_cfg.bos_token_id, mini_cfg.eos_token_id, \
        getattr(mini_cfg, "pad_token_id", None)
    return cfg


def _check_heads(lift: _Lift, mc, bc) -> None:
    """Every miniature width fits inside the lifted one, and GQA groups nest."""
    names = [w for w in lift.widths if w not in ("num_attention_heads", "num_key_value_heads")]
    for name in names:
        if getattr(mc, name) > getattr(bc, name):
            raise ConfigError(f"lift: the miniature's {name} {getattr(mc, name)} is wider than the lifted "
                              f"{getattr(bc, name)}: it must fit inside (narrow lift_overrides less)")
    n, k, N, K = mc.num_attention_heads, mc.num_key_value_heads, bc.num_attention_heads, bc.num_key_value_heads
    if n % k or N % K or k > K or n // k > N // K:
        raise ConfigError(f"lift: the miniature's {n} query heads in {k} KV groups do not nest in the lifted {N} "
                          f"heads in {K} groups (need at most {K} groups of at most {N // max(K, 1)} heads)")


def pad_gate_up(gate_up: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """One expert's gate_up [2i,h] into a wider one's, out [2I,H]: gate rows at 0, up rows at I. Writes only
    the miniature's positions (the rest of ``out`` must be zero); returns ``out``."""
    i, h, width = gate_up.shape[0] // 2, gate_up.shape[1], out.shape[0] // 2
    out[:i, :h] = gate_up[:i]
    out[width:width + i, :h] = gate_up[i:]
    return out


def pad_down(down: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """One expert's down [h,i] into a wider one's, out [H,I] (the rest of ``out`` must be zero)."""
    out[:down.shape[0], :down.shape[1]] = down
    return out


@torch.no_grad()
def lift_weights(mini, big, experts: bool = True) -> None:
    """Copy ``mini``'s weights into ``big`` (the real model's shapes), zero-padded and rescaled. With
    ``experts`` False the routed experts are left alone (`lifted_model` streams them into host memory)."""
    mc, bc = mini.config, big.config
    lift = _family(mc)
    h, H = mc.hidden_size, bc.hidden_size
    src = dict(mini.named_parameters())
    dst = dict(big.named_parameters())
    for name, p in dst.items():
        if not p.is_meta:
            p.zero_()
    for name, w in src.items():
        if name not in dst:
            raise ConfigError(f"lift: parameter {name} has no counterpart in the lifted model")
        d = dst[name]
        w = w.to(d.device, d.dtype)
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            pad = pad_gate_up if name.endswith("gate_up_proj") else pad_down
            for e in range(w.shape[0] if experts else 0):
                pad(w[e], d[e])
        elif lift.attention(name, w, d, mc, bc):
            pass
        elif name.endswith("norm.weight"):
            d[:h] = w * math.sqrt(h / H)
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            d[:w.shape[0], :h] = w
        elif name.endswith("down_proj.weight"):
            d[:h, :w.shape[1]] = w
        elif name.endswith(("mlp.gate.weight", "shared_expert_gate.weight", "embed_tokens.weight",
                            "lm_head.weight")):
            d[:, :h] = w
        else:
            raise ConfigError(f"lift: no rule for parameter {name} {tuple(w.shape)}")
    lift.finish(big, mc, bc)


# ---------------------------------------------------------------- building
def _read_mini(mini_dir: Path):
    from transformers import AutoConfig

    from spice_core.errors import ModelLoadError
    from spice_core.model.loader import _safetensors_files, read_config, resolve_model_path

    path = resolve_model_path(str(mini_dir))
    read_config(path)
    _safetensors_files(path)
    try:
        mini_cfg = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - config classes raise many types
        raise ModelLoadError(f"--model {path}: config.json cannot be read by transformers ({e})") from e
    return path, mini_cfg


def memory_needs(cfg, device: str, whole: bool, dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """(host bytes, device bytes) building the lifted model of ``cfg`` takes at its peak. Streamed: the slab,
    one padded expert, and the non-expert weights wherever the model runs. ``whole``: the fused experts
    exist on the device too until `offload_model` has copied them into the slab."""
    from spice_core.tools.bench_models import param_counts

    size = torch.empty((), dtype=dtype).element_size()
    routed, other = (n * size for n in param_counts(cfg))
    one_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size * size
    on_device = other + (routed if whole else 0)
    if str(device).startswith("cuda"):
        return routed + 2 * one_expert, on_device
    return routed + 2 * one_expert + on_device, 0


# What a lift that does not fit can change: a bench config's lift may be narrowed; the `lift` command's may not.
NARROW_IN_CONFIG = ("free host memory or use a machine with more; a dry run can narrow the lift with "
                    "\"lift_overrides\" in the bench config")
FULL_SIZE_ONLY = "free host memory or use a machine with more (the lift command builds the real model's full shapes)"


def check_memory(cfg, device: str, whole: bool, what: str, dtype: torch.dtype = torch.bfloat16,
                 fix: str = NARROW_IN_CONFIG) -> None:
    """Refuse, before anything is built, a lift the host (MemAvailable) or the GPU cannot hold (``fix``: what the
    caller's user can do about it)."""
    from spice_core.tools.bench_models import check_host_memory

    host, dev = memory_needs(cfg, device, whole, dtype)
    check_host_memory(host, f"{what} (its routed experts in one host slab)", fix)
    if dev and str(device).startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        if dev > 0.9 * free:
            raise ConfigError(f"{what} needs about {format_bytes(dev)} of GPU memory but only {format_bytes(free)} is "
                              f"free on {device}: free the GPU or use a larger one"
                              + (" (or set \"reference_generate\": false, which streams the experts)" if whole else ""))


def _materialise_except_experts(model: nn.Module, device: str) -> None:
    """Every parameter outside the routed experts as zeros on ``device`` (tied weights stay tied) and the
    rotary buffers computed there; the experts modules stay on the meta device."""
    made: dict[int, nn.Parameter] = {}
    for mod_name, mod in model.named_modules():
        if mod_name.endswith("mlp.experts"):
            continue
        for pname, p in list(mod._parameters.items()):
            if p is not None and p.is_meta:
                if id(p) not in made:
                    made[id(p)] = nn.Parameter(torch.zeros(p.shape, dtype=p.dtype, device=device), requires_grad=False)
                mod._parameters[pname] = made[id(p)]
    for mod_name, mod in list(model.named_modules()):
        if any(b.is_meta for b in mod.buffers(recurse=False)):        # rotary embeddings: rebuilt, not zeroed
            parent, _, attr = mod_name.rpartition(".")
            setattr(model.get_submodule(parent), attr, type(mod)(model.config).to(device))


class _Padded:
    """``[e]`` gives the miniature's expert e zero-padded into ``buf`` (the lifted shape of one expert), the
    same buffer for every expert: its padding is written once and stays zero. ``shape`` and ``dtype`` are the
    lifted fused tensor's, as `offload_model` reads them."""

    def __init__(self, mini: torch.Tensor, buf: torch.Tensor, pad: Callable) -> None:
        self.mini, self.buf, self.pad = mini, buf, pad
        self.shape, self.dtype = torch.Size((mini.shape[0], *buf.shape)), buf.dtype

    def __getitem__(self, e: int) -> torch.Tensor:
        return self.pad(self.mini[e], self.buf)


class PaddedExperts(nn.Module):
    """A lifted layer's routed experts as `offload_model` reads fused ones (``gate_up_proj[e]``,
    ``down_proj[e]``, ``act_fn``), padded from the miniature's on access into two buffers every layer shares:
    they are never whole outside the host slab. Not callable: `offload_model` replaces it first."""

    def __init__(self, mini_experts: nn.Module, gate_up_buf: torch.Tensor, down_buf: torch.Tensor) -> None:
        super().__init__()
        self.act_fn = mini_experts.act_fn
        self.gate_up_proj = _Padded(mini_experts.gate_up_proj.detach().to(gate_up_buf.dtype), gate_up_buf, pad_gate_up)
        self.down_proj = _Padded(mini_experts.down_proj.detach().to(down_buf.dtype), down_buf, pad_down)

    def forward(self, *args):
        raise RuntimeError("PaddedExperts only stand in until offload_model copies them into host memory")


def lifted_model(mini_dir: Path, device: str, overrides: dict | None = None, dtype: torch.dtype = torch.bfloat16,
                 memory_fix: str = NARROW_IN_CONFIG):
    """(lifted model offloaded as `load_model` gives it, tokenizer, description), its routed experts
    streamed into host memory one at a time (see the module docstring). ``memory_fix``: `check_memory`'s advice."""
    from transformers import AutoModelForCausalLM

    from spice_core.model.loader import _load_tokenizer, offload_model
    from spice_core.tools.bench_models import load_safetensors_model

    path, mini_cfg = _read_mini(mini_dir)
    cfg = lift_config(mini_cfg, overrides)      # the topology is checked before any weight is read
    check_memory(cfg, device, whole=False, what=f"lift:{path.name}", dtype=dtype, fix=memory_fix)
    mini = load_safetensors_model(path, dtype=dtype).eval()
    with torch.device("meta"):
        big = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    _materialise_except_experts(big, device)
    lift_weights(mini, big, experts=False)
    big.eval()
    width, hidden = cfg.moe_intermediate_size, cfg.hidden_size
    gate_up, down = torch.zeros(2 * width, hidden, dtype=dtype), torch.zeros(hidden, width, dtype=dtype)
    for layer, block in enumerate(big.model.layers):
        if hasattr(block.mlp, "experts"):
            block.mlp.experts = PaddedExperts(mini.model.layers[layer].mlp.experts, gate_up, down)
    tok = _load_tokenizer(path)
    lm = offload_model(big, torch.device(device), tokenizer=tok, path=Path(f"lift:{path.name}"))
    return lm, tok, f"lift:{path.name}"


def lifted_whole(mini_dir: Path, device: str, overrides: dict | None = None, dtype: torch.dtype = torch.bfloat16):
    """(lifted transformers model with its fused experts, all on ``device``, tokenizer, description): for what
    needs transformers' own experts (a reference generate); `offload_model` moves it into host memory."""
    from transformers import AutoModelForCausalLM

    from spice_core.model.loader import _load_tokenizer
    from spice_core.tools.bench_models import load_safetensors_model

    path, mini_cfg = _read_mini(mini_dir)
    cfg = lift_config(mini_cfg, overrides)
    check_memory(cfg, device, whole=True, what=f"lift:{path.name}", dtype=dtype)
    mini = load_safetensors_model(path, dtype=dtype).eval()
    with torch.device(device):
        big = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    big.eval()
    lift_weights(mini.to(device), big)
    return big, _load_tokenizer(path), f"lift:{path.name}"


# ---------------------------------------------------------------- checking
class _HostExperts:
    """Stands in for the engine's runtime: every selected expert from its host weights, as transformers'
    loop computes it (what the lift is checked with: no policy, no cache)."""

    def __init__(self, lm) -> None:
        self.lm = lm

    def run_layer(self, layer, x, top_k_index, top_k_weights, act):
        from spice_core.predictor.traces import host_experts_forward

        return host_experts_forward(self.lm, layer, x, top_k_index, top_k_weights, act)


@torch.no_grad()
def verify(mini_dir: Path, device: str, prompts: list[str], max_new_tokens: int = 32, lifted=None) -> dict:
    """Greedy tokens and logits of the miniature vs the lifted model (``lifted``: a LoadedModel, else built),
    same device, same prompts."""
    from spice_core.exec.experts import installed
    from spice_core.tools.bench_models import load_safetensors_model

    lm = lifted if lifted is not None else lifted_model(mini_dir, device, memory_fix=FULL_SIZE_ONLY)[0]
    if lm.tokenizer is None:
        raise ConfigError(f"--model {mini_dir}: has no tokenizer files: lift verifies with text prompts")
    mini = load_safetensors_model(Path(mini_dir), dtype=lm.layout.dtype, experts_implementation="eager")
    mini = mini.to(device).eval()
    same, total, max_diff, scale = 0, 0, 0.0, 0.0
    with installed(lm, _HostExperts(lm)):
        for text in prompts:
            ids = torch.tensor([lm.tokenizer(text, add_special_tokens=False)["input_ids"]], device=device)
            a = mini.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
            b = lm.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
            n = min(a.shape[1], b.shape[1])
            same += int((a[0, :n] == b[0, :n]).sum()) - ids.shape[1]
            total += n - ids.shape[1]
            la, lb = mini(a).logits.float(), lm.model(a).logits.float()
            max_diff = max(max_diff, float((la - lb).abs().max()))
            scale = max(scale, float(la.abs().max()))
    return {"greedy_token_agreement": same / max(1, total), "max_abs_logit_diff": max_diff,
            "logit_scale": scale, "tokens_compared": total}


def add_cli(sub) -> None:
    from spice_core.model.shipped import model_argument
    from spice_core.tools import args as ca
    from spice_core.tools.generate import MODEL_HELP

    p = sub.add_parser("lift", help="lift a miniature into its real model's shapes (DeepSeek-V2-Lite, "
                                    "Qwen2-57B-A14B) and verify it")
    p.add_argument("--model", type=model_argument, default=None, help=f"the miniature: {MODEL_HELP}")
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

    Layouts (both families): draft weight [n_moe, D*E, h] -> [.., H] (bias and calibration as they are);
    LoRE per layer G, U [E,R,h] and C [E,R+1,h] -> [.., H] (T [E,R+1,R+1] and alpha [E] as they are), its
    shared-expert term read from the lifted model's own (gated, for Qwen2-MoE) shared expert.
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
        half = big_lm.device.type == "cuda" or big_lm.layout.dtype in (torch.float16, torch.bfloat16)
        lifted.draft = DraftPredictor(arts.draft.moe_layers, pad(d["weight"]), d["bias"], d["calib"],
                                      arts.draft.top_k, device=big_lm.device,
                                      dtype=torch.float16 if half else torch.float32,     # as load_draft picks
                                      router_rule=arts.draft.router_rule)
    if arts.lore is not None:
        from spice_core.lore.bank import LoreBank, LoreLayer, shared_fn_for

        src = arts.lore
        layers = {layer: LoreLayer(G=pad(ly.G), U=pad(ly.U), T=ly.T, C=pad(ly.C), alpha=ly.alpha)
                  for layer, ly in src.layers.items()}
        lifted.lore = LoreBank(layers, hidden=H, expert_width=big_lm.layout.intermediate, n_experts=src.n_experts,
                               act=src.act, dtype=big_lm.layout.dtype, shared_fn=shared_fn_for(big_lm),
                               device="cpu", target_device=big_lm.device, rank=src.rank,
                               fingerprint="lifted:" + src.fingerprint, info=src.info, rebuild=src.rebuild)
    return lifted
