"""The engine on the CPU: the shipped model, one torch thread, decode tokens per CPU-second and per second.

    python benchmarks/engine_cpu_speed.py resident lru spice_prefetch

Runs each policy three times (64 new tokens of "Tell me a story about a cat and a ball", 25% cache,
modeled timing) and prints the median of the three as JSON, labelled *measured* (this machine's wall
clock and process CPU time). Run it on two checkouts back to back to compare them.
"""
import json
import sys
import time

import torch

from spice_core.api import RunSettings
from spice_core.engine import SpiceEngine

torch.set_num_threads(1)


def main(policies: list[str]) -> int:
    eng = SpiceEngine.load("assets/spice-mini", "cpu")
    res = {"timing": "measured", "torch_threads": 1}
    for pol in policies or ["resident", "lru", "spice_prefetch"]:
        s = RunSettings(policy=pol, cache_frac=0.25, max_new_tokens=64, tau_approx=0.05 if pol == "spice" else 0.0)
        cpu, wall = [], []
        for _ in range(3):
            run = eng.start_prompt("Tell me a story about a cat and a ball", s)
            n = 0
            for _step in run:
                if n == 0:                      # the decode steps only: the prefill is excluded
                    t0, w0 = time.process_time(), time.perf_counter()
                n += 1
            cpu.append((n - 1) / (time.process_time() - t0))
            wall.append((n - 1) / (time.perf_counter() - w0))
        res[pol] = {"tokens_per_cpu_s": round(sorted(cpu)[1], 1), "tokens_per_s": round(sorted(wall)[1], 1),
                    "decode_tokens": n - 1}
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
