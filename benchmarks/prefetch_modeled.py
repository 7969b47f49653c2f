"""TPOT of the prefetching policies against the baselines, per hardware profile and cache budget.

    python benchmarks/prefetch_modeled.py [--model assets/spice-mini] [--shape deepseek-v2-lite]
        [--profiles rtx4090-pcie4x16 h200-pcie5x16] [--budgets 0.1 0.25 0.5] [--prompts 8]
        [--max-new-tokens 128] [--tau-prefetch 0.2] [--max-lookahead 4] [--sweep]
        [--timing modeled|measured] [--device cpu|cuda] [--out docs/benchmarks/prefetch_modeled.md]
    python benchmarks/prefetch_modeled.py --render docs/benchmarks/prefetch_modeled_h200-pcie5x16.json \
        --out docs/benchmarks/prefetch_modeled_h200-pcie5x16.md      # the report again from a run's JSON

Protocol (BENCHMARK.md): batch 1, greedy, held-out prompts; for every profile, budget and
prompt the policies run back to back (interleaved). With ``--timing modeled`` (the default)
the engine runs the shipped model exactly and the timing model replays its decisions as if
each expert had the ``--shape``'s size on the ``--profile``'s hardware; the numbers are then
deterministic, so one repetition suffices. ``--timing measured --device cuda`` times the
same runs with CUDA events on the GPU it runs on; ``--profiles`` is then ignored (the
policies decide with ``--hw-profile FILE``, a profile written by ``calibrate-hw``, or the
h200-pcie5x16 profile), ``--link-gbps 13`` emulates the paper's PCIe 4.0 x8 link, and
``--repetitions 3`` is the protocol.

Per policy: TPOT median / p90 over all decode steps of all prompts (first token excluded),
hit rate, experts copied and wasted per token (prefetched, evicted unused), stall ms per
token, mean lookahead depth and why it stopped, predictor (draft) ms per token, and the
physical floor max(compute, experts carried per token x expert bytes / bandwidth), where the
experts a token carried are those it copied less the prefetches evicted unused (`floor_ms`: a
prefetch hit crossed the link too, only earlier). The headline: the share of the lru ->
oracle_prefetch TPOT gap that each predictor closes. Every exact policy must produce the same
tokens as lru (checked, reported). ``--render FILE.json`` writes the report again from a run's
JSON without running anything (the command kept is the one that made the numbers).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))      # bench_args, when imported from elsewhere

import bench_args  # noqa: E402
from spice_core.api import MAX_NEW_TOKENS_LIMIT, SETTING_RANGES, RunSettings  # noqa: E402
from spice_core.api import POLICIES as ENGINE_POLICIES  # noqa: E402
from spice_core.engine import SpiceEngine  # noqa: E402
from spice_core.model.loader import load_model  # noqa: E402
from spice_core.errors import ConfigError, SpiceError  # noqa: E402
from spice_core.timing.profiles import get_profile, get_shape, profile_names, shape_names  # noqa: E402
from spice_core.tools import args as ca  # noqa: E402

POLICIES = ("on_demand", "lru", "gate_prefetch", "spice_prefetch", "oracle_prefetch")
SWEEP_TAUS = (0.05, 0.2, 0.5, 0.8)
SWEEP_DEPTHS = (2, 4, 8)


def heldout_prompts(lm, n: int) -> list[list[int]]:
    """Prompt token ids: openings of held-out stories and held-out chat requests (the eval half
    of the shipped model's held-out split), else the engine bench's default prompts."""
    from spice_core.predictor.traces import is_shipped_model

    from spice_core.generation import build_prompt_ids

    tok = lm.tokenizer
    out: list[list[int]] = []
    if is_shipped_model(lm):
        try:
            from training.stories import generate_chat_story, generate_story
            from training.corpus import VALIDATION_SEED_BASE
        except ImportError:
            generate_story = None
        if generate_story is not None:
            for i in range(n):
                seed = VALIDATION_SEED_BASE + 2 * i + 1          # odd held-out seeds: the eval half
                if i % 3 == 2:     # a chat request through the chat template, as the app sends it
                    request = generate_chat_story(seed + 10**9).request.text
                    out.append(build_prompt_ids(tok, messages=[{"role": "user", "content": request}]))
                else:              # the first two sentences of a held-out story
                    text = ".".join(generate_story(seed).text.split(".")[:2]) + "."
                    out.append(build_prompt_ids(tok, prompt=text))
    if not out:
        from spice_core.heldout import DEFAULT_PROMPTS
        out = [build_prompt_ids(tok, prompt=DEFAULT_PROMPTS[i % len(DEFAULT_PROMPTS)]) for i in range(n)]
    return out


class _Capture:
    """Wraps engine.build_runtime to keep the runtime, whose recorder holds the
    lookahead stop reasons and H_min the StepStats do not carry."""

    def __init__(self, engine):
        self.rt = None
        self._orig = engine.build_runtime

        def build(*a, **k):
            self.rt = self._orig(*a, **k)
            return self.rt
        engine.build_runtime = build


def run_one(engine, cap, ids, settings) -> dict:
    run = engine.start_ids(ids, settings)
    steps, reasons, hmins = [], Counter(), []
    for st in run:
        steps.append(st)
        if st.index >= 1 and cap.rt is not None:
            reasons.update(cap.rt.recorder.token.stop_reasons)
            hmins.extend(h for h in cap.rt.recorder.token.h_mins if h >= 0)
    rec = engine.get_record(run.run_id)
    dec = steps[1:] if len(steps) > 1 else steps
    draft_ms = [sum(iv.end_ms - iv.start_ms for iv in st.intervals if iv.kind == "draft") for st in dec]
    return {"tokens": rec.token_ids, "step_ms": [st.step_ms for st in dec], "ttft_ms": steps[0].step_ms,
            "hits": sum(st.hits for st in dec), "misses": sum(st.misses for st in dec),
            "copied": sum(st.bytes_copied for st in dec), "stall_ms": [st.stall_ms for st in dec],
            "depth": [st.lookahead_depth for st in dec], "draft_ms": draft_ms, "n_dec": len(dec),
            "wasted_bytes": rec.totals.get("wasted_prefetch_bytes", 0), "n_all": len(steps),
            "reasons": dict(reasons), "h_min": hmins, "notes": list(run.summary().notes)}


def aggregate(runs: list[dict], native_bytes: int) -> dict:
    steps = [x for r in runs for x in r["step_ms"]]
    n_dec = sum(r["n_dec"] for r in runs)
    sel = sum(r["hits"] + r["misses"] for r in runs)
    reasons = Counter()
    for r in runs:
        reasons.update(r["reasons"])
    q = statistics.quantiles(steps, n=10) if len(steps) > 1 else [steps[0]] * 9
    hm = [h for r in runs for h in r["h_min"]]
    return {"tpot_median_ms": statistics.median(steps), "tpot_p90_ms": q[8],
            "ttft_median_ms": statistics.median(r["ttft_ms"] for r in runs),
            "hit_rate": sum(r["hits"] for r in runs) / sel if sel else 0.0,
            "experts_copied_per_token": sum(r["copied"] for r in runs) / native_bytes / max(1, n_dec),
            "experts_wasted_per_token": sum(r["wasted_bytes"] for r in runs) / native_bytes
            / max(1, sum(r["n_all"] for r in runs)),
            "stall_ms_per_token": sum(sum(r["stall_ms"]) for r in runs) / max(1, n_dec),
            "lookahead_depth": sum(sum(r["depth"]) for r in runs) / max(1, n_dec),
            "stop_reasons": {k: round(v / max(1, sum(reasons.values())), 3) for k, v in sorted(reasons.items())},
            "h_min": statistics.median(hm) if hm else None,
            "draft_ms_per_token": sum(sum(r["draft_ms"]) for r in runs) / max(1, n_dec),
            "notes": sorted({n for r in runs for n in r["notes"]})}


def main(argv=None) -> int:
    ap = bench_args.Parser(prog=bench_args.prog(__file__), description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=bench_args.model, default=str(ROOT / "assets" / "spice-mini"))
    ap.add_argument("--device", type=ca.device, default="cpu")
    ap.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                    help="weights' dtype (float32 runs faster on CPUs; timing is modeled from --shape anyway)")
    ap.add_argument("--timing", default="modeled", choices=("modeled", "measured"))
    ap.add_argument("--shape", type=bench_args.one_of(shape_names(), "shape"), default="deepseek-v2-lite")
    ap.add_argument("--profiles", nargs="+", type=bench_args.one_of(profile_names(), "profile"),
                    default=["rtx4090-pcie4x16", "h200-pcie5x16"])
    ap.add_argument("--budgets", nargs="+", type=ca.float_in(*SETTING_RANGES["cache_frac"]),
                    default=[0.10, 0.25, 0.50])
    ap.add_argument("--policies", nargs="+", type=bench_args.one_of(ENGINE_POLICIES, "policy"), default=list(POLICIES))
    ap.add_argument("--hw-profile", type=ca.existing_file, default=None,
                    help="measured timing: calibrated profile JSON")
    ap.add_argument("--link-gbps", type=ca.positive_float, default=None,
                    help="measured timing: emulate a slower host-to-device link by pacing copies (e.g. 13 for PCIe 4.0 x8)")
    ap.add_argument("--repetitions", type=ca.positive_int, default=1)
    ap.add_argument("--prompts", type=ca.positive_int, default=8)
    ap.add_argument("--max-new-tokens", type=ca.int_in(1, MAX_NEW_TOKENS_LIMIT), default=128)
    ap.add_argument("--tau-prefetch", type=ca.float_in(*SETTING_RANGES["tau_prefetch"]), default=0.2)
    ap.add_argument("--max-lookahead", type=ca.int_in(*SETTING_RANGES["max_lookahead"]), default=4)
    ap.add_argument("--sweep", action="store_true", help="also sweep tau x max-lookahead for the predictors at 25%%")
    ap.add_argument("--sweep-prompts", type=ca.positive_int, default=4)
    ap.add_argument("--sweep-new-tokens", type=ca.int_in(1, MAX_NEW_TOKENS_LIMIT), default=64)
    ap.add_argument("--draft", type=ca.existing_file, default=None,
                    help="a spice-draft.safetensors to use instead of the one beside the model")
    ap.add_argument("--threads", type=ca.threads, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "prefetch_modeled.md")
    ap.add_argument("--render", type=ca.existing_file, default=None,
                    help="write the report again from this run's JSON (run nothing): e.g. after a change of the floor")
    args = ap.parse_args(argv)
    bench_args.check_out_file(ap, args.out, "--out")      # before the run: its results must not be lost at the end
    if args.render is not None:
        return render(args.render, args.out)
    bench_args.check_timing(ap, args.timing, args.device)
    hw = None
    if args.hw_profile is not None:
        from spice_core.timing.profile_file import profile_from_file
        try:
            hw = profile_from_file(args.hw_profile)
        except SpiceError as e:
            ap.error(str(e))
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    dtype = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    lm = load_model(args.model, args.device, dtype=dtype)
    engine = SpiceEngine(lm, timing=args.timing, hw_profile=hw, link_gbps=args.link_gbps)
    if args.timing == "measured":
        args.profiles = [hw.name if hw is not None else "h200-pcie5x16"]
    engine.load_artifacts()
    if args.draft is not None:
        from spice_core.predictor.artifacts import Artifacts, load_draft
        engine.artifacts = engine.artifacts or Artifacts()
        engine.artifacts.draft = load_draft(args.draft, lm)
    cap = _Capture(engine)
    prompts = heldout_prompts(lm, args.prompts)
    shape = get_shape(args.shape, engine.native_shape)
    native = lm.layout.nbytes
    n_moe = len(lm.moe_layers)

    def settings(policy, profile, budget, **kw):
        base = dict(policy=policy, cache_frac=budget, tau_prefetch=args.tau_prefetch,
                    max_lookahead=args.max_lookahead, profile=profile, shape=args.shape,
                    max_new_tokens=args.max_new_tokens, temperature=0.0)
        base.update(kw)
        return RunSettings(**base)

    table, identical = {}, True
    for prof in args.profiles:
        res = [run_one(engine, cap, ids, settings("resident", prof, 1.0)) for ids in prompts]
        table[(prof, "compute")] = aggregate(res, native)
        for budget in args.budgets:
            runs = {p: [] for p in args.policies}
            for _ in range(args.repetitions):
                for ids in prompts:                                # interleaved: every policy per prompt
                    for p in args.policies:
                        runs[p].append(run_one(engine, cap, ids, settings(p, prof, budget)))
                    ref = runs["lru"][-1]["tokens"] if "lru" in runs else None
                    identical &= all(r[-1]["tokens"] == ref for r in runs.values()) if ref else True
            for p in args.policies:
                table[(prof, budget, p)] = aggregate(runs[p], native)
            print(f"{prof} {budget:.0%}: " + ", ".join(
                f"{p} {table[(prof, budget, p)]['tpot_median_ms']:.2f}" for p in args.policies), flush=True)

    sweep = {}
    if args.sweep:
        sp = prompts[: args.sweep_prompts]
        for prof in args.profiles:
            for p in ("lru", "oracle_prefetch"):
                sweep[(prof, p, None, None)] = aggregate(
                    [run_one(engine, cap, ids, settings(p, prof, 0.25, max_new_tokens=args.sweep_new_tokens))
                     for ids in sp], native)
            for p in ("gate_prefetch", "spice_prefetch"):
                for tau in SWEEP_TAUS:
                    for depth in SWEEP_DEPTHS:
                        s = settings(p, prof, 0.25, tau_prefetch=tau, max_lookahead=depth,
                                     max_new_tokens=args.sweep_new_tokens)
                        sweep[(prof, p, tau, depth)] = aggregate([run_one(engine, cap, ids, s) for ids in sp], native)
            print(f"sweep {prof} done", flush=True)

    info = {"model": lm.name, "shape": shape.name, "expert_mb_at_shape": shape.expert_bytes / 1e6,
            "routed_gb_per_token": n_moe * lm.top_k * shape.expert_bytes / 1e9, "timing": args.timing,
            "repetitions": args.repetitions, "prompts": len(prompts), "prompt_tokens": [len(p) for p in prompts], "max_new_tokens": args.max_new_tokens,
            "tau_prefetch": args.tau_prefetch, "max_lookahead": args.max_lookahead, "identical_tokens": identical,
            "has_draft": engine.info().has_draft, "draft_bytes": engine.artifacts.draft.nbytes
            if engine.artifacts and engine.artifacts.draft else 0,
            "environment": {"device": str(lm.device), "dtype": str(lm.layout.dtype), "torch": torch.__version__,
                            "python": platform.python_version(), "threads": torch.get_num_threads()},
            "seconds": round(time.perf_counter() - t0, 1),
            "command": _command(argv if argv is not None else sys.argv[1:]), "profiles": list(args.profiles),
            "budgets": list(args.budgets), "policies": list(args.policies),
            "sweep_prompts": args.sweep_prompts, "sweep_new_tokens": args.sweep_new_tokens}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    dump = {"info": info, "table": {" | ".join(map(str, k)): v for k, v in table.items()},
            "sweep": {" | ".join(map(str, k)): v for k, v in sweep.items()}}
    args.out.with_suffix(".json").write_text(json.dumps(dump, indent=1) + "\n")
    profs = {pr: hw if hw is not None and hw.name == pr else get_profile(pr) for pr in args.profiles}
    args.out.write_text(markdown(info, table, sweep, args, info["command"], profs))
    print(args.out.read_text())
    return 0


def _command(argv) -> str:
    return ("python benchmarks/prefetch_modeled.py " + " ".join(map(str, argv))).strip()


def _key(part: str):
    """One field of a JSON table key back to what it was: a budget or tau (float), a depth (int), None, a name."""
    if part == "None":
        return None
    for kind in (int, float):
        try:
            return kind(part)
        except ValueError:
            pass
    return part


def render(json_path: Path, out: Path) -> int:
    """The report again from a run's JSON (``--render``). The command shown is the run's: kept in its info, or for
    a run from before it was kept, read off the report it wrote (``out``); the ranges of the run come from its
    table's keys, the sweep's size from its info or the parser's defaults the committed runs used."""
    try:
        dump = json.loads(json_path.read_text(encoding="utf-8"))
        info = dump["info"]
        table = {tuple(_key(x) for x in k.split(" | ")): v for k, v in dump["table"].items()}
        sweep = {tuple(_key(x) for x in k.split(" | ")): v for k, v in dump.get("sweep", {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:     # ValueError: bad JSON or UTF-8
        print(f"{json_path}: not a JSON this benchmark wrote (info, table, sweep): {e}", file=sys.stderr)
        return 2
    command = info.get("command")
    if command is None:
        lines = out.read_text().splitlines() if out.exists() else []
        found = [ln for ln in lines if ln.startswith("python benchmarks/prefetch_modeled.py")]
        if not found:
            print(f"{json_path}: no command in its info and none in {out}: cannot say what made these numbers",
                  file=sys.stderr)
            return 2
        command = found[0]
    profiles = info.get("profiles") or list(dict.fromkeys(k[0] for k in table))
    budgets = info.get("budgets") or list(dict.fromkeys(k[1] for k in table if len(k) == 3))
    policies = info.get("policies") or list(dict.fromkeys(k[2] for k in table if len(k) == 3))
    args = argparse.Namespace(profiles=profiles, budgets=budgets, policies=policies,
                              sweep_prompts=info.get("sweep_prompts", 4), sweep_new_tokens=info.get("sweep_new_tokens", 64))
    try:
        profs = {pr: get_profile(pr) for pr in profiles}
    except ConfigError as e:
        print(f"{json_path}: {e}", file=sys.stderr)
        return 2
    try:
        text = markdown(info, table, sweep, args, command, profs,
                        rendered_by=f"python benchmarks/prefetch_modeled.py --render {json_path} --out {out}")
    except (KeyError, TypeError, ValueError) as e:      # a field the report needs is missing or of another kind
        print(f"{json_path}: a field the report needs is missing or malformed: {e!r}", file=sys.stderr)
        return 2
    out.write_text(text)
    print(out.read_text())
    return 0


def _gap(lru, x, oracle):
    return (lru - x) / (lru - oracle) if lru - oracle > 1e-9 else float("nan")


def floor_ms(r: dict, info: dict, link_gbps: float, compute_ms: float) -> float:
    """The physical floor of one row: max(compute, the link's time for the experts a decode token carried), where
    those are its copies less the prefetches evicted unused (the headline's definition: a prefetch that became a
    hit crossed the link too, only earlier; an approximated miss moves nothing). Wasted prefetches are counted per
    step, the prompt's included: a slight undercount of waste, so the floor errs low."""
    carried = max(0.0, r["experts_copied_per_token"] - r["experts_wasted_per_token"])
    return max(compute_ms, carried * info["expert_mb_at_shape"] / 1e3 / link_gbps * 1e3)


def markdown(info, table, sweep, args, cmd: str, profs, rendered_by: str = "") -> str:
    """``rendered_by``: the command that wrote this report again from the run's JSON (`render`), said under the run's."""
    L = [f"# Prefetching policies: TPOT per budget and link ({info['model']}, {info['timing']})", "",
         "```", cmd, "```", ""] + ([f"Written again from the run's JSON, nothing re-run: `{rendered_by}`", ""]
                                    if rendered_by else []) + [
         f"- timing: **{info['timing']}**" + (f" — the engine runs {info['model']} exactly; every expert is timed as "
                                              f"one {info['shape']} expert ({info['expert_mb_at_shape']:.1f} MB), "
                                              f"{info['routed_gb_per_token']:.2f} GB of routed experts per token"
                                              if info["timing"] == "modeled" else ""),
         f"- workload: {info['prompts']} held-out prompts ({min(info['prompt_tokens'])}–{max(info['prompt_tokens'])} "
         f"tokens), {info['max_new_tokens']} greedy tokens each, batch 1; TPOT over all decode steps (first token "
         f"excluded); policies interleaved per prompt; {info['repetitions']} repetition(s)"
         + (" (modeled timing is deterministic)" if info["timing"] == "modeled" else ""),
         f"- prefetch settings: tau_prefetch {info['tau_prefetch']}, max_lookahead {info['max_lookahead']}; draft "
         f"heads {'present' if info['has_draft'] else 'MISSING (spice_prefetch fell back to gate)'} "
         f"({info['draft_bytes'] / 1e6:.2f} MB native), charged inside the budget at the shape's size",
         f"- exact policies token-identical to lru on every prompt: **{'yes' if info['identical_tokens'] else 'NO'}**",
         "- floor = max(compute, experts a token carried × expert bytes / link bandwidth), where the experts a token "
         "carried are those it copied less the prefetches evicted unused (a prefetch hit crossed the link too, only "
         "earlier); compute = the resident policy's TPOT (every expert on the GPU). Reports rendered before "
         "2026-12-07 charged (1 − hit rate) × routed bytes instead, which let a used prefetch cross the link for free",
         ""]
    for prof in args.profiles:
        p = profs[prof]
        comp = table[(prof, "compute")]["tpot_median_ms"]
        L += [f"## {prof} ({p.h2d_pinned_gbps:g} GB/s pinned host→device; compute floor {comp:.2f} ms/token)", ""]
        for budget in args.budgets:
            L += [f"### cache {budget:.0%} of routed experts", "",
                  "| policy | TPOT median ms | p90 ms | hit rate | copied /tok | wasted /tok | stall ms/tok | "
                  "depth | stop reasons | draft ms/tok | floor ms | gap closed |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
            lru = table.get((prof, budget, "lru"), {}).get("tpot_median_ms")
            orc = table.get((prof, budget, "oracle_prefetch"), {}).get("tpot_median_ms")
            for pol in args.policies:
                r = table[(prof, budget, pol)]
                floor = floor_ms(r, info, p.h2d_pinned_gbps, comp)
                gap = _gap(lru, r["tpot_median_ms"], orc) if lru is not None and orc is not None else float("nan")
                reasons = ", ".join(f"{k} {v:.0%}" for k, v in r["stop_reasons"].items()) or "—"
                L.append(f"| {pol} | {r['tpot_median_ms']:.2f} | {r['tpot_p90_ms']:.2f} | {r['hit_rate']:.3f} | "
                         f"{r['experts_copied_per_token']:.1f} | {r['experts_wasted_per_token']:.1f} | "
                         f"{r['stall_ms_per_token']:.2f} | {r['lookahead_depth']:.2f} | {reasons} | "
                         f"{r['draft_ms_per_token']:.2f} | {floor:.2f} | "
                         + ("—" if gap != gap or pol in ("lru", "oracle_prefetch") else f"{gap:.0%}") + " |")
            L.append("")
    if 0.25 in args.budgets and {"lru", "oracle_prefetch", "spice_prefetch"} <= set(args.policies):
        L += ["## Target: spice_prefetch closes >= 80% of the lru → oracle_prefetch TPOT gap at 25%", ""]
        for prof in args.profiles:
            g = _gap(table[(prof, 0.25, "lru")]["tpot_median_ms"], table[(prof, 0.25, "spice_prefetch")]["tpot_median_ms"],
                     table[(prof, 0.25, "oracle_prefetch")]["tpot_median_ms"])
            verdict = "met" if g >= 0.8 else "**missed**"
            L.append(f"- {prof}: {g:.0%} of the gap closed — {verdict}")
        L.append("")
    if sweep:
        L += ["## Sensitivity at 25%: tau_prefetch × max_lookahead", "",
              f"({args.sweep_prompts} prompts × {args.sweep_new_tokens} tokens; TPOT median ms, and the share of the "
              "lru → oracle gap closed)", ""]
        for prof in args.profiles:
            lru = sweep[(prof, "lru", None, None)]["tpot_median_ms"]
            orc = sweep[(prof, "oracle_prefetch", None, None)]["tpot_median_ms"]
            L += [f"### {prof}: lru {lru:.2f} ms, oracle_prefetch {orc:.2f} ms", "",
                  "| predictor | tau | " + " | ".join(f"depth {d}" for d in SWEEP_DEPTHS) + " |",
                  "|---|---|" + "---|" * len(SWEEP_DEPTHS)]
            for pol in ("gate_prefetch", "spice_prefetch"):
                for tau in SWEEP_TAUS:
                    cells = []
                    for d in SWEEP_DEPTHS:
                        t = sweep[(prof, pol, tau, d)]["tpot_median_ms"]
                        cells.append(f"{t:.2f} ({_gap(lru, t, orc):.0%})")
                    L.append(f"| {pol} | {tau} | " + " | ".join(cells) + " |")
            L.append("")
    env = info["environment"]
    L += [f"Ran on {env['device']} ({env['dtype']}, torch {env['torch']}, {env['threads']} thread(s)) in "
          f"{info['seconds']} s.", ""]
    return "\n".join(L)


if __name__ == "__main__":
    sys.exit(main())
