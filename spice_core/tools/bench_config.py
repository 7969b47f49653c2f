"""The bench config and results files, checked key by key before any model is built.

    --config FILE ─► JSON object ─► every key: known? right type? in range? ─► the dict `run_bench` reads
    OUT/results.json (--replot, --merge) ─► list of records with the keys figures and merging read

A typo in a key (``"budget"`` for ``"budgets"``) is refused rather than silently ignored; each
error names the key, the value and what is allowed. Pure: dicts in, dicts out (torch is only
asked whether CUDA is visible, for ``"timing": "measured"``).
"""
from __future__ import annotations

import json
from pathlib import Path

from spice_core.api import COPY_ISSUES, LANE_OFFERS, MAX_NEW_TOKENS_LIMIT, POLICIES, SETTING_RANGES
from spice_core.errors import ConfigError
from spice_core.policy.planner import PREFETCH_ADMISSIONS
from spice_core.user_files import is_number, json_type, read_json

LINKS_GBPS = {"native": None, "pcie4x8": 13.0, "pcie4x16": 25.0}
# Every family's lift widths (spice_core/tools/lift.py checks a config's against its own family).
LIFT_WIDTHS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "qk_nope_head_dim", "v_head_dim",
               "kv_lora_rank", "moe_intermediate_size", "intermediate_size", "shared_expert_intermediate_size")
MAX_PROMPTS = 10_000
MAX_PROMPT_TOKENS = 1_000_000


def _show(v) -> str:
    return json.dumps(v)[:60]


