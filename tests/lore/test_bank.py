"""LoreBank: device bytes at the active rank, budget charging, the safetensors file and its checks."""
import json
import math
import struct

import pytest
import torch

from spice_core.errors import ArtifactError
from spice_core.lore import load_lore_bank, save_lore_bank
from spice_core.timing.profiles import get_shape
from spice_core.types import ExpertKey
from lore_support import build_tiny


def test_nbytes_counts_the_active_rank_only(lore_engines):
    eng, _ = lore_engines["deepseek_v2"]
    lm, bank = eng.lm, eng.artifacts.lore
    E, H = lm.n_experts, lm.layout.hidden
    for r in (1, 4, 8):
        sub = bank.with_rank(r)
        assert sub.rank == r and sub.max_rank == 8
        # per expert: gate and up rows [2r,H], output projection [r,H], intercept [H], shared share [1]
        assert sub.nbytes == len(lm.moe_layers) * E * (3 * r * H + H + 1) * 4


def test_budget_charges_the_modeled_shapes_size(lore_engines):
    eng, _ = lore_engines["deepseek_v2"]
    lm, bank = eng.lm, eng.artifacts.lore.with_rank(4)
    shape = get_shape("deepseek-v2-lite")
    per_expert = (3 * 4 * 2048 + 2048 + 1) * 2
    want = math.ceil(len(lm.moe_layers) * lm.n_experts * per_expert / shape.expert_bytes * lm.layout.nbytes)
    assert bank.budget_bytes(lm.layout.nbytes, shape) == want
    assert bank.budget_bytes(lm.layout.nbytes, eng.native_shape) == bank.nbytes
    # a rank-4 surrogate is ~0.3% of a DeepSeek-V2-Lite expert but 75% of a 16-wide one
    assert bank.budget_bytes(lm.layout.nbytes, shape) < 0.01 * len(lm.host) * lm.layout.nbytes < bank.nbytes


def test_engine_counts_lore_inside_the_cache_budget(lore_engines):
    from spice_core.api import RunSettings

    eng, _ = lore_engines["mixtral"]
    s = RunSettings(policy="spice", cache_frac=0.9, shape="native", tau_approx=0.1, lore_rank=2)
    with_lore = eng.build_runtime(s, notes=[], modeled=True).slots.n_slots
    without = eng.build_runtime(RunSettings(policy="spice_no_lore", cache_frac=0.9, shape="native"), notes=[],
                                modeled=True).slots.n_slots
    lore_bytes = eng.artifacts.lore.with_rank(2).nbytes
    assert without - with_lore == math.ceil(lore_bytes / eng.lm.layout.nbytes)


def test_save_and_load_round_trip_exactly_without_pickles(lore_engines, tmp_path):
    eng, traces = lore_engines["qwen2_moe"]
    bank = eng.artifacts.lore
    path = save_lore_bank(bank, tmp_path / "spice-lore.safetensors")
    raw = path.read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])     # plain safetensors header
    assert header["__metadata__"]["format"] == "spice-lore" and b"pickle" not in raw
    back = load_lore_bank(path, eng.lm)
    assert back.max_rank == bank.max_rank and back.info == bank.info
    x = traces.hidden_by_layer()[eng.lm.moe_layers[1]][:7].float()
    for r in (1, 8):
        key = ExpertKey(eng.lm.moe_layers[1], 5)
        assert torch.equal(back.with_rank(r).apply(key, x), bank.with_rank(r).apply(key, x))


def test_missing_or_corrupted_lore_file_names_the_calibrate_command(lore_engines, tmp_path):
    eng, _ = lore_engines["olmoe"]
    with pytest.raises(ArtifactError, match=r"no LoRE factors at .*python -m spice_core calibrate --model M"):
        load_lore_bank(tmp_path / "nope.safetensors", eng.lm)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(ArtifactError, match="unreadable.*calibrate --model M"):
        load_lore_bank(bad, eng.lm)


def test_lore_file_of_another_model_is_refused(lore_engines, tmp_path):
    from spice_core.engine import SpiceEngine

    eng, _ = lore_engines["olmoe"]
    path = save_lore_bank(eng.artifacts.lore, tmp_path / "lore.safetensors")
    other_shape = lore_engines["qwen2_moe"][0]
    with pytest.raises(ArtifactError, match="another model shape.*calibrate --model M"):
        load_lore_bank(path, other_shape.lm)
    retrained = SpiceEngine.load(build_tiny("olmoe", tmp_path / "olmoe-seed1", seed=1), device="cpu")
    with pytest.raises(ArtifactError, match="built for another model \\(its weights differ.*calibrate --model M"):
        load_lore_bank(path, retrained.lm)


def test_lore_file_of_another_format_version_is_refused(lore_engines, tmp_path):
    from safetensors.torch import save_file

    eng, _ = lore_engines["olmoe"]
    path = tmp_path / "old.safetensors"
    save_file({"x": torch.zeros(1)}, str(path), metadata={"format": "spice-lore", "version": "0"})
    with pytest.raises(ArtifactError, match="format version 0.*calibrate"):
        load_lore_bank(path, eng.lm)


