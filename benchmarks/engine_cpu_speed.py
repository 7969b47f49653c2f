"""The engine on the CPU: the shipped model, one torch thread, decode tokens per CPU-second and per second.

    python benchmarks/engine_cpu_speed.py resident lru spice_prefetch
    python benchmarks/engine_cpu_speed.py resident lru spice_prefetch --runs 5 --reference --json out.json

Runs each policy ``--runs`` times (3 by default; 64 new tokens of "Tell me a story about a cat and a ball",
25% cache, modeled timing), the policies taking turns so that other load on the machine falls on all of
them alike, and prints the median of the runs as JSON, labelled *measured* (this machine's wall clock and
process CPU time). Only decode steps count: the prefill and the first token are excluded. ``--reference``
adds stock transformers in the same process and the same turns: float32 weights, ``batched_mm`` experts,
a plain greedy loop over a DynamicCache under inference mode, the same prompt ids, 63 decode steps (EOS
ignored). Besides the medians, the CPU time of single decode steps pooled over the runs: its 10th
percentile estimates what an otherwise idle machine gives, since other load only ever adds time.
``--paired`` also steps each policy in lockstep with that stock loop, one step each in turn, and reports
the median ratio of their step times: on a machine whose speed drifts (a shared one's does, by a factor of
1.5 within a minute) it compares the two at the same moments. Written to run unchanged on older checkouts
(``PYTHONPATH=.`` from their root) to compare two.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the package without installing it

import torch

from spice_core.api import POLICIES, RunSettings
from spice_core.engine import SpiceEngine

MODEL = "assets/spice-mini"
PROMPT = "Tell me a story about a cat and a ball"
NEW_TOKENS = 64


def engine_steps(eng, policy: str):
    """The engine's generation: one item per token, the first after the prefill."""
    return eng.start_prompt(PROMPT, RunSettings(policy=policy, cache_frac=0.25, max_new_tokens=NEW_TOKENS,
                                                tau_approx=0.05 if policy == "spice" else 0.0))


def engine_run(eng, policy: str) -> tuple[float, float, int, list[float]]:
    """(decode tokens per CPU-second, per wall second, decode tokens, CPU ms of each decode step) of one
    generation."""
    n, steps, prev = 0, [], 0.0
    for _step in engine_steps(eng, policy):
        c = time.process_time()
        if n == 0:                      # the decode steps only: the prefill is excluded
            t0, w0 = c, time.perf_counter()
        else:
            steps.append((c - prev) * 1e3)
        prev = c
        n += 1
    return (n - 1) / (time.process_time() - t0), (n - 1) / (time.perf_counter() - w0), n - 1, steps


def stock_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, experts_implementation="batched_mm").eval()


def stock_steps(model, ids: list[int]):
    """Stock transformers, greedy over a DynamicCache, EOS ignored: one item after the prefill, then one per
    decode step (NEW_TOKENS - 1). Inference mode is entered per step, never left on between them."""
    import inspect

    from transformers import DynamicCache

    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = DynamicCache(config=model.config)
    nxt = torch.tensor([ids])
    for _ in range(NEW_TOKENS):
        with torch.inference_mode():
            nxt = model(input_ids=nxt, use_cache=True, **{kw: cache}).logits[:, -1].argmax(-1, keepdim=True)
        yield


def stock_run(model, ids: list[int]) -> tuple[float, float, int, list[float]]:
    """`engine_run`'s measures for stock transformers (`stock_steps`)."""
    it = stock_steps(model, ids)
    next(it)                            # the prefill
    t0, w0 = time.process_time(), time.perf_counter()
    steps, prev = [], t0
    for _ in it:
        c = time.process_time()
        steps.append((c - prev) * 1e3)
        prev = c
    n = len(steps)
    return n / (time.process_time() - t0), n / (time.perf_counter() - w0), n, steps


def paired_run(eng, policy: str, model, ids: list[int]) -> list[tuple[float, float]]:
    """(engine ms, stock ms) of CPU time per decode step, the two stepped in lockstep: each pair of steps
    meets the same machine, so their ratio holds when the machine's speed drifts, as a shared one's does."""
    e_it, s_it = iter(engine_steps(eng, policy)), stock_steps(model, ids)
    next(e_it), next(s_it)              # the prefills
    pairs = []
    while True:
        c0 = time.process_time()
        if next(e_it, None) is None:    # the engine stopped (EOS)
            return pairs
        c1 = time.process_time()
        if next(s_it, False) is False:  # the stock loop's NEW_TOKENS - 1 steps are done
            return pairs
        pairs.append(((c1 - c0) * 1e3, (time.process_time() - c1) * 1e3))


