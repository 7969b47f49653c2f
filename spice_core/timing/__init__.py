"""Timing: hardware profiles, target shapes, the cost model and the two timelines
(modeled: discrete-event replay; measured: CUDA events)."""
