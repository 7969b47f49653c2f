"""What the CLI tests share: a sane hardware profile and one in-process CLI call."""
from pathlib import Path

from spice_core.tools.cli import main

REPO = Path(__file__).resolve().parents[2]
GOOD_PROFILE = {"name": "p", "h2d_pinned_gbps": 25.0, "h2d_pageable_gbps": 10.0, "d2h_gbps": 25.0,
                "copy_latency_us": 5.0, "gpu_mem_gbps": 1000.0, "gpu_tflops": 100.0, "gpu_kernel_us": 5.0,
                "gpu_kernels_per_expert": 4, "gpu_kernels_per_layer": 12, "cpu_mem_gbps": 50.0, "cpu_gflops": 500.0,
                "cpu_threads": 8, "cpu_task_us": 30.0, "host_step_us": 100.0}


def run_cli(capsys, argv):
    """``main(argv)`` in this process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err