def _int(where: str, key: str, v, lo: int, hi: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ConfigError(f"{where} \"{key}\" is {_show(v)}: use an integer in [{lo}, {hi}]")


def _bool(where: str, key: str, v, nullable: bool = False) -> None:
    if not (isinstance(v, bool) or (nullable and v is None)):
        raise ConfigError(f"{where} \"{key}\" is {_show(v)}: use true or false" + (" (or null)" if nullable else ""))


def _str(where: str, key: str, v, choices=None) -> None:
    if not isinstance(v, str) or not v or (choices is not None and v not in choices):
        extra = f": choose one of {', '.join(choices)}" if choices is not None else ": use a non-empty string"
        raise ConfigError(f"{where} \"{key}\" is {_show(v)}{extra}")


def _number(where: str, key: str, v, lo: float, hi: float) -> None:
    if not is_number(v) or not lo <= v <= hi:
        raise ConfigError(f"{where} \"{key}\" is {_show(v)}: use a number in [{lo:g}, {hi:g}]")


def _list_of(where: str, key: str, v, item_check) -> None:
    if not isinstance(v, list) or not v:
        raise ConfigError(f"{where} \"{key}\" is {_show(v)}: use a non-empty list")
    for x in v:
        item_check(x)


def _policy(where: str, key: str):
    def check(p) -> None:
        if p not in POLICIES:
            raise ConfigError(f"{where} policy {_show(p)} in \"{key}\" is unknown: choose from {', '.join(POLICIES)}")
    return check


def _link(where: str):
    def check(link) -> None:
        if link not in LINKS_GBPS:
            raise ConfigError(f"{where} link {_show(link)} is unknown: choose from {', '.join(LINKS_GBPS)}")
    return check


def _budget(where: str):
    def check(b) -> None:
        if not is_number(b) or not 0 < b <= 1:
            raise ConfigError(f"{where} budget {_show(b)} is out of range: use fractions in (0, 1]")
    return check


def _prompts(where: str, p) -> None:
    if isinstance(p, list):
        if not p or not all(isinstance(t, str) and t.strip() for t in p):
            raise ConfigError(f"{where} \"prompts\" as a list must hold non-empty strings (at least one)")
        return
    if not isinstance(p, dict):
        raise ConfigError(f"{where} \"prompts\" is {json_type(p)}: use a list of strings, "
                          "{\"heldout\": N} or {\"random_ids\": N, \"length\": L}")
    if "heldout" in p:
        if set(p) != {"heldout"}:
            raise ConfigError(f"{where} \"prompts\" {{\"heldout\": N}} takes no other keys, got {sorted(p)}")
        _int(where, "prompts.heldout", p["heldout"], 1, MAX_PROMPTS)
        return
    extra = set(p) - {"random_ids", "length", "seed"}
    if extra:
        raise ConfigError(f"{where} \"prompts\" has unknown keys {sorted(extra)}: use heldout, or random_ids, "
                          "length and seed")
    _int(where, "prompts.random_ids", p.get("random_ids", 8), 1, MAX_PROMPTS)
    _int(where, "prompts.length", p.get("length", 32), 1, MAX_PROMPT_TOKENS)
    _int(where, "prompts.seed", p.get("seed", 0), 0, 2**63 - 1)


def _lift_overrides(where: str, v) -> None:
    if not isinstance(v, dict):
        raise ConfigError(f"{where} \"lift_overrides\" is {json_type(v)}: use an object of widths")
    for k, x in v.items():
        if k not in LIFT_WIDTHS:
            raise ConfigError(f"{where} lift override {k!r} is not a width: only {', '.join(LIFT_WIDTHS)} may change")
        _int(where, f"lift_overrides.{k}", x, 1, 1_000_000)


def _check_common(where: str, d: dict) -> None:
    """Keys a config and a run block share."""
    if "policies" in d:
        _list_of(where, "policies", d["policies"], _policy(where, "policies"))
    if "budgets" in d:
        _list_of(where, "budgets", d["budgets"], _budget(where))
    if "links" in d:
        _list_of(where, "links", d["links"], _link(where))
    if "max_new_tokens" in d:
        if d["max_new_tokens"] == 1 and not isinstance(d["max_new_tokens"], bool):
            # The first new token is the TTFT: TPOT (bench's number, and the stock reference's) needs a second one.
            raise ConfigError(f"{where} \"max_new_tokens\" is 1: a time per output token needs at least 2 new tokens "
                              "(the first one's time is the TTFT): use 2 or more")
        _int(where, "max_new_tokens", d["max_new_tokens"], 2, MAX_NEW_TOKENS_LIMIT)
    if "repetitions" in d:
        _int(where, "repetitions", d["repetitions"], 1, 10_000)
    if "host_aware" in d:
        _bool(where, "host_aware", d["host_aware"])
    if "cpu_lane" in d:
        _bool(where, "cpu_lane", d["cpu_lane"])
    if "executor" in d and d["executor"] not in ("auto", "eager", "graphed"):
        raise ConfigError(f"{where}: \"executor\" {d['executor']!r} is unknown: use \"auto\", \"eager\" or \"graphed\"")
    if "prefetch_admission" in d and d["prefetch_admission"] not in PREFETCH_ADMISSIONS:
        raise ConfigError(f"{where}: \"prefetch_admission\" {d['prefetch_admission']!r} is unknown: use \"exact\" "
                          "(approximating policies prefetch only experts predicted to weigh at least tau_approx) or "
                          "\"all\" (an A/B of that rule)")
    if "lane_offer" in d and d["lane_offer"] not in LANE_OFFERS:
        raise ConfigError(f"{where}: \"lane_offer\" {d['lane_offer']!r} is unknown: use \"auto\" (the CPU lane where one "
                          "CPU expert beats a copy) or \"always\" (offer it on any link, an A/B)")
    if "teacher_forced" in d:
        v = d["teacher_forced"]
        if not isinstance(v, bool):
            _list_of(where, "teacher_forced", v, _policy(where, "teacher_forced"))
    if "heldout_text_tokens" in d:
        _int(where, "heldout_text_tokens", d["heldout_text_tokens"], 0, MAX_NEW_TOKENS_LIMIT * 16)
        if d["heldout_text_tokens"] and not d.get("teacher_forced"):
            raise ConfigError(f"{where}: \"heldout_text_tokens\" feeds held-out text to the teacher-forced policies: "
                              "set \"teacher_forced\" (true or a list of policies) too, or drop it")
    if "heldout_text_window" in d:
        _int(where, "heldout_text_window", d["heldout_text_window"], 2, MAX_NEW_TOKENS_LIMIT)
    if "copy_issue" in d and d["copy_issue"] not in COPY_ISSUES:
        raise ConfigError(f"{where}: \"copy_issue\" {d['copy_issue']!r} is unknown: use \"direct\" "
                          "(cudaMemcpyAsync called directly) or \"torch\" (Tensor.copy_, an A/B)")


RUN_KEYS = ("policies", "budgets", "links", "n_prompts", "prompt_indices", "long_prompt", "max_new_tokens",
            "repetitions", "host_aware", "variant", "executor", "cpu_lane", "lane_offer", "tau_prefetch", "tau_approx",
            "max_lookahead", "lore_rank", "prefetch_admission", "teacher_forced")
CONFIG_KEYS = ("model", "policies", "budgets", "links", "timing", "profile", "shape", "prompts", "max_new_tokens",
               "repetitions", "reference_generate", "hw_profile", "export_traces", "export_trace_prompts", "runs",
               "tau_prefetch", "tau_approx", "max_lookahead", "lore_rank", "verify_lift", "prefetch_after_experts",
               "long_prompt_tokens", "host_aware", "artifacts", "lift_overrides", "executor", "lane_offer", "cpu_lane",
               "prefetch_admission", "copy_issue", "teacher_forced", "heldout_text_tokens", "heldout_text_window",
               "interleave_runs", "comment")


def check_config(cfg, where: str = "config") -> None:
    """Every key of a bench config (see bench.py's docstring), or a ConfigError naming it."""
    from spice_core.timing.profiles import profile_names, shape_names

    if not isinstance(cfg, dict):
        raise ConfigError(f"{where} holds {json_type(cfg)}: write one JSON object {{\"model\": ..., \"policies\": [...]}}")
    unknown = sorted(set(cfg) - set(CONFIG_KEYS))
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown}: allowed are {', '.join(CONFIG_KEYS)}")
    if "model" not in cfg:
        raise ConfigError(f"{where} has no \"model\": name one, e.g. \"assets/spice-mini\" or "
                          "\"random:tiny-deepseek\"")
    _str(where, "model", cfg["model"])
    _check_common(where, cfg)
    if "timing" in cfg:
        _str(where, "timing", cfg["timing"], ("measured", "modeled"))
    if "profile" in cfg:
        _str(where, "profile", cfg["profile"], profile_names())
    if "shape" in cfg:
        _str(where, "shape", cfg["shape"], shape_names())
    if "prompts" in cfg:
        _prompts(where, cfg["prompts"])
    for key in ("reference_generate", "verify_lift", "artifacts", "interleave_runs"):
        if key in cfg:
            _bool(where, key, cfg[key])
    if "prefetch_after_experts" in cfg:
        _bool(where, "prefetch_after_experts", cfg["prefetch_after_experts"], nullable=True)
    if "hw_profile" in cfg and cfg["hw_profile"] is not None:
        _str(where, "hw_profile", cfg["hw_profile"])
    if "export_traces" in cfg:
        v = cfg["export_traces"]
        if not isinstance(v, list):
            raise ConfigError(f"{where} \"export_traces\" is {_show(v)}: use a list of policy names")
        for p in v:
            _policy(where, "export_traces")(p)
    if "export_trace_prompts" in cfg:
        _str(where, "export_trace_prompts", cfg["export_trace_prompts"], ("first", "all"))
    _check_thresholds(where, cfg)
    if "long_prompt_tokens" in cfg:
        _int(where, "long_prompt_tokens", cfg["long_prompt_tokens"], 0, MAX_PROMPT_TOKENS)
    if "lift_overrides" in cfg:
        _lift_overrides(where, cfg["lift_overrides"])
    runs = cfg.get("runs")
    if runs is not None:
        if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
            raise ConfigError(f"{where} \"runs\" must be a list of objects (each overriding policies, budgets, "
                              "links, ...)")
        for i, r in enumerate(runs):
            w = f"{where} runs[{i}]"
            unknown = sorted(set(r) - set(RUN_KEYS))
            if unknown:
                raise ConfigError(f"{w} has unknown keys {unknown}: allowed are {', '.join(RUN_KEYS)}")
            _check_common(w, r)
            _check_thresholds(w, r)
            if "n_prompts" in r:     # 0: the block runs the long prompt alone
                _int(w, "n_prompts", r["n_prompts"], 0 if r.get("long_prompt") else 1, MAX_PROMPTS)
            if "long_prompt" in r:
                _bool(w, "long_prompt", r["long_prompt"])
            if "prompt_indices" in r:     # resume a block: only these held-out prompts (0-based)
                v = r["prompt_indices"]
                if not isinstance(v, list) or not v or len(set(map(repr, v))) != len(v):
                    raise ConfigError(f"{w} \"prompt_indices\" is {_show(v)}: use a non-empty list of distinct "
                                      "prompt indices, e.g. [1, 3]")
                for x in v:
                    _int(w, "prompt_indices", x, 0, MAX_PROMPTS - 1)
            if "variant" in r and not isinstance(r["variant"], str):
                raise ConfigError(f"{w} \"variant\" is {_show(r['variant'])}: use a string label")


