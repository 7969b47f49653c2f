"""The shipped models' table (spice_core/model/shipped.py) against their folders: each miniature routes as
its real model (so its own timing shape is the table's), lifts into it, and has its held-out data beside it.
Checks of a folder that is not in this checkout use the documented config instead (tiny_models)."""
import json

import pytest
from transformers import AutoConfig

from spice_core.heldout import HELDOUT_FILENAME
from spice_core.model.shipped import SHIPPED, present_models
from spice_core.timing.profiles import routing_shape
from tiny_models import qwen2_miniature_config


def _config(model):
    if model.present:
        return AutoConfig.from_pretrained(str(model.folder))
    if model.name == "spice-mini-qwen2":
        return qwen2_miniature_config()
    pytest.skip(f"{model.name} is not in this checkout")


def _routing(cfg) -> tuple:
    if cfg.model_type == "deepseek_v2":
        return "deepseek_v2", cfg.num_hidden_layers - cfg.first_k_dense_replace, cfg.n_routed_experts, \
            cfg.num_experts_per_tok
    moe = [i for i in range(cfg.num_hidden_layers) if i not in cfg.mlp_only_layers]
    return cfg.model_type, len(moe), cfg.num_experts, cfg.num_experts_per_tok


@pytest.mark.parametrize("model", SHIPPED, ids=lambda m: m.name)
def test_each_shipped_model_routes_as_the_real_model_of_its_shape_and_lifts_into_it(model):
    from spice_core.tools.lift import lift_config

    cfg = _config(model)
    assert routing_shape(*_routing(cfg)) == model.shape
    lifted = lift_config(cfg)
    assert routing_shape(*_routing(lifted)) == model.shape


def test_the_default_model_is_the_first_shipped_one():
    from spice_core.model.loader import DEFAULT_MODEL_DIR

    assert DEFAULT_MODEL_DIR == SHIPPED[0].folder


@pytest.mark.parametrize("model", present_models(), ids=lambda m: m.name)
def test_a_shipped_model_has_its_heldout_data_beside_it(model):
    """Bench's {"heldout": N} prompts, the long prompt and calibration read this file from the model's own folder."""
    assert (model.folder / HELDOUT_FILENAME).is_file(), (
        f"{model.folder.name} lacks {HELDOUT_FILENAME}: write it with python -m training.export_heldout "
        f"--model-dir assets/{model.name}")
    assert json.loads((model.folder / "config.json").read_text())["architectures"]
