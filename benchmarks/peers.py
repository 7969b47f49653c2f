"""Peers: what users run today, measured on the same machine, model, prompts and GPU budget as `bench`.

    python benchmarks/peers.py --config CONFIG.json --out DIR [--peers ROW[,ROW...]] [--prompts N]
        [--max-new-tokens N] [--offload-prompts N] [--offload-max-new-tokens N] [--no-agreement]

Rows (a record's "policy" is ``peer_<row>``, its "peer" the row):
  hf_resident_eager    stock transformers, every routed expert on the GPU, its default experts implementation
                       (grouped_mm where it dispatches), a DynamicCache; budget_frac 1.0.
  hf_resident_static   the same with experts_implementation "batched_mm" and a StaticCache (no CUDA graphs).
  hf_offload           stock transformers with accelerate's `dispatch_model`: the routed experts of the MoE
                       layers beyond the GPU budget on the CPU, everything else on the GPU; one record per budget
                       of the config. accelerate copies an offloaded layer's whole experts to the GPU at every
                       forward, seconds a token, so it measures fewer tokens (2 prompts x 8 tokens by default).
                       Without accelerate the row is skipped with one line.

    config (bench's) ─► prompts (bench's loading) ─► whole model on the GPU (bench.build_model)
      ─► resident rows, interleaved per prompt ─► offload row per budget (dispatch_model, undone after)
      ─► the engine's `resident` on the same prompts (optional) ─► greedy agreement ─► DIR/results.json

Each row decodes greedily in a plain loop (prefill, then one token a step, stopping at EOS as the engine
does). A step's time is the wall time from one delivered token to the next (the token's readback plus
torch.cuda.synchronize); the first token is excluded and reported as TTFT: bench's measured TPOT.

Records are bench's (bench_records.derive over a "raw" of every step), so `bench --merge BENCH PEERS`
combines them with a bench run of the same model; peers carry their own provenance (the config with these
overrides, their prompts, the engine's code and this file), which merge compares among peers only. Hit
rate, misses and bytes copied follow from the placement, not from counting: a selection in a GPU layer is a
hit, one in an offloaded layer a copy, and an offloaded layer's whole experts cross the link each token.
Floors are left to merge (they need bench's `resident`). Only the "prompts" workload and the native link run
here; the config's policies, links and run blocks are ignored. The engine is used only for the agreement's
`resident` tokens.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the package without installing it

from spice_core.api import MAX_NEW_TOKENS_LIMIT, greedy_agreement  # noqa: E402
from spice_core.errors import ConfigError, SpiceError  # noqa: E402
from spice_core.heldout import DEFAULT_PROMPTS  # noqa: E402
from spice_core.tools import args as ca  # noqa: E402
from spice_core.tools.bench_config import LINKS_GBPS, load_config_file  # noqa: E402
from spice_core.tools.bench_records import derive, provenance  # noqa: E402

OFFLOAD_PROMPTS, OFFLOAD_TOKENS = 2, 8
WARMUP_TOKENS = 2


@dataclass(frozen=True)
class Row:
    name: str
    experts_implementation: str | None      # None: transformers' default
    static_cache: bool
    offload: bool


ROWS = {r.name: r for r in (Row("hf_resident_eager", None, False, False),
                            Row("hf_resident_static", "batched_mm", True, False),
                            Row("hf_offload", None, False, True))}


# ---------------------------------------------------------------- placement (pure: a model's module tree in)
@dataclass(frozen=True)
class MoeExperts:
    layer: int
    module: str              # "model.layers.3.mlp.experts"
    nbytes: int              # its routed experts' weights
    n_experts: int


def moe_experts(model) -> list[MoeExperts]:
    """The fused routed-experts module of every MoE layer, in layer order (meta tensors count too)."""
    out = []
    for name, mod in model.named_modules():
        if name.endswith("mlp.experts"):
            nbytes = sum(p.numel() * p.element_size() for p in mod.parameters())
            out.append(MoeExperts(int(name.split(".")[-3]), name, nbytes, int(mod.gate_up_proj.shape[0])))
    return sorted(out, key=lambda e: e.layer)


@dataclass(frozen=True)
class OffloadPlan:
    """The MoE layers whose routed experts stay on the GPU under a budget (a fraction of all routed-expert
    bytes): whole layers from the first while they fit, as accelerate's infer_auto_device_map fills a device
    in module order; the rest go to the CPU."""

    budget_frac: float
    budget_bytes: int
    gpu: tuple[MoeExperts, ...]
    cpu: tuple[MoeExperts, ...]

    @property
    def gpu_bytes(self) -> int:
        return sum(e.nbytes for e in self.gpu)

    @property
    def cpu_bytes(self) -> int:
        return sum(e.nbytes for e in self.cpu)

    def summary(self) -> dict:
        return {"budget_bytes": self.budget_bytes, "gpu_moe_layers": [e.layer for e in self.gpu],
                "cpu_moe_layers": [e.layer for e in self.cpu], "gpu_routed_bytes": self.gpu_bytes,
                "cpu_routed_bytes": self.cpu_bytes}


def plan_offload(experts: list[MoeExperts], budget_frac: float) -> OffloadPlan:
    budget = round(budget_frac * sum(e.nbytes for e in experts))
    n, used = 0, 0
    while n < len(experts) and used + experts[n].nbytes <= budget:
        used += experts[n].nbytes
        n += 1
    return OffloadPlan(budget_frac, budget, tuple(experts[:n]), tuple(experts[n:]))


def offload_device_map(model, cpu_modules: set[str], gpu: int | str) -> dict[str, int | str]:
    """accelerate's device_map: each of ``cpu_modules`` on "cpu", everything else on ``gpu``, in as few
    entries as can be (a module holding no CPU module is one entry), every weight covered once."""
    out: dict[str, int | str] = {}

    def place(prefix: str, module) -> None:
        if prefix in cpu_modules:
            out[prefix] = "cpu"
            return
        if not any(not prefix or c.startswith(prefix + ".") for c in cpu_modules):
            out[prefix] = gpu
            return
        if list(module.parameters(recurse=False)) or list(module.buffers(recurse=False)):
            raise ConfigError(f"{prefix or 'the model'} holds weights of its own beside an offloaded module: "
                              "this model cannot be placed layer by layer")
        for name, child in module.named_children():
            place(f"{prefix}.{name}" if prefix else name, child)

    place("", model)
    unknown = sorted(cpu_modules - set(out))
    if unknown:
        raise ConfigError(f"offload: no module named {unknown[0]} in the model")
    return out


# ---------------------------------------------------------------- decoding
@dataclass
class Generation:
    tokens: list[int]
    step_ms: list[float]          # decode steps, the first token excluded
    ttft_ms: float
    gpu_peak_bytes: int


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_cache(model, static: bool, max_len: int):
    from transformers import DynamicCache, StaticCache

    return StaticCache(config=model.config, max_cache_len=max_len) if static else DynamicCache(config=model.config)


def default_experts_implementation(model) -> str:
    """What transformers resolved the experts implementation to when none was asked for."""
    current = getattr(model.config, "_experts_implementation", None)
    if current is None and hasattr(model, "get_correct_experts_implementation"):
        current = model.get_correct_experts_implementation(None)
    return current or "eager"


def eos_ids(model, tokenizer) -> set[int]:
    """The engine's stop tokens (run._eos_ids) for this model and tokenizer."""
    from spice_core.run import _eos_ids

    return _eos_ids(SimpleNamespace(model=model, tokenizer=tokenizer))


