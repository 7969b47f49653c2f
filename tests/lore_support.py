"""Helpers shared by the LoRE, quality and CPU-lane tests: tiny engines with a fitted LoRE bank."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from tiny_models import FAMILIES, build_tiny  # noqa: F401

PROMPT = [5, 17, 33, 2, 9, 41, 7]


def random_rows(vocab: int, n_rows: int = 12, length: int = 64, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab, (length,), generator=g).tolist() for _ in range(n_rows)]


def record_traces(lm, n_rows: int = 12, length: int = 64, seed: int = 0):
    """Routing traces the way `calibrate` records them (spice_core.predictor.traces)."""
    from spice_core.predictor.traces import collect_traces

    return collect_traces(lm, random_rows(lm.model.config.vocab_size, n_rows, length, seed), source="random ids")


def attach_lore(engine, bank) -> None:
    """Make ``bank`` the engine's LoRE artifact (as if loaded from beside the model)."""
    arts = engine.artifacts
    if arts is None:
        engine.artifacts = SimpleNamespace(lore=bank, draft=None, popularity=None)
    else:
        arts.lore = bank


def engine_with_lore(model_dir, rank: int):
    """The real engine on ``model_dir`` (CPU) with a LoRE bank of ``rank`` fitted on random-id traces."""
    from spice_core.engine import SpiceEngine
    from spice_core.lore import fit_lore_bank

    eng = SpiceEngine.load(model_dir, device="cpu")
    attach_lore(eng, fit_lore_bank(eng.lm, record_traces(eng.lm), rank))
    return eng
