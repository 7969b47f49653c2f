"""The confirmation's chat requests (tools.quality.chat_requests, eval_set(chat_prompts=True)): on the shipped model,
held-out chat requests sent through its chat template as a chat sends them, none of them the chat page's examples;
on a model without held-out data, the built-in prompts as chat requests."""
from pathlib import Path

import pytest

from spice_core.generation import build_prompt_ids
from spice_core.tools import quality as q

SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "spice-mini"


@pytest.fixture(scope="module")
def shipped():
    if not (SHIPPED / "config.json").exists():
        pytest.skip("the shipped model is not in assets/spice-mini")
    from spice_core.engine import SpiceEngine

    return SpiceEngine.load(None, device="cpu")


def test_chat_prompts_are_held_out_requests_through_the_chat_template(shipped):
    from pages.chat import EXAMPLES
    from spice_core import heldout

    data = q.eval_set(shipped, max_tokens=32, window=32, n_prompts=4, chat_prompts=True)
    asked = [p["chat"] for p in heldout.prompts(64) if "chat" in p][:4]
    tok = shipped.lm.tokenizer
    assert [list(p) for p in data.prompts] == [
        build_prompt_ids(tok, messages=[{"role": "user", "content": m}]) for m in asked]
    assert "4 held-out chat requests, chat template" in data.source
    assert not set(asked) & {e.rstrip(".") for e in EXAMPLES} and not set(asked) & set(EXAMPLES)
    assert all(tok.decode(p).rstrip().endswith("<|assistant|>") for p in data.prompts)


def test_without_held_out_requests_the_built_in_prompts_are_sent_as_chat_requests(engines):
    from spice_core import heldout

    engine = engines["deepseek_v2"]
    if engine.lm.tokenizer is None:
        pytest.skip("the tiny model has no tokenizer")
    ids, what = q.chat_requests(engine, 2)
    assert what == "2 built-in prompts sent as chat requests, chat template"
    assert ids == [build_prompt_ids(engine.lm.tokenizer, messages=[{"role": "user", "content": m}])
                   for m in heldout.DEFAULT_PROMPTS[:2]]
