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


# bf16 keeps 8 significant bits, so logits between 16 and 32 (this size of model's) step by 0.125; CPUs'
# kernels (AVX2, AVX-512, AMX) round differently, and a KV-cached step differs from a full pass in the
# last bits. Two steps of that size: a token this close to the best is tied with it.
TIE_LOGITS = 0.25


def _shortfalls(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """How far each of `tokens` falls short of the model's best logit at its position, teacher-forced
    after `prompt` in one full pass (0.0 where it is the argmax)."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()
    chosen = logits.gather(1, torch.tensor(tokens)[:, None])[:, 0]
    return (logits.max(-1).values - chosen).tolist()


@pytest.fixture(scope="session")
def greedy_up_to_ties():
    """check(model, prompt_ids, tokens): asserts every token is the model's greedy choice after the
    tokens before it, up to a bf16 tie (TIE_LOGITS). Computed here, on this CPU, so a sequence recorded
    on another machine passes exactly when it is one of this model's greedy paths: a near-tie broken the
    other way changes later tokens, never the margin test, and a card from other weights fails it."""
    def check(model, prompt: list[int], tokens: list[int]) -> None:
        short = _shortfalls(model, prompt, tokens)
        worst = max(range(len(short)), key=short.__getitem__)
        assert short[worst] <= TIE_LOGITS, (f"token {worst} ({tokens[worst]}) is {short[worst]:.3f} below "
                                            f"the best logit: not a greedy choice of this model")
    return check
