"""The model card: one renderer for both families, shape tables from the config, the real models'
numbers, hand-written sections kept, and the shipped cards rendered from their eval.json."""
from pathlib import Path

import pytest

from training.card_families import FAMILIES, family_for, shape_fields
from training.model_card import keep_unrendered_sections, main, shape_table
from training.model_config import build_config

ASSETS = Path(__file__).resolve().parents[2] / "assets"


def test_each_config_family_has_card_text():
    for name in ("mini", "qwen2-mini"):
        cfg = build_config(name, 8192, 512).to_dict()
        assert family_for(cfg) is FAMILIES[cfg["model_type"]]


def test_shape_table_reads_the_miniature_from_its_config_and_the_real_model_from_its_numbers():
    cfg = build_config("qwen2-mini", 8192, 512).to_dict()
    table = shape_table(FAMILIES["qwen2_moe"], cfg, {"parameters": 16_441_984, "checkpoint_bytes": 33_548_456}, 512)
    row = next(line for line in table.splitlines() if line.startswith("| hidden / expert width"))
    assert row == "| hidden / expert width / shared expert width | 128 / 16 / 128 | 3584 / 2560 / 20480 |"
    assert "| GQA, 2 query / 1 key-value heads of 128, q/k/v biases, rope theta 1,000,000 |" in table
    assert "| 16,441,984 / 33,548,456 | 57.4B / 115 GB |" in table


@pytest.mark.parametrize("model_type, builder", [("deepseek_v2", "deepseek_v2_lite_config"),
                                                 ("qwen2_moe", "qwen2_57b_a14b_config")])
def test_the_cards_real_model_numbers_are_the_benchmarks_real_configs(model_type, builder):
    from spice_core.tools import bench_models

    real_cfg = getattr(bench_models, builder)()
    family = FAMILIES[model_type]
    for key, value in family.real.items():
        if key not in ("model_type", "context", "size", "rope_parameters"):
            assert getattr(real_cfg, key) == value, key
    params = sum(bench_models.param_counts(real_cfg))
    assert family.real["size"] == f"{params / 1e9:.1f}B / {2 * params / 1e9:.0f} GB"
    assert shape_fields(family.real)["renorm"] == "no renormalisation"


def test_a_hand_written_section_is_kept_after_the_section_it_followed():
    old = "# card\n\nold intro\n\n## A\n\nold a\n\n## Notes\n\nby hand\n\n## B\n\nold b\n"
    new = "# card\n\nnew intro\n\n## A\n\nnew a\n\n## B\n\nnew b\n"
    assert keep_unrendered_sections(new, old) == (
        "# card\n\nnew intro\n\n## A\n\nnew a\n\n## Notes\n\nby hand\n\n## B\n\nnew b\n")
    assert keep_unrendered_sections(new, new) == new


@pytest.mark.parametrize("name", ["spice-mini", "spice-mini-qwen2"])
def test_the_shipped_card_is_rendered_from_its_eval_json(name, tmp_path):
    folder = ASSETS / name
    if not all((folder / name).exists() for name in ("config.json", "eval.json", "README.md")):
        pytest.skip(f"assets/{folder.name} has no model card in this checkout")
    main(["--model", str(folder), "--render-only", "--out", str(tmp_path)])
    assert (tmp_path / "README.md").read_text() == (folder / "README.md").read_text()
