"""SPICE: offloaded Mixture-of-Experts inference with speculative prefetching,
low-rank expert surrogates and CPU-GPU orchestration. See README.md."""

__version__ = "0.1.0"