def _check_thresholds(where: str, d: dict) -> None:
    """The spice thresholds a config or one of its blocks may set, within the ranges RunSettings takes."""
    for key in ("tau_prefetch", "tau_approx"):
        if key in d:
            _number(where, key, d[key], *SETTING_RANGES[key])
    if "max_lookahead" in d:
        _int(where, "max_lookahead", d["max_lookahead"], *SETTING_RANGES["max_lookahead"])
    if "lore_rank" in d:
        _int(where, "lore_rank", d["lore_rank"], 1, 1_000_000)


def load_config_file(path) -> dict:
    """The config JSON at ``path``, checked (not yet against CUDA or the model: see bench._load_config)."""
    cfg = read_json(path, "--config", dict, limit_bytes=10_000_000)
    check_config(cfg, f"--config {path}")
    return cfg


# What --replot and --merge read from every record.
_RECORD_KEYS = {"policy": str, "link": str, "timing": str, "budget_frac": (int, float), "model": str}


def load_results(path: Path, flag: str) -> list[dict]:
    """The records of a results.json written by bench, checked enough to plot and merge."""
    records = read_json(path, flag, list, limit_bytes=256_000_000)
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise ConfigError(f"{flag} {path}: record {i} is {json_type(r)}, not an object: pass a bench output")
        for key, typ in _RECORD_KEYS.items():
            if not isinstance(r.get(key), typ) or isinstance(r.get(key), bool):
                raise ConfigError(f"{flag} {path}: record {i} has {key}={_show(r.get(key))}: pass a bench output")
        for key in ("tpot_ms_median", "tpot_ms_p90", "hit_rate", "floor_ms"):
            v = r.get(key)
            if v is not None and not is_number(v):
                raise ConfigError(f"{flag} {path}: record {i} has {key}={_show(v)}: pass a bench output")
        raw = r.get("raw")
        if raw is not None and not _raw_ok(raw):
            raise ConfigError(f"{flag} {path}: record {i} has malformed \"raw\" data: pass a bench output")
    return records


def _raw_ok(raw) -> bool:
    if not isinstance(raw, dict):
        return False
    lists = ("step_ms", "ttft_ms", "agreements")
    nums = ("selections", "hits", "bytes", "stall_ms", "wasted_prefetch_bytes", "gpu_peak_bytes", "n_runs")
    return (all(isinstance(raw.get(k), list) and all(is_number(x) for x in raw[k]) for k in lists)
            and all(is_number(raw.get(k)) for k in nums)
            and isinstance(raw.get("miss_split"), dict) and all(is_number(x) for x in raw["miss_split"].values()))