@torch.no_grad()
def greedy_timed(model, ids: list[int], max_new: int, cache, eos: set[int], device: torch.device) -> Generation:
    """Greedy tokens of ``ids`` in a plain loop over ``cache``, each step timed from the previous token's
    delivery to this one's. Positions are passed explicitly (cache_position too where the forward takes it:
    transformers 5.17 does, 5.24 does not)."""
    from spice_core.model.loader import cache_kwarg

    params = inspect.signature(model.forward).parameters
    cache_kw, with_cache_position = cache_kwarg(model), "cache_position" in params

    def next_token(x: torch.Tensor, start: int) -> int:
        pos = torch.arange(start, start + x.shape[1], device=device)
        kw = {cache_kw: cache, "position_ids": pos.view(1, -1), "use_cache": True}
        if with_cache_position:
            kw["cache_position"] = pos
        tok = int(model(input_ids=x, **kw).logits[0, -1].argmax())     # the readback delivers the token
        _sync(device)
        return tok

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _sync(device)
    t = time.perf_counter()
    tok = next_token(torch.tensor([ids], device=device), 0)
    ttft = (time.perf_counter() - t) * 1e3
    tokens, steps = [tok], []
    while len(tokens) < max_new and tok not in eos:
        t = time.perf_counter()
        tok = next_token(torch.tensor([[tok]], device=device), len(ids) + len(tokens) - 1)
        steps.append((time.perf_counter() - t) * 1e3)
        tokens.append(tok)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return Generation(tokens, steps, ttft, peak)


