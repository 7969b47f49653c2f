"""`python -m spice_core calibrate-hw`: measure this machine's hardware profile on CUDA.

Measures what the cost model needs, with one expert of the chosen shape:
host->device bandwidth from pinned and from pageable memory, device->host bandwidth,
one expert's eager GPU time (and so the per-kernel overhead), one expert's CPU time
from DRAM with the threads the CPU lane would use. Writes a profile JSON that
`--hw-profile FILE` feeds back to the engine and benchmarks.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from spice_core.errors import ConfigError
from spice_core.timing.profiles import HardwareProfile, get_profile, get_shape


def _median_ms(fn, reps: int, cuda: bool) -> float:
    times = []
    for _ in range(reps):
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def measure_profile(name: str = "this-machine", shape_name: str = "deepseek-v2-lite", reps: int = 20,
                    cpu_threads: int | None = None) -> HardwareProfile:
    if not torch.cuda.is_available():
        raise ConfigError("calibrate-hw measures a GPU machine and needs CUDA: on this machine use a shipped --profile")
    from spice_core.exec.cpu_lane import available_cores
    from spice_core.exec.experts import expert_forward

    shape = get_shape(shape_name)
    dev = torch.device("cuda")
    h, i = shape.hidden, shape.expert_intermediate
    nbytes = shape.expert_bytes
    n_buf = 16   # rotate buffers so caches do not flatter the numbers
    pinned = [torch.randn(3 * h * i, dtype=torch.bfloat16).pin_memory() for _ in range(n_buf)]
    pageable = [torch.randn(3 * h * i, dtype=torch.bfloat16) for _ in range(n_buf)]
    dst = torch.empty(3 * h * i, dtype=torch.bfloat16, device=dev)
    k = iter(range(10**9))
    pin_ms = _median_ms(lambda: dst.copy_(pinned[next(k) % n_buf], non_blocking=True), reps, True)
    page_ms = _median_ms(lambda: dst.copy_(pageable[next(k) % n_buf], non_blocking=False), reps, True)
    back = torch.empty(3 * h * i, dtype=torch.bfloat16).pin_memory()
    d2h_ms = _median_ms(lambda: back.copy_(dst, non_blocking=True), reps, True)

    gate_up = torch.randn(2 * i, h, dtype=torch.bfloat16, device=dev) * 0.02
    down = torch.randn(h, i, dtype=torch.bfloat16, device=dev) * 0.02
    x = torch.randn(1, h, dtype=torch.bfloat16, device=dev)
    act = torch.nn.functional.silu
    for _ in range(5):
        expert_forward(x, gate_up, down, act)
    gpu_ms = _median_ms(lambda: expert_forward(x, gate_up, down, act), reps, True)
    # Launch overhead: the same ops on a tiny expert (memory time ~0).
    tg, td, tx = gate_up[:16, :64].contiguous(), down[:64, :8].contiguous(), x[:, :64].contiguous()
    tiny_ms = _median_ms(lambda: expert_forward(tx, tg, td, act), reps, True)

    threads = cpu_threads or max(1, available_cores() - 1)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cpu_experts = [(torch.randn(2 * i, h, dtype=torch.bfloat16), torch.randn(h, i, dtype=torch.bfloat16))
                       for _ in range(8)]
        xc = torch.randn(1, h, dtype=torch.bfloat16)
        j = iter(range(10**9))

        def cpu_run():
            g, d = cpu_experts[next(j) % 8]
            expert_forward(xc, g, d, act)

        cpu_run()
        cpu_ms = _median_ms(cpu_run, max(5, reps // 2), False)
    finally:
        torch.set_num_threads(old)

    base = get_profile("h200-pcie5x16")
    kernels = base.gpu_kernels_per_expert
    return HardwareProfile(
        name=name, h2d_pinned_gbps=nbytes / (pin_ms * 1e6), h2d_pageable_gbps=nbytes / (page_ms * 1e6),
        d2h_gbps=nbytes / (d2h_ms * 1e6), copy_latency_us=0.0, gpu_mem_gbps=base.gpu_mem_gbps,
        gpu_tflops=base.gpu_tflops, gpu_kernel_us=max(1.0, tiny_ms * 1e3 / kernels), gpu_kernels_per_expert=kernels,
        gpu_kernels_per_layer=base.gpu_kernels_per_layer, cpu_mem_gbps=nbytes / (cpu_ms * 1e6),
        cpu_gflops=base.cpu_gflops, cpu_threads=threads, cpu_task_us=base.cpu_task_us, host_step_us=base.host_step_us,
        source=(f"measured by calibrate-hw with one {shape_name} expert ({nbytes / 1e6:.1f} MB): pinned copy "
                f"{pin_ms:.3f} ms, pageable {page_ms:.3f} ms, GPU eager {gpu_ms:.3f} ms, CPU {cpu_ms:.3f} ms "
                f"on {threads} threads; GPU memory bandwidth and flops copied from h200-pcie5x16"))


def add_cli(sub) -> None:
    from spice_core.tools import args as ca

    p = sub.add_parser("calibrate-hw", help="measure this machine's hardware profile (CUDA)")
    p.add_argument("--name", type=ca.nonempty_text, default="this-machine")
    p.add_argument("--shape", default="deepseek-v2-lite")
    p.add_argument("--out", type=ca.path, default=Path("runs/hw-profile.json"))
    p.add_argument("--reps", type=ca.int_in(1, 10_000), default=20)
    p.set_defaults(func=run)


def run(args) -> int:
    from spice_core.user_files import check_writable_file

    get_shape(args.shape)
    check_writable_file(args.out, "--out")
    prof = measure_profile(args.name, args.shape, args.reps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(prof.as_dict(), indent=2))
    print(json.dumps(prof.as_dict(), indent=2))
    return 0
