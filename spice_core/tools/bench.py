"""`python -m spice_core bench --config FILE --out DIR`: policies compared in one run.

Protocol (BENCHMARK.md): batch 1, greedy; for each repetition, prompt and budget, every
policy runs back to back (interleaved), so machine noise hits all alike. Per record:
TPOT median / p90 over decode steps (first token excluded), hit rate, bytes per token,
stall ms per token, miss split, greedy agreement with the exact reference policy, the CPU lane's measured ms
and GB/s per expert, the link floor and the three-lane floor (bench_records.add_floors, three_lane_floor).

Config (JSON):
    {"model": "assets/spice-mini" | "random:deepseek-v2-lite" | "lift:assets/spice-mini",
     "policies": [...], "budgets": [0.25], "links": ["native", "pcie4x8"],
     "timing": "measured" | "modeled", "profile": "h200-pcie5x16", "shape": "deepseek-v2-lite",
     "prompts": ["...", ...] | {"random_ids": 8, "length": 32},
     "max_new_tokens": 64, "repetitions": 1, "reference_generate": true, "hw_profile": "FILE",
     "export_traces": ["spice"], "export_trace_prompts": "first" | "all",
     "cpu_lane": true, "lane_offer": "auto" | "always", "prefetch_admission": "exact" | "all",
     "copy_issue": "direct" | "torch", "teacher_forced": true | [policy, ...], "heldout_text_tokens": 512,
     "heldout_text_window": 128, "runs": [{...}, ...], "interleave_runs": false}
("lane_offer": "always" offers the CPU lane to spice-like policies where a CPU expert is slower than a copy, an A/B;
"copy_issue": "torch" issues slot copies by Tensor.copy_, not cudaMemcpyAsync directly, an A/B of that path;
"teacher_forced" adds quality passes on the run's own device and code, "heldout_text_tokens" held-out text to them,
bench_quality.py; "interleave_runs": true runs every "runs" block on a prompt before any block takes the next one, so
an A/B of two blocks' settings meets the same machine drift, as the policies of one block do; false runs the blocks one
after the other.)
Everything is validated before any model is built (bench_config.py): unknown keys, wrong types and
out-of-range values are refused with the key's name; "comment" may hold any note.
Held-out prompts ({"heldout": N}, the long prompt) come from the spice-heldout.json.gz beside the model
(a lift:'s miniature). A lift: model streams its experts into host memory (lift.py), unless
"reference_generate" asks for transformers' generate, which needs the whole model on the GPU first.

Long protocols can be split: ``--shard K/N`` runs every policy on prompts K, K+N, ... (say one
process per GPU, ``CUDA_VISIBLE_DEVICES=K``), and ``--merge DIR [DIR ...] --out OUT`` recombines
the shards' records exactly (bench_records.py keeps every step's time). A block cut short is finished
by a block naming the prompts it still lacks (``"prompt_indices": [6]``).
"""
from __future__ import annotations

import hashlib
import json
import logging
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from spice_core.api import EXACT_POLICIES, POLICIES, RunSettings, greedy_agreement
from spice_core.tools.bench_blocks import SETTING_DEFAULTS, block_units, resolve_blocks
from spice_core.tools.bench_config import LINKS_GBPS, load_config_file, load_results
from spice_core.tools.bench_merge import merge_folders
from spice_core.tools.bench_quality import QualityPasses, heldout_windows
from spice_core.tools.bench_records import (add_floors, add_three_lane_floor, divergence_totals, markdown_table,
                                           provenance, split_totals)
from spice_core.tools.bench_models import (check_host_memory, cpu_float32_offload_dtype, load_safetensors_model,
                                          model_folder)
from spice_core import heldout
from spice_core.errors import ConfigError
from spice_core.heldout import DEFAULT_PROMPTS
from spice_core.model.loader import _safetensors_files
from spice_core.timing.profiles import NATIVE_SHAPE, routing_shape, run_profile_label

log = logging.getLogger(__name__)
DEFAULT_SHAPE = NATIVE_SHAPE     # a modeled run's shape when the config names none and the model is no miniature:
                                 # its own sizes (as generate and the app default it, config.default_shape)


