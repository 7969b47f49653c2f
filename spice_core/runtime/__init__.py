"""Executors: carry out decisions on the device (eager, one expert at a time; or CUDA-graph segments)."""
