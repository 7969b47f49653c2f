"""Host (Python driver) overhead per token and per MoE layer, per policy.

    python benchmarks/host_overhead.py [--model assets/spice-mini] [--device cuda|cpu]
        [--timing measured|modeled] [--policies lru spice_prefetch ...] [--tokens 32]
        [--orders auto before after] [--profile-out FILE] [--lift] [--sections-out FILE]

On the shipped miniature every kernel is tiny, so wall time per token is almost entirely
the engine's host work: routing readback, grouping, miss planning, the draft and the
lookahead plan, slot bookkeeping and copy/event issue. The difference between a policy and
`resident` is the overhead that policy adds to every token at any model size (at batch 1
each MoE layer syncs once to read its routing, so host work is not hidden behind the GPU).

Prints, per policy and prefetch order (``--orders``: where the prefetch planning runs,
before or after the layer's experts are launched; auto = the engine's default): wall ms
per token (median of decode steps over prompts), experts copied per token, and ms per MoE
layer of each engine section (instrumented by wrapping the engine's methods). With
``--profile-out`` also writes the cProfile of one generation per policy (top 40 by
cumulative time). ``--lift``: the miniature lifted to DeepSeek-V2-Lite shapes with its draft heads and
LoRE (the headline's model), where the fast path's host step plans real lookaheads. ``--sections-out``:
a finer table per policy of the fast path's host step (`FAST_SECTIONS`: calls and µs per MoE layer,
µs per call), nested sections included in their callers' time. Timing label: *measured* wall clock.
"""
from __future__ import annotations

import collections
import cProfile
import io
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))        # bench_args, when imported from elsewhere

import bench_args  # noqa: E402
from bench_args import ca  # noqa: E402
from spice_core.api import MAX_NEW_TOKENS_LIMIT, POLICIES, SETTING_RANGES, RunSettings  # noqa: E402
from spice_core.heldout import DEFAULT_PROMPTS  # noqa: E402
from spice_core.engine import SpiceEngine  # noqa: E402
from spice_core.policy.planner import LayerPlanner  # noqa: E402
from spice_core.runtime.copies import CopyEngine  # noqa: E402
from spice_core.runtime.eager import EagerExecutor  # noqa: E402
from spice_core.runtime.layer import LayerRuntime  # noqa: E402

# Engine sections timed per MoE layer: the whole layer (eager: run_layer; graphed: the host step between
# segments, decide_layer), the lookahead, the planner's two phases,
# the one-call planner of all-hit layers (plan_hits), the routing readback, and copy issue (demand and prefetch).
SECTIONS = {"run_layer": LayerRuntime, "decide_layer": LayerRuntime, "lookahead": LayerRuntime, "plan_layer": LayerPlanner,
            "plan_experts": LayerPlanner, "plan_hits": LayerPlanner, "read_routing": EagerExecutor,
            "issue": CopyEngine}


# The headline's spice setting (docs/benchmarks/headline/config-native-25.json), used with --lift.
HEADLINE_SETTINGS = {"tau_approx": 0.05, "tau_prefetch": 0.2, "max_lookahead": 4, "lore_rank": 4}


def _fast_sections() -> dict:
    """The fast path's host step, finer: "Class.method" -> (owner, attribute). Nested ones are inside their
    callers' time (e.g. `_issue_one` inside `issue_many`, `MeasuredTimeline.copy` inside `_issue_one`)."""
    from spice_core.predictor.draft import DraftPredictor
    from spice_core.runtime import graphed
    from spice_core.runtime.graphed import GraphedDecoder
    from spice_core.runtime.slots import SlotBuffer
    from spice_core.timing.measured import MeasuredTimeline
    from spice_core.trace.recorder import Recorder

    owners = {"GraphedDecoder": (GraphedDecoder, ("_decide",)),
              "LayerRuntime": (LayerRuntime, ("decide_layer", "run_deferred", "lookahead", "record_deferred")),
              "LayerPlanner": (LayerPlanner, ("plan_layer", "plan_hits", "plan_experts", "plan_prefetch",
                                              "prefetch_issued", "_acquire")),
              "CopyEngine": (CopyEngine, ("issue_many", "_issue_one", "_issue_together", "wait_ready",
                                         "wait_ready_many")),
              "SlotBuffer": (SlotBuffer, ("fill_from",)),
              "MeasuredTimeline": (MeasuredTimeline, ("copy", "copies", "layer", "wait", "stamp", "end_token")),
              "Recorder": (Recorder, ("layer_outcomes", "layer_hits", "layer_counts", "prefetch_used")),
              "DraftPredictor": (DraftPredictor, ("predictions_from_readback",)),
              "graphed": (graphed, ("plan_rows",))}
    return {f"{o}.{a}": (cls, a) for o, (cls, attrs) in owners.items() for a in attrs}


