"""Fixtures for the command-line tests: one tiny checkpoint, and a guard that no model is loaded."""

import pytest

from tiny_models import build_tiny


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return build_tiny("mixtral", tmp_path_factory.mktemp("cli-tiny") / "mixtral")


class LongWorkStarted(AssertionError):
    pass


@pytest.fixture
def no_long_work(monkeypatch):
    """Fail the test if a command starts loading or building a model (errors must come first)."""
    import transformers

    import spice_core.tools.bench as bench
    import spice_core.tools.bench_models as bench_models
    import spice_core.model.loader as loader
    from spice_core.engine import SpiceEngine

    def boom(*a, **k):
        raise LongWorkStarted("a model was loaded before the bad input was refused")

    monkeypatch.setattr(SpiceEngine, "load", classmethod(boom))
    monkeypatch.setattr(loader, "load_model", boom)
    monkeypatch.setattr(bench, "run_bench", boom)
    monkeypatch.setattr(bench_models, "random_model", boom)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", boom)