@contextmanager
def accelerate_offload(model, plan: OffloadPlan, gpu: int):
    """The model dispatched by accelerate with ``plan.cpu`` offloaded (moved to host memory first, so
    accelerate's weights map holds host tensors); on exit the hooks go and those experts return to the GPU."""
    from accelerate import dispatch_model
    from accelerate.hooks import remove_hook_from_submodules

    cpu = [e.module for e in plan.cpu]
    for name in cpu:
        model.get_submodule(name).to("cpu")
    torch.cuda.empty_cache()
    skip = getattr(model, "_skip_keys_device_placement", None)        # the cache: as from_pretrained dispatches
    dispatch_model(model, device_map=offload_device_map(model, set(cpu), gpu), skip_keys=list(skip) if skip else None)
    try:
        yield
    finally:
        remove_hook_from_submodules(model)       # puts the offloaded weights back on the CPU
        for name in cpu:
            model.get_submodule(name).to(torch.device("cuda", gpu))
        model.__dict__.pop("hf_device_map", None)
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- records
def peer_record(row: str, budget_frac: float, gens: list[Generation], agreements: list[float], *, model: str,
                experts: list[MoeExperts], top_k: int, plan: OffloadPlan | None, link_gbps: float | None,
                prov: dict, setup: dict) -> dict:
    """One peer row as a bench record (bench_records.derive over its raw data)."""
    n_steps = sum(len(g.step_ms) for g in gens)
    n_moe = len(experts)
    gpu_layers = n_moe if plan is None else len(plan.gpu)
    raw = {"step_ms": [ms for g in gens for ms in g.step_ms], "ttft_ms": [g.ttft_ms for g in gens],
           "selections": n_steps * top_k * n_moe, "hits": n_steps * top_k * gpu_layers,
           "bytes": n_steps * (plan.cpu_bytes if plan else 0), "stall_ms": 0.0,
           "miss_split": {"approx": 0, "cpu": 0, "copy": n_steps * top_k * (n_moe - gpu_layers)},
           "wasted_prefetch_bytes": 0, "agreements": list(agreements),
           "gpu_peak_bytes": max((g.gpu_peak_bytes for g in gens), default=0), "n_runs": len(gens), "device_ms": []}
    notes = ["peer: stock transformers, greedy plain loop; TPOT is wall time per delivered token"]
    if plan is not None:
        notes.append("hit rate, copies and bytes follow from the placement: accelerate copies each offloaded "
                     "layer's whole experts to the GPU at every forward")
    expert_bytes = experts[0].nbytes // experts[0].n_experts if experts else 0
    return {"model": model, "policy": f"peer_{row}", "peer": row, "budget_frac": budget_frac, "link": "native",
            "timing": "measured", "workload": "prompts", "variant": "", "profile": None, "shape": None,
            **derive(raw), "ppl_delta_pct": None, "notes": notes, "raw": raw, "provenance": prov,
            "routed_bytes_per_token": top_k * n_moe * expert_bytes, "link_gbps": link_gbps,
            "peer_setup": dict(setup, offload=plan.summary() if plan else None)}


