"""The prefetch admission on the shipped model: spice skips confident predictions it would approximate, says so
in the run's notes and counts them; the old rule and exact policies skip none."""
from __future__ import annotations

import pytest

from spice_core.api import RunSettings
from spice_core.engine import SpiceEngine

PROMPT = "Tell me a story about a cat and a ball"


@pytest.fixture(scope="module")
def engines():
    exact = SpiceEngine.load(None, device="cpu")
    every = SpiceEngine(exact.lm, timing="modeled", prefetch_admission="all")
    every.artifacts = exact.artifacts
    return exact, every


def _run(eng, policy):
    run = eng.start_prompt(PROMPT, RunSettings(policy=policy, cache_frac=0.25, tau_approx=0.05, max_new_tokens=12))
    steps = list(run)
    rec = eng.get_record(run.run_id)
    return steps, rec


def test_spice_skips_predictions_it_would_approximate_and_says_so(engines):
    exact, every = engines
    _, rec = _run(exact, "spice")
    assert rec.totals.get("prefetch_skipped_approx", 0) > 0
    assert any(n.startswith("prefetch admission:") for n in rec.notes), rec.notes
    _, old = _run(every, "spice")
    assert old.totals.get("prefetch_skipped_approx", 0) == 0
    assert not any(n.startswith("prefetch admission:") for n in old.notes)


def test_an_exact_prefetching_policy_copies_every_confident_prediction(engines):
    exact, _ = engines
    steps, rec = _run(exact, "spice_prefetch")
    assert rec.totals.get("prefetch_skipped_approx", 0) == 0
    assert not any(n.startswith("prefetch admission:") for n in rec.notes)


def test_an_unknown_admission_is_refused_with_the_choices(engines):
    from spice_core.errors import ConfigError

    exact, _ = engines
    with pytest.raises(ConfigError, match="exact, all"):
        SpiceEngine(exact.lm, timing="modeled", prefetch_admission="most")
