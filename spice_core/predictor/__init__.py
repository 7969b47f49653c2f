"""Predictors of upcoming experts: each returns, after layer l's router, a confidence per
expert for the MoE layers l+1..l+D (`policy.prefetch.LayerPrediction`).

- gate:   training-free; layer l+d's real router applied to layer l's hidden state.
- oracle: the true future routing from a recorded trace (upper bound only).
- draft:  SPICE's trained heads (predictor/draft.py), built by `python -m spice_core calibrate`.
"""
