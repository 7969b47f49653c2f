"""Where the CPU lane's time goes, and which shape of lane is fastest (host only; run it on the GPU's host).

    python benchmarks/cpu_lane_profile.py [--hidden 2048 --intermediate 1408] [--experts 64] [--reps 40]
        [--out FILE.json]

The lane's unit is one routed expert for one token (SwiGLU, bf16, `expert_forward`: the eager path's
arithmetic), weights from a pinned slab larger than the caches, rotating so every job reads DRAM.
Three parts, every number *measured* (wall clock, `time.perf_counter`):

1. kernel: ms per expert and GB/s of weights read, bf16 `F.linear` at 1..cores-1 threads;
2. lane shapes: `CpuLane(workers=W, threads_per_worker=T)` (whole experts in parallel) and the "auto" lane (its shape
   picked per layer, `batch_shape`) with n jobs of one layer submitted at once (n = 1..6, what one layer sends:
   `cpu_compute` sends 4-6 at DeepSeek-V2-Lite's top-6), median wall from the first submit to the last result, split into
   queueing + wake-up (submit -> the job starts), compute (in the worker) and hand-back (the job ends ->
   the driver holds the result);
3. the same with the driver thread busy in Python while the jobs run (as the decode loop's host step
   is): whether the GIL serialises the lane behind it;
4. agreement: whether the lane's expert gives the same bits on every repeat, and the share of its outputs
   bit-equal to the same expert computed on the GPU (with CUDA);
5. side_speedup (`profile_side_speedup`): how much faster the auto lane ends a layer of 3-6 experts than one after another,
   the timing profiles' ``cpu_side_speedup``. ``--speedup-of FILE...`` prints it for saved profiles.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cpu_kernel_variants import expert_slab_args, measure  # noqa: E402
from spice_core.exec.cpu_lane import AUTO_PARALLEL_FROM, CpuLane, available_cores, batch_shape  # noqa: E402
from spice_core.exec.experts import expert_forward  # noqa: E402


def slab(n: int, hidden: int, inter: int, pin: bool):
    gu = torch.randn(n, 2 * inter, hidden).to(torch.bfloat16)
    dn = torch.randn(n, hidden, inter).to(torch.bfloat16)
    if pin:
        gu, dn = gu.pin_memory(), dn.pin_memory()
    return gu, dn


def kernel_rows(gu, dn, x, reps: int, cores: int) -> list[dict]:
    nbytes = (gu[0].numel() + dn[0].numel()) * 2
    rows, weights = [], list(zip(gu.unbind(0), dn.unbind(0)))
    for threads in sorted({1, 2, 4, max(1, (cores - 1) // 3), max(1, (cores - 1) // 2), cores - 1}):
        torch.set_num_threads(threads)
        ms = measure(lambda x_, g, d: expert_forward(x_, g, d, F.silu), weights, x, reps)
        rows.append({"threads": threads, "ms_per_expert": round(ms, 4), "gbps": round(nbytes / ms / 1e6, 1)})
        print("kernel", rows[-1], flush=True)
    return rows


def busy_python(stop: threading.Event, seconds: float) -> None:
    """Pure-Python work holding the GIL in small slices, as the host step's planner does."""
    end = time.perf_counter() + seconds
    acc = 0
    while time.perf_counter() < end and not stop.is_set():
        for i in range(200):
            acc += i * i
    return acc


def lane_rows(gu, dn, x, reps: int, cores: int, busy_s: float) -> list[dict]:
    nbytes = (gu[0].numel() + dn[0].numel()) * 2
    shapes = []
    for w in (1, 3, 5, 7, cores - 1):
        t = (cores - 1) // w
        if t >= 1 and (w, t) not in shapes:
            shapes.append((w, t))
    shapes.append(("auto", None))
    rows, k = [], [0]
    for w, t in shapes:
        lane = CpuLane(adaptive=True) if w == "auto" else CpuLane(workers=w, threads_per_worker=t)
        try:
            for n in (1, 2, 3, 4, 5, 6):
                for busy in (False, True):
                    walls, queue, compute, back = [], [], [], []
                    for rep in range(reps + 3):
                        jobs = []
                        t_sub = time.perf_counter()
                        for _ in range(n):
                            k[0] = (k[0] + 7) % gu.shape[0]
                            jobs.append((time.perf_counter(), lane.submit(x, gu[k[0]], dn[k[0]], F.silu, "cpu", batch=n)))
                        if busy:
                            busy_python(threading.Event(), busy_s)
                        res = []
                        for s, j in jobs:
                            _, _, t0, t1 = j.result()
                            res.append((s, t0, t1, time.perf_counter()))
                        if rep < 3:
                            continue
                        walls.append(res[-1][3] - t_sub)
                        queue.append(statistics.mean(t0 - s for s, t0, _, _ in res))
                        compute.append(statistics.mean(t1 - t0 for _, t0, t1, _ in res))
                        back.append(statistics.mean(r - t1 for _, _, t1, r in res))
                    ms = statistics.median(walls) * 1e3
                    rows.append({"workers": w, "threads_per_worker": t, "lane": lane.shape,
                                 "experts": n, "driver_busy_ms": busy_s * 1e3 if busy else 0.0,
                                 "wall_ms": round(ms, 4), "gbps": round(n * nbytes / ms / 1e6, 1),
                                 "queue_wakeup_us": round(statistics.median(queue) * 1e6, 1),
                                 "compute_us": round(statistics.median(compute) * 1e6, 1),
                                 "handback_us": round(statistics.median(back) * 1e6, 1)})
                    print("lane", rows[-1], flush=True)
        finally:
            lane.close()
    return rows