@pytest.mark.parametrize("family", ["deepseek_v2", "qwen2_moe", "shipped"])
def test_the_fast_path_s_batched_surrogates_equal_the_eager_bank_s(lore_engines, family):
    """FASTPATH H7: the graphed step computes every selection's surrogate in one batch (graphed_step.SlotExpertStep.lore_out),
    the eager path one expert at a time (LoreBank.apply). They are one function: equal to float rounding for
    every expert of every layer, shared-expert term included."""
    import torch

    from spice_core.runtime.graphed import GraphedDecoder
    from spice_core.types import ExpertKey

    from spice_core.engine import SpiceEngine

    eng = SpiceEngine.load(None, device="cpu") if family == "shipped" else lore_engines[family][0]
    lm, bank = eng.lm, eng.artifacts.lore
    if family == "shipped":          # its fitted factors use the shared expert: the α·S(x) term is compared too
        assert any(a != 0 for al in bank._alpha_host.values() for a in al)
    buf = torch.zeros((lm.top_k, lm.layout.numel), dtype=lm.layout.dtype)
    dec = GraphedDecoder(lm, buf, None, 16, use_graphs=False, lore=bank)
    act = lm.experts_modules[lm.moe_layers[0]].act_fn
    g = torch.Generator().manual_seed(0)
    for i, layer in enumerate(lm.moe_layers):
        x = torch.randn(1, lm.layout.hidden, generator=g).to(lm.model.dtype)
        experts = torch.arange(lm.n_experts)
        with torch.no_grad():
            batched = dec.experts.lore_out(i, x, experts, act).to(x.dtype)
        for e in range(lm.n_experts):
            one = bank.apply(ExpertKey(layer, e), x)
            # bf16 factors (the shipped model's) round each op's result: a last-place difference may surface
            tol = 2 ** -7 if bank.dtype in (torch.bfloat16, torch.float16) else 1e-5
            ref = one[0].float()
            assert torch.allclose(batched[e].float(), ref, rtol=tol, atol=tol * float(ref.abs().max())), (layer, e)


def test_a_broken_lore_file_and_a_rank_above_its_factors_name_the_command_for_where_they_are(lore_engines, tmp_path):
    """Regression (review): the LoRE bank's messages said `calibrate --model M` (no model, and no --out for factors
    kept in an --artifacts folder), while the draft's and the calibration's named both."""
    from spice_core.errors import ConfigError
    from spice_core.predictor.artifacts import LORE_FILE, load_artifacts_if_present

    eng, _ = lore_engines["deepseek_v2"]
    fix = f"python -m spice_core calibrate --model {eng.lm.path}"
    beside = save_lore_bank(eng.artifacts.lore, tmp_path / LORE_FILE)
    apart = tmp_path / "arts"
    apart.mkdir()
    beside.rename(apart / LORE_FILE)
    bank = load_artifacts_if_present(eng.lm, apart).lore
    with pytest.raises(ConfigError) as e:
        bank.with_rank(bank.max_rank + 1)
    assert f"{fix} --out {apart} --lore-max-rank {bank.max_rank + 1}" in str(e.value)
    (apart / LORE_FILE).write_bytes((apart / LORE_FILE).read_bytes()[:100])
    with pytest.raises(ArtifactError, match="unreadable") as e:
        load_artifacts_if_present(eng.lm, apart)
    assert f"{fix} --out {apart}" in str(e.value) and "--model M" not in str(e.value)


def test_the_engines_notes_for_artifacts_in_their_own_folder_name_that_folder(lore_engines, tmp_path):
    """Regression (review): with `--artifacts A` the notes said to refit with `calibrate --model M --lore-only`, which
    fails (--lore-only needs the draft heads, kept in A): they now say `--out A`, as every other hint does."""
    from spice_core.api import RunSettings
    from spice_core.engine import SpiceEngine
    from spice_core.predictor.artifacts import LORE_FILE

    eng, _ = lore_engines["deepseek_v2"]
    apart = tmp_path / "arts"
    apart.mkdir()
    save_lore_bank(eng.artifacts.lore, apart / LORE_FILE)         # rank 8: below the default's "up to 16"
    other = SpiceEngine.load(eng.lm.path, device="cpu", artifacts=apart)
    notes = []
    other.build_runtime(RunSettings(policy="spice", tau_approx=0.1), notes=notes, modeled=True)
    fix = f"python -m spice_core calibrate --model {eng.lm.path} --out {apart}"
    # The rank-8 factors under the default "up to 16" are used whole: said, with nothing to refit (review).
    assert any(n.startswith("LoRE at rank 8") and "calibrate" not in n for n in notes), notes
    assert any("no draft artifacts" in n and fix in n for n in notes), notes