def _wrap(owner, attr: str, name: str, totals: dict, counts: collections.Counter) -> None:
    """Replace ``owner.attr`` (a method, static method or module function) with a wall-clock timed one."""
    fn = owner.__dict__[attr]
    is_static = isinstance(fn, staticmethod)
    raw = fn.__func__ if is_static else fn

    def wrapped(*a, __fn=raw, **k):
        t = time.perf_counter()
        try:
            return __fn(*a, **k)
        finally:
            totals[name] += time.perf_counter() - t
            counts[name] += 1

    setattr(owner, attr, staticmethod(wrapped) if is_static else wrapped)


def _instrument(totals: dict, counts: collections.Counter, fast: bool = False) -> None:
    """Wrap each section's method with a wall-clock timer (a profiler's job, done by hand: cProfile's
    own overhead would swamp sections of a few microseconds)."""
    for name, cls in SECTIONS.items():
        _wrap(cls, name, name, totals, counts)
    if fast:
        for name, (owner, attr) in _fast_sections().items():
            if SECTIONS.get(attr) is not owner:      # the coarse table's sections are wrapped once, above
                _wrap(owner, attr, name, totals, counts)


def _section_rows(totals: dict, counts: collections.Counter, layers: int) -> list[str]:
    """Markdown rows: section | calls per MoE layer | µs per MoE layer | µs per call."""
    rows = []
    for name in sorted(totals, key=lambda n: -totals[n]):
        n = counts[name]
        rows.append(f"| {name} | {n / layers:.2f} | {totals[name] / layers * 1e6:.1f} | "
                    f"{totals[name] / max(1, n) * 1e6:.1f} |")
    return rows


