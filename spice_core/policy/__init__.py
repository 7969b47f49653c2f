"""Policies: pure functions and small classes over plain data (keys, ticks, confidences,
costs) that return decisions. No tensors, no CUDA, no clocks: they are unit tested and
simulated without a model."""
