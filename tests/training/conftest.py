"""Fixtures for the shipped model: loaded once per test session (about a second)."""
import json
from pathlib import Path

import pytest

SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "spice-mini"


@pytest.fixture(scope="session")
def shipped_dir() -> Path:
    if not (SHIPPED / "config.json").exists():
        pytest.skip("assets/spice-mini is not in this checkout")
    return SHIPPED


@pytest.fixture(scope="session")
def shipped_eval(shipped_dir) -> dict:
    return json.loads((shipped_dir / "eval.json").read_text())


@pytest.fixture(scope="session")
def shipped_model(shipped_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(shipped_dir)).eval()


@pytest.fixture(scope="session")
def shipped_tokenizer(shipped_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(shipped_dir))