def _load_config(path: Path) -> dict:
    cfg = load_config_file(path)
    timing = cfg.get("timing", "measured" if torch.cuda.is_available() else "modeled")
    if timing == "measured" and not torch.cuda.is_available():
        raise ConfigError("config timing 'measured' needs CUDA: use \"timing\": \"modeled\" on this machine")
    cfg["timing"] = timing
    check_budgets_fit_the_model(cfg)
    return cfg


def check_budgets_fit_the_model(cfg: dict) -> None:
    """Before anything is built: a budget must hold at least one layer's top-k experts. Read from
    config.json (local folders and lift: sources); a model that cannot be inspected cheaply is
    checked by the engine at its first run instead."""
    from spice_core.model.loader import read_config

    spec = str(cfg.get("model", ""))
    if spec.startswith("random:"):
        from spice_core.tools.bench_models import SHAPES
        if spec.split(":", 1)[1] not in SHAPES:
            raise ConfigError(f"config model {spec!r}: random model shape is unknown: choose from "
                              f"{', '.join('random:' + s for s in SHAPES)}")
        return
    folder = Path(spec.split(":", 1)[1] if spec.startswith("lift:") else spec)
    if not folder.is_dir():
        return                      # a hub id: checked when it is resolved
    c = read_config(folder)         # a broken config.json is refused here, before any model is built
    _safetensors_files(folder)      # and so is a checkpoint without safetensors
    top_k = c.get("num_experts_per_tok")
    n_exp = c.get("n_routed_experts") or c.get("num_local_experts") or c.get("num_experts")
    layers = c.get("num_hidden_layers")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (top_k, n_exp, layers)):
        return
    min_frac = top_k / (n_exp * layers)     # an upper bound on the MoE layers gives a safe lower bound
    for where in [cfg, *(cfg.get("runs") or [])]:
        for b in where.get("budgets", []):
            if float(b) < min_frac:
                raise ConfigError(f"config budget {b} is below one layer's top-{top_k} experts "
                                  f"({min_frac:.4f} of this model's routed experts): raise it")


def _check_host_memory(needed_bytes: int) -> None:
    check_host_memory(needed_bytes, "the model")


def build_model(spec: str, device: str, overrides: dict | None = None):
    """(hf model with experts still fused, tokenizer or None, description). A lift: model is built whole on
    ``device`` here; `run_bench` streams it into host memory instead unless it needs the whole model."""
    if spec.startswith("random:"):
        shape = spec.split(":", 1)[1]
        from spice_core.tools.bench_models import random_model
        return random_model(shape, device, check_memory=_check_host_memory)
    if spec.startswith("lift:"):
        from spice_core.tools.lift import lifted_whole
        return lifted_whole(Path(spec.split(":", 1)[1]), device, overrides=overrides)
    from spice_core.model.loader import _load_tokenizer, resolve_model_path
    path = resolve_model_path(spec)
    dtype = torch.float32 if cpu_float32_offload_dtype(path, device) is not None else "auto"
    hf = load_safetensors_model(path, dtype=dtype).to(device).eval()
    return hf, _load_tokenizer(path), str(path)


def heldout_prompt_ids(tokenizer, n: int, model_dir: Path | None = None) -> list[list[int]]:
    """Openings of the model's held-out stories (the eval half of its held-out split, from the
    spice-heldout.json.gz beside ``model_dir``, default the shipped model) and, every third prompt, a
    held-out chat request through the chat template, as the app sends it."""
    from spice_core.generation import build_prompt_ids
    out = []
    for p in heldout.prompts(n, model_dir):
        if "chat" in p:
            out.append(build_prompt_ids(tokenizer, messages=[{"role": "user", "content": p["chat"]}]))
        else:
            out.append(build_prompt_ids(tokenizer, prompt=p["text"]))
    return out