def markdown(records: list[dict]) -> str:
    def f(v, fmt=".1f"):
        return "–" if v is None else format(v, fmt)

    lines = ["| peer | budget | runs × tokens | TPOT median ms | p90 | tokens/s | TTFT ms | GB copied/token | "
             "GPU peak GB | greedy agr. | experts impl. | cache |", "|" + "---|" * 12]
    for r in records:
        s = r["peer_setup"]
        lines.append(f"| {r['policy']} | {r['budget_frac']:.0%} | {r['n_runs']} × {s['max_new_tokens']} | "
                     f"{f(r['tpot_ms_median'])} | {f(r['tpot_ms_p90'])} | {f(r['tokens_per_s'])} | "
                     f"{f(r['ttft_ms_median'])} | {r['bytes_per_token'] / 1e9:.2f} | "
                     f"{f((r['gpu_peak_mb'] or 0) / 1e3)} | {f(r['greedy_agreement'], '.3f')} | "
                     f"{s['experts_implementation']} | {s['cache']} |")
    return "timing: **measured** (wall clock, one GPU); model: " + (records[0]["model"] if records else "") + \
        "\n\n" + "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the run
@dataclass(frozen=True)
class Options:
    rows: tuple[Row, ...]
    prompts: int                  # the first N of the config's prompts
    max_new_tokens: int
    offload_prompts: int
    offload_max_new_tokens: int
    agreement: bool


def config_prompt_count(cfg: dict) -> int:
    """How many prompts the config's "prompts" makes (bench's forms: a list, {"heldout": N}, {"random_ids": N})."""
    p = cfg.get("prompts", list(DEFAULT_PROMPTS))
    if isinstance(p, dict):
        return int(p.get("heldout", p.get("random_ids", 8)))
    return len(p)


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "accelerate"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _this_file_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:8]