def main(argv=None) -> int:
    ap = bench_args.Parser(prog=bench_args.prog(__file__), description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=bench_args.model, default="assets/spice-mini")
    ap.add_argument("--device", type=ca.device, default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--timing", default=None, choices=("measured", "modeled"),
                    help="measured (CUDA) or modeled; default: the engine's")
    ap.add_argument("--policies", nargs="+", type=bench_args.one_of(POLICIES, "policy"),
                    default=["resident", "on_demand", "lru", "gate_prefetch", "spice_prefetch", "spice", "oracle_prefetch"])
    ap.add_argument("--cache-frac", type=ca.float_in(*SETTING_RANGES["cache_frac"]), default=0.25)
    ap.add_argument("--prompts", type=ca.positive_int, default=4)
    ap.add_argument("--tokens", type=ca.int_in(1, MAX_NEW_TOKENS_LIMIT), default=32)
    ap.add_argument("--orders", nargs="+", default=["auto"], choices=["auto", "before", "after"])
    ap.add_argument("--profile-out", type=Path, default=None)
    ap.add_argument("--executor", default="auto", choices=["auto", "eager", "graphed"],
                    help="the engine's executor (auto: the graphed fast path on CUDA)")
    ap.add_argument("--lift", action="store_true",
                    help="lift --model to DeepSeek-V2-Lite shapes (with its draft heads and LoRE), as the headline")
    ap.add_argument("--sections-out", type=Path, default=None,
                    help="write the fast path's finer host sections per policy (markdown) here")
    args = ap.parse_args(argv)
    bench_args.check_timing(ap, args.timing, args.device)
    for flag, path in (("--profile-out", args.profile_out), ("--sections-out", args.sections_out)):
        if path is not None:
            bench_args.check_out_file(ap, path, flag)
    torch.manual_seed(0)
    if args.device == "cpu":
        torch.set_num_threads(1)
    kw = {"timing": args.timing} if args.timing else {}
    if args.lift:
        from spice_core.tools.lift import lift_artifacts, lifted_model

        lm, _, desc = lifted_model(Path(args.model), args.device)
        engine = SpiceEngine(lm, executor=args.executor, **kw)
        engine.artifacts = lift_artifacts(Path(args.model), lm) or None
        args.model = desc
    else:
        engine = SpiceEngine.load(args.model, device=args.device, executor=args.executor, **kw)
    totals, counts = collections.defaultdict(float), collections.Counter()
    _instrument(totals, counts, fast=args.sections_out is not None)
    sections_md = []
    prompts = DEFAULT_PROMPTS[: args.prompts]
    print(f"# host overhead (measured wall clock), model {args.model}, device {args.device}, "
          f"timing {engine.timing}, executor {args.executor}, cache {args.cache_frac:.0%}, "
          f"{len(prompts)} prompts x {args.tokens} tokens")
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}")
    print("| policy | prefetch order | wall ms/token | copies/token | "
          + " | ".join(f"{s} ms/layer" for s in SECTIONS) + " |")
    print("|---|---|---|---|" + "---|" * len(SECTIONS))
    profiles = []
    expert_bytes = engine.lm.layout.nbytes
    for order in args.orders:
        engine.prefetch_after_experts = {"auto": None, "before": False, "after": True}[order]
        for pol in args.policies:
            s = RunSettings(policy=pol, cache_frac=args.cache_frac, max_new_tokens=args.tokens,
                            profile="h200-pcie5x16", **HEADLINE_SETTINGS if args.lift else {})
            run = engine.start_prompt(prompts[0], s)   # warm-up (allocator, lazy imports)
            for _ in run:
                pass
            totals.clear()
            counts.clear()
            steps, copies = [], []
            for prompt in prompts:
                run = engine.start_prompt(prompt, s)
                t = time.perf_counter()
                for i, st in enumerate(run):
                    now = time.perf_counter()
                    if i > 0:
                        steps.append((now - t) * 1e3)
                        copies.append(st.bytes_copied / expert_bytes)
                    t = now
            layers = max(1, counts["run_layer"] + counts["decide_layer"])   # eager layers + graphed host steps
            cells = " | ".join(f"{totals[n] / layers * 1e3:.3f}" for n in SECTIONS)
            print(f"| {pol} | {order} | {statistics.median(steps):.2f} | {statistics.mean(copies):.1f} | {cells} |",
                  flush=True)
            sections_md += [f"\n## {pol} ({order}): {layers} MoE layers, wall {statistics.median(steps):.2f} ms/token\n",
                            "| section | calls / layer | µs / layer | µs / call |", "|---|---|---|---|",
                            *_section_rows(totals, counts, layers)]
            if args.profile_out is not None:
                pr = cProfile.Profile()
                run = engine.start_prompt(prompts[0], s)
                pr.enable()
                for _ in run:
                    pass
                pr.disable()
                buf = io.StringIO()
                pstats.Stats(pr, stream=buf).sort_stats("cumulative").print_stats(40)
                profiles.append(f"## {pol} ({order})\n{buf.getvalue()}")
    if args.profile_out is not None:
        args.profile_out.parent.mkdir(parents=True, exist_ok=True)
        args.profile_out.write_text("\n".join(profiles))
    if args.sections_out is not None:
        args.sections_out.parent.mkdir(parents=True, exist_ok=True)
        args.sections_out.write_text(f"# host sections (measured wall clock), model {args.model}, device {args.device}, "
                                     f"cache {args.cache_frac:.0%}\n" + "\n".join(sections_md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