def long_prompt_ids(tokenizer, n_tokens: int, model_dir: Path | None = None) -> list[int]:
    """One long-context prompt of exactly ``n_tokens``: held-out stories back to back."""
    ids: list[int] = []
    for story in heldout.long_stories(model_dir):
        ids += tokenizer(story + "\n\n", add_special_tokens=False)["input_ids"]
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
    raise ConfigError(f"\"long_prompt_tokens\": {n_tokens} is longer than the held-out stories allow "
                      f"({len(ids)} tokens): ask for fewer")


def _prompt_ids(cfg: dict, tokenizer, vocab: int, model_dir: Path | None = None) -> list[list[int]]:
    p = cfg.get("prompts", list(DEFAULT_PROMPTS))
    if isinstance(p, dict) and "heldout" in p:
        if tokenizer is None:
            raise ConfigError("held-out prompts need the model's tokenizer: use \"prompts\": {\"random_ids\": N}")
        return heldout_prompt_ids(tokenizer, int(p["heldout"]), model_dir)
    if isinstance(p, dict):
        if vocab <= 10:
            raise ConfigError(f"\"prompts\": {{\"random_ids\": N}} needs a vocabulary over 10 tokens (the model has "
                              f"{vocab}): list the prompts as text")
        g = torch.Generator().manual_seed(int(p.get("seed", 0)))
        return [torch.randint(10, vocab, (int(p.get("length", 32)),), generator=g).tolist()
                for _ in range(int(p.get("random_ids", 8)))]
    if tokenizer is None:
        raise ConfigError("the model has no tokenizer: use \"prompts\": {\"random_ids\": N, \"length\": L}")
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in p]


@torch.no_grad()
def _stock_generate_tpot(hf, prompts: list[list[int]], max_new: int) -> float:
    """Plain transformers generate, all experts on the device: median TPOT over prompts."""
    dev = next(hf.parameters()).device
    tpots = []
    for ids in prompts:
        x = torch.tensor([ids], device=dev)
        hf.generate(x, max_new_tokens=2, min_new_tokens=2, do_sample=False, pad_token_id=0)   # warm
        for n in (1, max_new):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            hf.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if n == 1:
                t1 = time.perf_counter() - t
            else:
                tn = time.perf_counter() - t
        tpots.append((tn - t1) / (max_new - 1) * 1e3)
    return statistics.median(tpots)


