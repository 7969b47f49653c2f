"""The engine on the CPU: the shipped model, one torch thread, decode tokens per CPU-second and per second.

    python benchmarks/engine_cpu_speed.py resident lru spice_prefetch
    python benchmarks/engine_cpu_speed.py resident lru spice_prefetch --runs 5 --reference --json out.json

Runs each policy ``--runs`` times (3 by default; 64 new tokens of "Tell me a story about a cat and a ball",
25% cache, modeled timing), the policies taking turns so that other load on the machine falls on all of
them alike, and prints the median of the runs as JSON, labelled *measured* (this machine's wall clock and
process CPU time). Only decode steps count: the prefill and the first token are excluded. ``--reference``
adds stock transformers in the same process and the same turns: float32 weights, ``batched_mm`` experts,
a plain greedy loop over a DynamicCache under inference mode, the same prompt ids, 63 decode steps (EOS
ignored). Written to run unchanged on older checkouts (``PYTHONPATH=.`` from their root) to compare two.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from spice_core.api import RunSettings
from spice_core.engine import SpiceEngine

MODEL = "assets/spice-mini"
PROMPT = "Tell me a story about a cat and a ball"
NEW_TOKENS = 64


def engine_run(eng, policy: str) -> tuple[float, float, int]:
    """(decode tokens per CPU-second, per wall second, decode tokens) of one generation."""
    s = RunSettings(policy=policy, cache_frac=0.25, max_new_tokens=NEW_TOKENS,
                    tau_approx=0.05 if policy == "spice" else 0.0)
    n = 0
    for _step in eng.start_prompt(PROMPT, s):
        if n == 0:                      # the decode steps only: the prefill is excluded
            t0, w0 = time.process_time(), time.perf_counter()
        n += 1
    return (n - 1) / (time.process_time() - t0), (n - 1) / (time.perf_counter() - w0), n - 1


def stock_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, experts_implementation="batched_mm").eval()


def stock_run(model, ids: list[int]) -> tuple[float, float, int]:
    """The same measure for stock transformers: greedy, EOS ignored, NEW_TOKENS - 1 decode steps."""
    import inspect

    from transformers import DynamicCache

    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        nxt = model(input_ids=torch.tensor([ids]), use_cache=True, **{kw: cache}).logits[:, -1].argmax(-1, keepdim=True)
        t0, w0 = time.process_time(), time.perf_counter()
        for _ in range(NEW_TOKENS - 1):
            nxt = model(input_ids=nxt, use_cache=True, **{kw: cache}).logits[:, -1].argmax(-1, keepdim=True)
        return (NEW_TOKENS - 1) / (time.process_time() - t0), (NEW_TOKENS - 1) / (time.perf_counter() - w0), \
            NEW_TOKENS - 1


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("policies", nargs="*", default=["resident", "lru", "spice_prefetch"])
    ap.add_argument("--runs", type=int, default=3, help="runs per policy (the median is reported)")
    ap.add_argument("--reference", action="store_true", help="also stock transformers, batched_mm, float32")
    ap.add_argument("--json", type=Path, default=None, help="also write the result (with every run) here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    eng = SpiceEngine.load(MODEL, "cpu")
    names = list(args.policies)
    runners = {p: (lambda p=p: engine_run(eng, p)) for p in names}
    if args.reference:
        model = stock_model()
        ids = eng.lm.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
        runners["transformers_batched_mm_fp32"] = lambda: stock_run(model, ids)
    runs: dict[str, list] = {k: [] for k in runners}
    for _ in range(args.runs):          # the policies take turns
        for k, run in runners.items():
            runs[k].append(run())
    res = {"timing": "measured", "torch_threads": 1, "engine_dtype": str(eng.lm.layout.dtype).replace("torch.", "")}
    for k, rs in runs.items():
        res[k] = {"tokens_per_cpu_s": round(statistics.median(r[0] for r in rs), 1),
                  "tokens_per_s": round(statistics.median(r[1] for r in rs), 1), "decode_tokens": rs[-1][2]}
    print(json.dumps(res))
    if args.json is not None:
        full = dict(res, command="python benchmarks/engine_cpu_speed.py " + " ".join(argv or sys.argv[1:]),
                    machine=machine(), load_average_before=load_before, load_average_after=os.getloadavg(),
                    runs={k: [{"tokens_per_cpu_s": round(r[0], 2), "tokens_per_s": round(r[1], 2), "decode_tokens": r[2]}
                              for r in rs] for k, rs in runs.items()})
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(full, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