def run_peers(cfg: dict, opts: Options, out: Path, device: torch.device | None = None) -> list[dict]:
    """Every row of ``opts`` on the config's model; ``device`` is the current GPU unless a test passes the CPU
    (the offload row needs a GPU)."""
    from spice_core.api import RunSettings
    from spice_core.timing.profile_file import profile_from_file
    from spice_core.timing.profiles import get_profile
    from spice_core.tools.bench import _prompt_ids, build_model, code_digest, model_folder

    device = device or torch.device("cuda", torch.cuda.current_device())
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    t0 = time.time()
    hf, tok, desc = build_model(cfg["model"], str(device), cfg.get("lift_overrides"))
    hf.eval()
    print(f"peers: {desc} whole on {gpu_name} in {time.time() - t0:.0f} s", file=sys.stderr)
    prompts = _prompt_ids(cfg, tok, hf.config.vocab_size, model_folder(cfg["model"]))[:opts.prompts]
    ctx = int(getattr(hf.config, "max_position_embeddings", 0) or 0)
    experts, top_k, eos = moe_experts(hf), int(hf.config.num_experts_per_tok), eos_ids(hf, tok)
    default_impl = default_experts_implementation(hf)
    prof = profile_from_file(cfg["hw_profile"]) if cfg.get("hw_profile") else \
        get_profile(cfg.get("profile", RunSettings().profile))
    link_gbps = LINKS_GBPS["native"] or prof.h2d_pinned_gbps        # what bench gives the native link's floor
    settings = {k: getattr(opts, k) for k in ("prompts", "max_new_tokens", "offload_prompts", "offload_max_new_tokens")}
    prov = provenance(dict(cfg, peers=[r.name for r in opts.rows], **settings), prompts,
                      f"{code_digest()}+{_this_file_digest()}")
    versions = _versions()
    runs: dict[tuple[str, float], tuple[list[Generation], OffloadPlan | None, dict]] = {}

    def use(row: Row) -> dict:
        hf.set_experts_implementation(row.experts_implementation or default_impl)
        return {"experts_implementation": getattr(hf.config, "_experts_implementation", None),
                "cache": "StaticCache" if row.static_cache else "DynamicCache", "versions": versions, "gpu": gpu_name}

    def decode(row: Row, ids: list[int], max_new: int) -> Generation:
        n = min(max_new, ctx - len(ids)) if ctx else max_new
        if n < 1:
            raise ConfigError(f"a prompt of {len(ids)} tokens leaves no room in the model's context of {ctx}")
        return greedy_timed(hf, ids, n, make_cache(hf, row.static_cache, len(ids) + n), eos, device)

    def records(agreements: dict | None = None) -> list[dict]:
        return [peer_record(row, budget, gens, (agreements or {}).get((row, budget), []), model=desc, experts=experts,
                            top_k=top_k, plan=plan, link_gbps=link_gbps, prov=prov, setup=setup)
                for (row, budget), (gens, plan, setup) in runs.items()]

    def save_partial() -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.partial.json").write_text(json.dumps(records(), indent=1, default=float))

    resident = [r for r in opts.rows if not r.offload]
    for row in resident:                     # warm-up: kernels picked, lazy initialisation done
        runs[(row.name, 1.0)] = ([], None, dict(use(row), prompts=len(prompts), max_new_tokens=opts.max_new_tokens))
        decode(row, prompts[0], WARMUP_TOKENS)
    for i, ids in enumerate(prompts):        # interleaved per prompt, as bench runs its policies
        for row in resident:
            use(row)
            gens = runs[(row.name, 1.0)][0]
            gens.append(decode(row, ids, opts.max_new_tokens))
            _progress(row.name, 1.0, i, len(prompts), gens[-1])
        save_partial()
    if any(r.offload for r in opts.rows):
        row, some = ROWS["hf_offload"], prompts[:opts.offload_prompts]
        for budget in [float(b) for b in cfg.get("budgets", [0.25])]:
            plan = plan_offload(experts, budget)
            print(f"peers: hf_offload at {budget:.0%}: MoE layers {[e.layer for e in plan.cpu]} on the CPU "
                  f"({plan.cpu_bytes / 1e9:.1f} GB), {len(plan.gpu)} on the GPU", file=sys.stderr)
            setup = dict(use(row), prompts=len(some), max_new_tokens=opts.offload_max_new_tokens)
            gens = runs.setdefault((row.name, budget), ([], plan, setup))[0]
            with accelerate_offload(hf, plan, device.index):
                decode(row, some[0], WARMUP_TOKENS)
                for i, ids in enumerate(some):
                    gens.append(decode(row, ids, opts.offload_max_new_tokens))
                    _progress(row.name, budget, i, len(some), gens[-1])
            save_partial()
    agreements = None
    if opts.agreement:
        longest = max(opts.max_new_tokens, opts.offload_max_new_tokens)
        ref = resident_tokens(hf, tok, desc, device, prompts, longest, cfg)     # consumes hf's experts: last
        agreements = {key: [greedy_agreement(ref[i][:setup["max_new_tokens"]], g.tokens) for i, g in enumerate(gens)]
                      for key, (gens, _, setup) in runs.items()}
    recs = records(agreements)
    (out / "results.json").write_text(json.dumps(recs, indent=1, default=float))
    (out / "results.md").write_text(markdown(recs))
    return recs


def _progress(row: str, budget: float, i: int, n: int, g: Generation) -> None:
    ms = sorted(g.step_ms)
    print(f"peers: {row} {budget:.0%} prompt {i + 1}/{n}: {len(g.tokens)} tokens, TPOT median "
          f"{ms[len(ms) // 2] if ms else float('nan'):.1f} ms", file=sys.stderr)