def run_bench(cfg: dict, out: Path, device: str | None = None, hw_profile: Path | None = None,
              shard: tuple[int, int] = (0, 1)) -> list[dict]:
    """``shard`` (k, n): run only the prompts whose index is k modulo n (every policy on each), for one
    process per GPU; `merge_records` (bench --merge) combines the shards' records exactly."""
    from spice_core.engine import SpiceEngine
    from spice_core.model.loader import offload_model
    from spice_core.timing.profile_file import profile_from_file
    from spice_core.timing.profiles import get_profile

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    policies = cfg.get("policies", ["on_demand", "lru"])
    budgets = [float(b) for b in cfg.get("budgets", [0.25])]
    links = cfg.get("links", ["native"])
    reps = int(cfg.get("repetitions", 1))
    max_new = int(cfg.get("max_new_tokens", 64))
    folder = model_folder(cfg["model"])
    reference = bool(cfg.get("reference_generate")) and cfg["timing"] == "measured"
    lifted = cfg["model"].startswith("lift:")
    streamed = lifted and not reference     # the routed experts are never whole outside the host slab
    if streamed:
        from spice_core.tools.lift import lifted_model
        lm, tok, desc = lifted_model(folder, device, overrides=cfg.get("lift_overrides"))
        hf = lm.model
    else:
        hf, tok, desc = build_model(cfg["model"], device, cfg.get("lift_overrides"))
    prompts = _prompt_ids(cfg, tok, hf.config.vocab_size, folder)
    max_ctx = int(getattr(hf.config, "max_position_embeddings", 0) or 0)
    i = next((i for i, ids in enumerate(prompts) if max_ctx and len(ids) + max_new > max_ctx), None)
    if i is not None:       # before any run, and in the config's words (the engine's own refusal speaks of a chat)
        raise ConfigError(f"prompt {i} of the config is {len(prompts[i])} tokens, which with max_new_tokens {max_new} "
                          f"exceeds the model's context of {max_ctx} tokens: shorten it or lower max_new_tokens")
    workloads = [("prompts", i, ids) for i, ids in enumerate(prompts)]
    long_tokens = int(cfg.get("long_prompt_tokens", 0))
    if long_tokens:
        if tok is None:
            raise ConfigError("long_prompt_tokens needs the model's tokenizer")
        if max_ctx and long_tokens + max_new > max_ctx:
            raise ConfigError(f"long_prompt_tokens {long_tokens} + max_new_tokens {max_new} exceed the model's "
                              f"context of {max_ctx} tokens: lower long_prompt_tokens")
        workloads.append(("long", len(prompts), long_prompt_ids(tok, long_tokens, folder)))
    records: list[dict] = []
    stock_tpot = None
    if reference:
        stock_tpot = _stock_generate_tpot(hf, prompts[:2], min(max_new, 32))
        print(f"transformers generate (all experts on the GPU): TPOT {stock_tpot:.2f} ms", flush=True)
    if not streamed:
        plain = not lifted and not cfg["model"].startswith("random:")
        lm = offload_model(hf, torch.device(device), tokenizer=tok, path=Path(desc),
                           offload_dtype=cpu_float32_offload_dtype(Path(desc), device) if plain else None)
    if cfg["timing"] == "modeled":      # what the run times, as generate and the app default them: into the records
        cfg = dict(cfg, profile=cfg.get("profile") or RunSettings().profile,
                   shape=cfg.get("shape") or routing_shape(lm.family.name, len(lm.moe_layers), lm.n_experts, lm.top_k)
                   or DEFAULT_SHAPE)
    # What makes shards parts of one run (bench --merge refuses to blend records whose provenance differs).
    prov = provenance(dict(cfg, hw_profile=str(hw_profile) if hw_profile is not None else cfg.get("hw_profile")),
                      [ids for *_, ids in workloads], code_digest())
    lift_check = None
    if lifted and cfg.get("verify_lift", True):
        from spice_core.tools.lift import verify
        lift_check = verify(folder, device, list(DEFAULT_PROMPTS[:4]), 32, lifted=lm)
        print(f"lift check (miniature vs lifted, greedy): {json.dumps(lift_check)}", flush=True)
    hw = None
    if hw_profile is not None:
        cfg["hw_profile"] = str(hw_profile)
    if cfg.get("hw_profile"):
        hw = profile_from_file(cfg["hw_profile"])

    # Blocks: the config, or its "runs", each of which may set any of bench_config.RUN_KEYS ("variant" labels its
    # records), all on the one model built above.
    blocks = resolve_blocks(cfg, policies, budgets, links, workloads, len(prompts), max_new, reps, shard)
    settings_of: dict[str, dict] = {}        # variant -> its thresholds (a record says what it ran with)
    for b in blocks:
        if settings_of.setdefault(b.variant, b.settings) != b.settings:
            raise ConfigError(f"two \"runs\" blocks with variant {b.variant!r} set different thresholds "
                              f"({settings_of[b.variant]} and {b.settings}): give each setting its own \"variant\" label")
    total = sum(len(b.links) * b.reps * len(b.budgets) * len(b.workloads) * len(b.policies) for b in blocks)
    if total == 0:
        k, n = shard
        kept = sorted({pi for b in resolve_blocks(cfg, policies, budgets, links, workloads, len(prompts), max_new, reps,
                                                  (0, 1)) for _, pi, _ in b.workloads})
        raise ConfigError(f"--shard {k}/{n} selects none of the prompts this config runs ({kept}; --shard keeps the "
                          f"indices equal to {k} modulo {n}): pick a K/N that keeps one of them"
                          if n > 1 else "the config selects no prompt to run: check \"prompt_indices\" and \"n_prompts\"")
    done = 0
    t0 = time.time()
    per: dict[tuple, list] = {}
    units: dict[tuple, list] = {}        # record key -> the [prompt, repetition] of each run it holds
    max_new_of: dict[tuple, set] = {}    # record key -> the tokens asked of its runs
    written: set[Path] = set()           # traces this run wrote (an earlier run's in --out are replaced)
    lifted_arts = None
    engines: dict[tuple, SpiceEngine] = {}

    def engine_for(link: str, host_aware: bool, executor: str, lane_offer: str, admission: str) -> SpiceEngine:
        nonlocal lifted_arts
        if (key := (link, host_aware, executor, lane_offer, admission)) in engines:
            return engines[key]
        eng = SpiceEngine(lm, timing=cfg["timing"], hw_profile=hw, link_gbps=LINKS_GBPS[link],
                          prefetch_after_experts=cfg.get("prefetch_after_experts"), host_aware=host_aware,
                          executor=executor, lane_offer=lane_offer, prefetch_admission=admission,
                          copy_issue=cfg.get("copy_issue", "direct"))
        if cfg.get("artifacts", True) and cfg["model"].startswith("lift:"):
            if lifted_arts is None:
                from spice_core.tools.lift import lift_artifacts
                lifted_arts = lift_artifacts(folder, lm) or False
            eng.artifacts = lifted_arts or None
        elif cfg.get("artifacts", True) and not cfg["model"].startswith("random:"):
            eng.load_artifacts()
        engines[key] = eng
        return eng

    # Each prompt's exact tokens, by (link, budget, workload, prompt, max new tokens), alike for every exact policy at
    # any thresholds: a block with no exact policy of its own, or run before it, compares with an earlier block's.
    exact_tokens: dict[tuple, list[int]] = {}
    text_windows = None
    if int(cfg.get("heldout_text_tokens", 0)) > 0:
        text_windows, text_source = heldout_windows(lm, folder if lifted else None, int(cfg["heldout_text_tokens"]),
                                                    int(cfg.get("heldout_text_window", 128)))
        print(f"held-out text for the quality passes: {sum(len(w) for w in text_windows)} tokens of {text_source}")
    qualities = {i: QualityPasses(b.teacher_forced, text_windows) for i, b in enumerate(blocks) if b.teacher_forced}
    for i_blk, link, rep, budget, (workload, pi, ids) in block_units(blocks, bool(cfg.get("interleave_runs"))):
        blk = blocks[i_blk]
        b_policies, b_max_new, b_variant = blk.policies, blk.max_new, blk.variant
        b_cpu_lane, b_set = blk.cpu_lane, blk.settings
        ref_policy = next((p for p in b_policies if p in EXACT_POLICIES), None)
        quality = qualities.get(i_blk)
        eng = engine_for(link, blk.host_aware, blk.executor, blk.lane_offer, blk.prefetch_admission)
        ref_key = (link, budget, workload, pi, b_max_new)
        # until the block's own exact policy has run: an earlier block's exact tokens, if any
        ref_tokens = exact_tokens.get(ref_key)
        for pol in b_policies:
            s = RunSettings(policy=pol, cache_frac=budget, max_new_tokens=b_max_new,
                            profile=cfg.get("profile") or RunSettings().profile,
                            shape=cfg.get("shape") or DEFAULT_SHAPE,
                            tau_prefetch=float(b_set["tau_prefetch"]),
                            tau_approx=float(b_set["tau_approx"]),
                            max_lookahead=int(b_set["max_lookahead"]),
                            lore_rank=int(b_set["lore_rank"]), cpu_lane=b_cpu_lane)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            run = eng.start_ids(ids, s)
            steps = list(run)
            toks = [st.token_id for st in steps]
            if pol == ref_policy:
                ref_tokens = toks
                exact_tokens.setdefault(ref_key, toks)
            agree = greedy_agreement(ref_tokens, toks) if ref_tokens is not None else None
            rec = eng.get_record(run.run_id)
            every = cfg.get("export_trace_prompts") == "all"     # default: the first prompt's
            trace = out / (f"trace-{link}-{budget:.2f}-{pol}" + (f"-p{pi}" if every else "") + ".json")
            if (pi == 0 or every) and pol in cfg.get("export_traces", []) and trace not in written:
                from spice_core.trace.export import write_chrome_trace
                written.add(trace)          # the first block's, as before; a trace from an earlier run is replaced
                write_chrome_trace(rec.events, trace,
                                   metadata={"policy": pol, "link": link, "budget_frac": budget,
                                             "model": desc, "timing": cfg["timing"], "variant": b_variant,
                                             "profile": run_profile_label(hw, cfg.get("profile"), cfg["timing"]),
                                             "shape": _shape_name(cfg),
                                             "settings": b_set, "max_new_tokens": b_max_new})
            totals = dict(rec.totals, **divergence_totals(ref_tokens, toks), **split_totals(rec.events))
            if quality is not None and ref_tokens is not None:
                totals.update(quality.totals(eng, (link, rep, ref_key), ids, s, ref_policy or
                                             "resident", ref_tokens, toks))
                if workload == "prompts" and pi == 0:      # once per cell, however it is sharded
                    totals.update(quality.text(eng, (link, rep, budget), s, ref_policy or "resident"))
            if device == "cuda":
                totals["gpu_peak_bytes"] = torch.cuda.max_memory_allocated()
            per.setdefault((link, budget, pol, workload, b_variant), []).append(
                (steps, agree, totals, run.summary()))
            units.setdefault((link, budget, pol, workload, b_variant), []).append([pi, rep])
            max_new_of.setdefault((link, budget, pol, workload, b_variant), set()).add(b_max_new)
            done += 1
            _progress(done, total, t0, f"{link} {budget:.2f} {pol} {workload}")
        _write_partial(out, cfg, desc, lm, per, hw, prov, settings_of, units, shard, max_new_of)   # a run cut short keeps what finished
    sys.stderr.write("\n")
    for key, runs in per.items():
        records.append(_record(cfg, desc, lm, key, runs, hw, settings_of, units, shard, max_new_of, prov))
    if stock_tpot is not None:
        records.append({"model": desc, "policy": "transformers_generate", "budget_frac": 1.0, "link": "native",
                        "timing": "measured", "tpot_ms_median": stock_tpot, "tpot_ms_p90": None, "hit_rate": 1.0,
                        "bytes_per_token": 0, "stall_ms_per_token": 0, "greedy_agreement": None,
                        "ppl_delta_pct": None})
    _add_floors(records, lm, hw or get_profile(cfg.get("profile") or RunSettings().profile), cfg)
    out.mkdir(parents=True, exist_ok=True)
    if lift_check is not None:
        for r in records:
            r["lift_check"] = lift_check
    (out / "results.json").write_text(json.dumps(records, indent=1, default=float))
    (out / "results.md").write_text(markdown_table(records, cfg))
    (out / "results.partial.json").unlink(missing_ok=True)    # what each prompt saved: the whole run is above now
    return records


