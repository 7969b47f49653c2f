"""Fixtures for the shipped models: each loaded once per test session (about a second)."""
import json
from pathlib import Path

import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
SHIPPED = ASSETS / "spice-mini"
SHIPPED_QWEN2 = ASSETS / "spice-mini-qwen2"


def _present(folder: Path) -> Path:
    if not (folder / "config.json").exists():
        pytest.skip(f"assets/{folder.name} is not in this checkout")
    return folder


def _model(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder)).eval()


@pytest.fixture(scope="session")
def shipped_dir() -> Path:
    return _present(SHIPPED)


@pytest.fixture(scope="session")
def shipped_eval(shipped_dir) -> dict:
    return json.loads((shipped_dir / "eval.json").read_text())


@pytest.fixture(scope="session")
def shipped_model(shipped_dir):
    return _model(shipped_dir)


@pytest.fixture(scope="session")
def shipped_tokenizer(shipped_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(shipped_dir))


@pytest.fixture(scope="session")
def qwen2_dir() -> Path:
    folder = _present(SHIPPED_QWEN2)
    if not (folder / "eval.json").exists():
        pytest.skip("assets/spice-mini-qwen2 has no eval.json yet (python -m training.model_card)")
    return folder


@pytest.fixture(scope="session")
def qwen2_eval(qwen2_dir) -> dict:
    return json.loads((qwen2_dir / "eval.json").read_text())


@pytest.fixture(scope="session")
def qwen2_model(qwen2_dir):
    return _model(qwen2_dir)