def agreement(gu, dn, x, cores: int, repeats: int = 20) -> dict:
    """Is the lane's expert deterministic (the same bits on every repeat at cores-1 threads), and how far is it
    from the same expert on the GPU (bf16 F.linear there, the arithmetic the fast path's kernel matches)?"""
    torch.set_num_threads(cores - 1)
    outs = [expert_forward(x, gu[e % 4], dn[e % 4], F.silu) for e in range(4 * repeats)]
    det = all(torch.equal(outs[i], outs[i % 4]) for i in range(len(outs)))
    res = {"cpu_deterministic": det, "repeats": repeats}
    if torch.cuda.is_available():
        shares, rels = [], []
        for e in range(4):
            y_gpu = expert_forward(x.cuda(), gu[e].cuda(), dn[e].cuda(), F.silu).cpu()
            shares.append(float((y_gpu == outs[e]).float().mean()))
            rels.append(float((y_gpu.float() - outs[e].float()).abs().max() / y_gpu.float().abs().max()))
        res.update(gpu_bit_equal_share=min(shares), gpu_max_rel_diff=max(rels))
    print("agreement", res, flush=True)
    return res


def profile_side_speedup(profile: dict) -> float | None:
    """The profile's "side_speedup" (the timing profiles' ``cpu_side_speedup``): the median, over the layer sizes
    from which an auto lane runs experts side by side (3 to 6 experts), of the lane's wall one after another on every
    core left (the 1xT rows) over its wall as the auto lane runs them: its "auto" rows, or (profiles from before the
    auto lane) the fixed WxT row `batch_shape` picks for a batch it runs in one round. None: no such pairs."""
    rows = [r for r in profile["lane"] if r.get("driver_busy_ms", 0) == 0 and "experts" in r]
    one = {r["experts"]: r["wall_ms"] for r in rows if r["workers"] == 1}
    auto = {r["experts"]: r["wall_ms"] for r in rows if r["workers"] == "auto"}
    fixed = {(r["workers"], r["threads_per_worker"], r["experts"]): r["wall_ms"] for r in rows if r["workers"] != "auto"}
    cores_left = max((r["threads_per_worker"] for r in rows if r["workers"] == 1), default=0)
    ratios = []
    for n in sorted(one):
        if n < AUTO_PARALLEL_FROM:
            continue
        if auto:
            side_ms = auto.get(n)
        else:
            side, threads = batch_shape(n, cores_left)
            side_ms = fixed.get((side, threads, n)) if side == n else None
        if side_ms:
            ratios.append(one[n] / side_ms)
    return round(statistics.median(ratios), 3) if ratios else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    expert_slab_args(ap)
    ap.add_argument("--busy-ms", type=float, default=0.3, help="driver-thread Python work while jobs run (part 3)")
    ap.add_argument("--switch-interval-us", type=float, default=0.0,
                    help="sys.setswitchinterval for the run (0: Python's default, 5000 us)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--speedup-of", type=Path, nargs="+", metavar="PROFILE_JSON",
                    help="measure nothing: print each saved profile's side_speedup")
    a = ap.parse_args()
    if a.speedup_of:
        for path in a.speedup_of:
            try:
                print(f"{path}: side_speedup {profile_side_speedup(json.loads(path.read_text()))}")
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise SystemExit(f"error: {err!r} reading {path}: give a JSON file this script wrote with --out")
        return
    cores = available_cores()
    if a.switch_interval_us > 0:
        sys.setswitchinterval(a.switch_interval_us / 1e6)
    pin = torch.cuda.is_available()
    gu, dn = slab(a.experts, a.hidden, a.intermediate, pin)
    x = torch.randn(1, a.hidden).to(torch.bfloat16)
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    res = {"timing": "measured", "cores": cores, "pinned_slab": pin, "hidden": a.hidden, "intermediate": a.intermediate,
           "switch_interval_us": sys.getswitchinterval() * 1e6, "expert_mb": round((gu[0].numel() + dn[0].numel()) * 2 / 1e6, 3),
           "amx_bf16": "amx_bf16" in flags, "avx512_bf16": "avx512_bf16" in flags,
           "command": "python benchmarks/cpu_lane_profile.py " + " ".join(sys.argv[1:])}
    res["kernel"] = kernel_rows(gu, dn, x, a.reps, cores)
    res["agreement"] = agreement(gu, dn, x, cores)
    res["lane"] = lane_rows(gu, dn, x, a.reps, cores, a.busy_ms / 1e3)
    res["side_speedup"] = profile_side_speedup(res)
    text = json.dumps(res, indent=1)
    if a.out:
        a.out.write_text(text + "\n")
    print(json.dumps({k: v for k, v in res.items() if k not in ("kernel", "lane")}))


if __name__ == "__main__":
    main()