def code_digest() -> str:
    """A digest of the engine's code (every spice_core/*.py, by path), for a record's provenance."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _record(cfg, desc, lm, key: tuple, runs: list, hw, settings_of: dict, units: dict, shard: tuple[int, int],
            max_new_of: dict, prov: dict) -> dict:
    """One configuration's record, with what `merge_records` checks: the [prompt, repetition] runs it holds (in
    ``raw``), the shard and the tokens asked per run."""
    link, budget, pol, workload, variant = key
    asked = sorted(max_new_of.get(key, ()))
    rec = dict(_aggregate(cfg, desc, lm, link, budget, pol, runs, hw, workload, variant, settings_of.get(variant)),
               provenance=prov, shard=list(shard), max_new_tokens=asked[0] if len(asked) == 1 else asked)
    rec["raw"]["units"] = units.get(key, [])
    return rec


def _shape_name(cfg: dict) -> str:
    return cfg.get("shape") if cfg["timing"] == "modeled" else "native"


def _write_partial(out: Path, cfg: dict, desc: str, lm, per: dict, hw, prov: dict, settings_of: dict, units: dict,
                   shard: tuple[int, int], max_new_of: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    from spice_core.timing.profiles import get_profile

    recs = [_record(cfg, desc, lm, key, runs, hw, settings_of, units, shard, max_new_of, prov)
            for key, runs in per.items()]
    _add_floors(recs, lm, hw or get_profile(cfg.get("profile") or RunSettings().profile), cfg)   # merge needs them
    (out / "results.partial.json").write_text(json.dumps(recs, indent=1, default=float))


def _progress(done: int, total: int, t0: float, label: str) -> None:
    width = 30
    filled = int(width * done / max(1, total))
    eta = (time.time() - t0) / max(1, done) * (total - done)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<32} eta {eta:5.0f}s")
    sys.stderr.flush()


def _aggregate(cfg, desc, lm, link, budget, pol, runs, hw, workload: str = "prompts", variant: str = "",
               settings: dict | None = None) -> dict:
    """One record; ``settings``: the thresholds its block ran with (default: the config's)."""
    from spice_core.tools.bench_records import derive, raw_from_runs

    settings = settings or {k: cfg.get(k, d) for k, d in SETTING_DEFAULTS.items()}
    raw = raw_from_runs(runs)
    return {
        "model": desc, "policy": pol, "budget_frac": budget, "link": link, "timing": cfg["timing"],
        "workload": workload, "variant": variant,
        "profile": run_profile_label(hw, cfg.get("profile"), cfg["timing"]), "shape": _shape_name(cfg),
        **derive(raw),
        "settings": settings,
        "ppl_delta_pct": 0.0 if pol in EXACT_POLICIES or float(settings["tau_approx"]) == 0 else None,
        "notes": sorted({n for *_, summary in runs for n in summary.notes}),
        "raw": raw,
    }


def _add_floors(records: list[dict], lm, prof, cfg) -> None:
    """Physical floors (bench_records.add_floors, add_three_lane_floor), after filling in what they need."""

    if cfg["timing"] == "modeled":
        from spice_core.timing.profiles import get_shape
        shape = cfg.get("shape") or DEFAULT_SHAPE
        expert_bytes = lm.layout.nbytes if shape == NATIVE_SHAPE else get_shape(shape).expert_bytes
    else:
        expert_bytes = lm.layout.nbytes
    for r in records:
        if r["policy"] == "transformers_generate":
            continue
        r["routed_bytes_per_token"] = lm.top_k * len(lm.moe_layers) * expert_bytes
        r["link_gbps"] = LINKS_GBPS.get(r["link"]) or prof.h2d_pinned_gbps
        r["copy_bytes"] = lm.expert_bytes      # one copy, as bytes_per_token counts it: `bench --merge` floors again
    add_floors(records, lm.expert_bytes)
    add_three_lane_floor(records, expert_bytes, expert_bytes / (prof.cpu_mem_gbps * 1e6) if prof.cpu_mem_gbps else None,
                         prof.host_dram_gbps or None, copy_bytes=lm.expert_bytes)


def write_figures(records: list[dict], out: Path) -> list[Path]:
    """TPOT per policy (bars, one group per link and budget) with the physical floor, as plotly HTML
    (and PNG where a static image backend works). Plotly is imported lazily: GPU machines
    without it still write results.json / results.md."""
    try:
        import plotly.graph_objects as go
    except ImportError:
        log.warning("plotly is not installed: skipping figures (re-render later with bench --replot DIR)")
        return []
    rows = [r for r in records if r.get("tpot_ms_median") is not None and r["policy"] in POLICIES
            and r.get("workload", "prompts") == "prompts"]
    groups = sorted({(r["link"], r["budget_frac"]) for r in rows})
    fig = go.Figure()
    for link, budget in groups:
        rs = sorted((r for r in rows if (r["link"], r["budget_frac"]) == (link, budget)),
                    key=lambda r: POLICIES.index(r["policy"]))
        fig.add_bar(name=f"{link}, budget {budget:.0%}", x=[r["policy"] for r in rs],
                    y=[r["tpot_ms_median"] for r in rs],
                    error_y=dict(type="data", symmetric=False,
                                 array=[(r["tpot_ms_p90"] or r["tpot_ms_median"]) - r["tpot_ms_median"] for r in rs]),
                    customdata=[[r.get("hit_rate"), r.get("floor_ms")] for r in rs],
                    hovertemplate="%{x}: %{y:.1f} ms (p90 bar)<br>hit rate %{customdata[0]:.3f}"
                                  "<br>floor %{customdata[1]:.1f} ms<extra></extra>")
        floor = [r.get("floor_ms") for r in rs]
        if any(f is not None for f in floor):
            fig.add_scatter(name=f"physical floor ({link})", x=[r["policy"] for r in rs], y=floor, mode="markers",
                            marker=dict(symbol="line-ew-open", size=28))
    timing = rows[0]["timing"] if rows else ""
    fig.update_layout(barmode="group", yaxis_title=f"TPOT median, ms ({timing})", xaxis_title="policy",
                      legend=dict(orientation="h", y=-0.25), margin=dict(t=30))
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "tpot.html"]
    fig.write_html(paths[0], include_plotlyjs="cdn")
    try:
        fig.write_image(out / "tpot.png", width=1100, height=550)
        paths.append(out / "tpot.png")
    except Exception as e:  # noqa: BLE001 - static export needs kaleido and a browser; optional
        log.warning("no PNG written (%s): the HTML figure has the same data", e)
    return paths


