"""PredictContext: what a predictor may know about the run it predicts for, and nothing more."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PredictContext:
    """Updated by the runtime as the run goes; predictors read it and report their device work to ``clock``."""

    max_lookahead: int
    token: int = 0
    clock: object = None            # the run's timeline: predictors bracket their work with stamp()/draft()
    stream: object = None           # the compute CUDA stream (None on CPU)