def machine() -> dict:
    import transformers

    cpu = platform.processor() or "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores_visible": os.cpu_count(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version()}


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Bad values end here (argparse's one error line, exit 2), before the model loads. Checked by hand, not with
    spice_core.tools.args, which older checkouts lack (see the module's docstring)."""
    if args.runs < 1:
        ap.error(f"argument --runs: {args.runs} is out of range: use an integer >= 1")
    bad = [p for p in args.policies if p not in POLICIES]
    if bad:
        ap.error(f"argument policies: {bad[0]!r} is not a policy: choose from {', '.join(POLICIES)}")
    if args.json is not None:
        if args.json.is_dir():
            ap.error(f"argument --json: {args.json} is a folder: pass a file path")
        folder = args.json.parent
        while not folder.exists() and folder.parent != folder:      # the folder is made at the end if missing
            folder = folder.parent
        try:                    # a scratch file, not os.access: root passes that on a read-only file system
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as e:
            ap.error(f"argument --json: {args.json}: cannot write in {folder} ({e.strerror or e}): pass a "
                     "writable path")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("policies", nargs="*", default=["resident", "lru", "spice_prefetch"])
    ap.add_argument("--runs", type=int, default=3, help="runs per policy (the median is reported)")
    ap.add_argument("--reference", action="store_true", help="also stock transformers, batched_mm, float32")
    ap.add_argument("--paired", action="store_true", help="also each policy stepped in lockstep with stock "
                    "transformers (as --reference), the ratio of their step times")
    ap.add_argument("--json", type=Path, default=None, help="also write the result (with every run) here")
    args = ap.parse_args(argv)
    check_args(ap, args)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    eng = SpiceEngine.load(MODEL, "cpu")
    names = list(args.policies)
    runners = {p: (lambda p=p: engine_run(eng, p)) for p in names}
    if args.reference or args.paired:
        model = stock_model()
        ids = eng.lm.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    if args.reference:
        runners["transformers_batched_mm_fp32"] = lambda: stock_run(model, ids)
    runs: dict[str, list] = {k: [] for k in runners}
    pairs: dict[str, list] = {p: [] for p in names} if args.paired else {}
    for _ in range(args.runs):          # the policies take turns
        for k, run in runners.items():
            runs[k].append(run())
        for p in pairs:
            pairs[p] += paired_run(eng, p, model, ids)
    res = {"timing": "measured", "torch_threads": 1, "engine_dtype": str(eng.lm.layout.dtype).replace("torch.", "")}
    for k, rs in runs.items():
        steps = sorted(ms for r in rs for ms in r[3])
        res[k] = {"tokens_per_cpu_s": round(statistics.median(r[0] for r in rs), 1),
                  "tokens_per_s": round(statistics.median(r[1] for r in rs), 1), "decode_tokens": rs[-1][2],
                  "step_cpu_ms_p10": round(steps[len(steps) // 10], 2),
                  "step_cpu_ms_median": round(statistics.median(steps), 2)}
    for p, ps in pairs.items():
        res[p]["paired_with_stock"] = {
            "steps": len(ps), "engine_step_cpu_ms_median": round(statistics.median(e for e, _ in ps), 2),
            "stock_step_cpu_ms_median": round(statistics.median(s for _, s in ps), 2),
            "engine_over_stock_median": round(statistics.median(e / s for e, s in ps), 3)}
    print(json.dumps(res))
    if args.json is not None:
        full = dict(res, command="python benchmarks/engine_cpu_speed.py " + " ".join(argv or sys.argv[1:]),
                    machine=machine(), load_average_before=load_before, load_average_after=os.getloadavg(),
                    runs={k: [{"tokens_per_cpu_s": round(r[0], 2), "tokens_per_s": round(r[1], 2),
                               "decode_tokens": r[2], "step_cpu_ms": [round(ms, 3) for ms in r[3]]} for r in rs]
                          for k, rs in runs.items()},
                    paired_step_cpu_ms={p: [[round(e, 3), round(s, 3)] for e, s in ps] for p, ps in pairs.items()})
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(full, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
