"""Models by name on the command line, and the timing shape that belongs to each model."""
import json

import pytest

from spice_core.model.shipped import shipped
from spice_core.tools.cli import main
from tiny_models import build_qwen2_miniature, build_tiny


def _generate(capsys, *argv) -> dict:
    code = main(["generate", "--prompt", "the cat", "--max-new-tokens", "2", "--device", "cpu", "--timing",
                 "modeled", "--raw", "--json", *map(str, argv)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not shipped("spice-mini").present, reason="the shipped model is not in this checkout")
def test_generate_takes_a_shipped_models_name_and_times_it_at_its_own_shape(capsys):
    got = _generate(capsys, "--model", "spice-mini")["summary"]
    assert got["shape"] == "deepseek-v2-lite" and not any("sizes only" in n for n in got["notes"])
    other = _generate(capsys, "--model", "spice-mini", "--shape", "qwen2-57b-a14b")["summary"]
    assert any("qwen2-57b-a14b's sizes on spice-mini's routing, which is deepseek-v2-lite's" in n
               for n in other["notes"]), other["notes"]


def test_a_qwen2_miniatures_default_shape_is_qwen2_57b_a14b(capsys, tmp_path):
    d = build_qwen2_miniature(tmp_path / "spice-mini-qwen2", hidden_size=32, moe_intermediate_size=4,
                              shared_expert_intermediate_size=8)
    got = _generate(capsys, "--model", d)["summary"]
    assert got["shape"] == "qwen2-57b-a14b" and not any("sizes only" in n for n in got["notes"])


def test_a_checkpoint_that_stands_for_no_real_model_is_timed_at_its_own_sizes(capsys, tmp_path):
    """A checkpoint whose routing is no named real model's (a user's Mixtral, OLMoE, ... or, here, a tiny DeepSeek-V2)
    is modeled at its own sizes by default, in generate and on the app's pages, not at another model's; another shape
    stays one flag away and says it is sizes only."""
    from pages.common import default_settings
    from spice_core.api import default_shape
    from spice_core.engine import SpiceEngine

    d = build_tiny("deepseek_v2", tmp_path / "tiny")
    got = _generate(capsys, "--model", d)["summary"]
    assert got["shape"] == "native" and not any("sizes only" in n for n in got["notes"]), got
    info = SpiceEngine.load(d, device="cpu").info()
    assert default_shape(info) == "native" and default_settings(info).shape == "native"
    other = _generate(capsys, "--model", d, "--shape", "deepseek-v2-lite")["summary"]
    assert other["shape"] == "deepseek-v2-lite" and any("sizes only" in n for n in other["notes"])


def test_chat_on_a_model_without_a_chat_template_is_refused(tmp_path, capsys):
    """--chat on a tokenizer with no chat template ran the prompt as plain text without a word."""
    import json

    from cli_helpers import run_cli
    from tiny_models import build_tiny

    model = build_tiny("olmoe", tmp_path / "olmoe")
    cfg_path = model / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(cfg))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    code, _, err = run_cli(capsys, ["generate", "--model", model, "--device", "cpu", "--prompt", "hello", "--chat",
                                    "--max-new-tokens", 2])
    assert code == 2 and "--chat: this model's tokenizer has no chat template" in err and "Traceback" not in err
    code, _, _ = run_cli(capsys, ["generate", "--model", model, "--device", "cpu", "--prompt", "hello",
                                  "--max-new-tokens", 2])
    assert code == 0