def add_cli(sub) -> None:
    from spice_core.tools import args as ca

    p = sub.add_parser("bench", help="compare policies in one run (see docs/benchmarks/)")
    p.add_argument("--config", type=ca.path, default=None)
    p.add_argument("--out", type=ca.path, required=True)
    p.add_argument("--replot", action="store_true", help="only re-render figures from OUT/results.json")
    p.add_argument("--device", type=ca.device, default=None)
    p.add_argument("--hw-profile", type=ca.path, default=None, help="profile JSON from calibrate-hw (measured mode)")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="run only prompts k, k+n, k+2n, ... (e.g. one process per GPU); combine with --merge")
    p.add_argument("--merge", type=ca.path, nargs="+", default=None, metavar="DIR",
                   help="merge the results.json of shard runs into OUT (no model is loaded)")
    p.set_defaults(func=run)


def _parse_shard(text: str | None) -> tuple[int, int]:
    if text is None:
        return 0, 1
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ConfigError(f"--shard {text!r}: use K/N with integers, e.g. 0/2") from None
    if not (n >= 1 and 0 <= k < n):
        raise ConfigError(f"--shard {text}: need 0 <= K < N")
    return k, n


def run(args) -> int:
    from spice_core.user_files import check_writable_dir

    mode = "--replot" if args.replot else "--merge" if args.merge else None
    given = [flag for flag, v in (("--merge", args.replot and args.merge), ("--config", args.config),
                                  ("--shard", args.shard), ("--hw-profile", args.hw_profile), ("--device", args.device))
             if v]
    if mode and given:          # they run nothing: a flag for a run would be ignored without a word
        raise ConfigError(f"{mode} runs no benchmark, so {' and '.join(given)} would do nothing: drop "
                          f"{'it' if len(given) == 1 else 'them'}")
    if args.replot:
        path = args.out / "results.json"
        if not path.exists():
            raise ConfigError(f"--replot: {path} does not exist: run the benchmark first")
        for p in write_figures(load_results(path, "--replot"), args.out):
            print(p)
        return 0
    check_writable_dir(args.out, "--out")
    if args.merge:
        records = merge_folders(args.merge, args.out)
        write_figures(records, args.out)
        print(markdown_table(records, {"timing": records[0]["timing"] if records else "measured"}))
        return 0
    if args.config is None:
        raise ConfigError("--config FILE is required (or --replot to re-render figures, --merge to combine shards)")
    shard = _parse_shard(args.shard)
    cfg = _load_config(args.config)
    hw_path = args.hw_profile or cfg.get("hw_profile")
    if hw_path is not None:
        from spice_core.timing.profile_file import profile_from_file
        # a missing or broken profile fails before the model is built, naming where it was given
        profile_from_file(hw_path, "--hw-profile" if args.hw_profile else f"{args.config} \"hw_profile\"")
    records = run_bench(cfg, args.out, args.device, args.hw_profile, shard=shard)
    write_figures(records, args.out)
    print(markdown_table(records, cfg))
    return 0
