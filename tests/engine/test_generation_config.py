"""The checkpoint's generation_config: the repetition penalty `generate` applies by default (Qwen's chat checkpoints
ship one) is applied by the engine too, greedy tokens identical to stock; settings that change greedy tokens and
that the engine does not apply are named in the run's notes."""
import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from spice_core.api import RunSettings
from spice_core.engine import SpiceEngine
from spice_core.generation import unapplied_generation_fields
from tiny_models import build_tiny

PROMPT = [5, 17, 33, 2, 9, 41, 7, 5, 17]
PENALTY = 1.5
N = 24


@pytest.fixture(scope="module")
def penalised_dir(tmp_path_factory):
    d = build_tiny("qwen2_moe", tmp_path_factory.mktemp("penalty") / "qwen2_moe")
    cfg = GenerationConfig.from_pretrained(d)
    cfg.repetition_penalty = PENALTY
    cfg.save_pretrained(d)
    return d


def _stock(d, **kw) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(d).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=N, min_new_tokens=N, do_sample=False,
                             pad_token_id=0, **kw)
    return out[0, len(PROMPT):].tolist()


@pytest.mark.parametrize("executor", ["eager", "graphed"])
def test_checkpoint_repetition_penalty_is_applied_as_generate_does(penalised_dir, executor):
    stock = _stock(penalised_dir)                          # generate reads the checkpoint's penalty
    plain = _stock(penalised_dir, repetition_penalty=1.0)
    assert stock != plain                                  # the penalty changes this model's greedy tokens
    eng = SpiceEngine.load(penalised_dir, device="cpu", executor=executor)
    for policy in ("resident", "lru"):
        run = eng.start_ids(PROMPT, RunSettings(policy=policy, cache_frac=0.4, max_new_tokens=N))
        assert [s.token_id for s in run] == stock, policy
        assert any(f"repetition penalty {PENALTY:g} from the checkpoint" in n for n in run.summary().notes)
    off = eng.start_ids(PROMPT, RunSettings(policy="lru", cache_frac=0.4, max_new_tokens=N, repetition_penalty=1.0))
    assert [s.token_id for s in off] == plain
    assert not any("repetition penalty" in n for n in off.summary().notes)


def test_a_run_setting_overrides_the_checkpoints_penalty(penalised_dir):
    eng = SpiceEngine.load(penalised_dir, device="cpu")
    run = eng.start_ids(PROMPT, RunSettings(policy="lru", cache_frac=0.4, max_new_tokens=N, repetition_penalty=1.2))
    assert [s.token_id for s in run] == _stock(penalised_dir, repetition_penalty=1.2)


@pytest.mark.parametrize("value", [0.0, -1.0, 11.0, "1.1", True])
def test_repetition_penalty_out_of_range_is_refused_by_name(value):
    from spice_core.errors import ConfigError

    with pytest.raises(ConfigError, match="repetition_penalty"):
        RunSettings(repetition_penalty=value)


def test_generation_settings_the_engine_does_not_apply_are_named():
    assert unapplied_generation_fields(GenerationConfig()) == []
    named = unapplied_generation_fields(GenerationConfig(no_repeat_ngram_size=3, suppress_tokens=[4]))
    assert named == ["no_repeat_ngram_size=3", "suppress_tokens=[4]"]