def resident_tokens(hf, tok, desc: str, device: torch.device, prompts: list[list[int]], max_new: int,
                    cfg: dict) -> list[list[int]]:
    """The engine's `resident` tokens on ``prompts`` (the agreement's reference, as in bench). `offload_model`
    moves hf's fused experts into host memory, so this runs after every peer."""
    from spice_core.api import RunSettings
    from spice_core.engine import SpiceEngine
    from spice_core.model.loader import offload_model

    lm = offload_model(hf, device, tokenizer=tok, path=Path(desc))
    eng = SpiceEngine(lm, timing="measured" if device.type == "cuda" else "modeled")     # the tokens are the same
    s = RunSettings(policy="resident", cache_frac=float(cfg.get("budgets", [0.25])[0]), max_new_tokens=max_new,
                    profile=cfg.get("profile", RunSettings().profile))
    out = []
    for ids in prompts:
        out.append([st.token_id for st in eng.start_ids(ids, s)])
    print(f"peers: the engine's resident on {len(prompts)} prompts for the agreement", file=sys.stderr)
    return out


# ---------------------------------------------------------------- command line
def _rows(text: str) -> tuple[Row, ...]:
    import argparse

    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in ROWS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{bad[0] if bad else repr(text)} is not a peer: choose from "
                                         f"{', '.join(ROWS)} (comma-separated)")
    return tuple(r for name, r in ROWS.items() if name in names)


def parser() -> ca.SpiceArgumentParser:
    p = ca.SpiceArgumentParser(prog="benchmarks/peers.py", description=__doc__.splitlines()[0])
    p.add_argument("--config", type=ca.existing_file, required=True, help="a bench config (its model, prompts, "
                   "max_new_tokens, budgets and profile are read)")
    p.add_argument("--out", type=Path, required=True, help="folder for results.json and results.md")
    p.add_argument("--peers", type=_rows, default=tuple(ROWS.values()), help=f"rows, of {', '.join(ROWS)}")
    p.add_argument("--prompts", type=ca.int_in(1), default=None, help="the first N of the config's prompts")
    p.add_argument("--max-new-tokens", type=ca.int_in(1, MAX_NEW_TOKENS_LIMIT), default=None)
    p.add_argument("--offload-prompts", type=ca.int_in(1), default=OFFLOAD_PROMPTS)
    p.add_argument("--offload-max-new-tokens", type=ca.int_in(2, MAX_NEW_TOKENS_LIMIT), default=OFFLOAD_TOKENS)
    p.add_argument("--no-agreement", action="store_true", help="skip the engine's resident run (greedy agreement)")
    return p


def options(args, cfg: dict) -> Options:
    """The run's options from the flags and the config, or a ConfigError naming the flag."""
    if cfg.get("timing", "measured") != "measured":
        raise ConfigError(f"--config {args.config}: \"timing\" is {cfg['timing']!r}: peers are measured only: "
                          "drop the key or set it to \"measured\"")
    have = config_prompt_count(cfg)
    n = args.prompts or have
    if n > have:
        raise ConfigError(f"--prompts {n}: the config makes {have} prompts: ask for at most {have}")
    max_new = args.max_new_tokens or int(cfg.get("max_new_tokens", 64))
    return Options(rows=args.peers, prompts=n, max_new_tokens=max_new, offload_prompts=min(args.offload_prompts, n),
                   offload_max_new_tokens=args.offload_max_new_tokens, agreement=not args.no_agreement)


def main(argv: list[str] | None = None) -> int:
    from spice_core.user_files import check_writable_dir

    try:
        args = parser().parse_args(argv)
        cfg = load_config_file(args.config)
        opts = options(args, cfg)
        check_writable_dir(args.out, "--out")
        if not torch.cuda.is_available():
            raise ConfigError("peers needs a CUDA GPU: it measures wall time per token on the GPU, and torch sees "
                              "none here: run it on the GPU machine")
        if any(r.offload for r in opts.rows) and importlib.util.find_spec("accelerate") is None:
            print("peers: accelerate is not installed: skipping hf_offload", file=sys.stderr)
            opts = replace(opts, rows=tuple(r for r in opts.rows if not r.offload))
            if not opts.rows:
                raise ConfigError("--peers: nothing left to measure without accelerate: install it or ask for "
                                  "hf_resident_eager / hf_resident_static")
        records = run_peers(cfg, opts, args.out)
    except SpiceError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(markdown(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
