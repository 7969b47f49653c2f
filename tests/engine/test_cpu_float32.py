"""A half-precision checkpoint on the CPU computes in float32 (bf16 matmuls are several times slower there) while
its budgets, byte counts and modeled times stay those of the checkpoint's dtype, as on a GPU."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from spice_core.api import RunSettings
from spice_core.engine import SpiceEngine
from tiny_models import build_tiny

PROMPT = [5, 17, 33, 2, 9, 41, 7]


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    """The tiny DeepSeek-V2 checkpoint saved in bfloat16, as the shipped model is."""
    root = tmp_path_factory.mktemp("bf16")
    src = build_tiny("deepseek_v2", root / "fp32")
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    model.save_pretrained(root / "bf16")
    for f in src.glob("tokenizer*"):
        (root / "bf16" / f.name).write_bytes(f.read_bytes())
    return root / "bf16"


@pytest.fixture(scope="module")
def engines(bf16_dir):
    """{"float32": the engine's CPU default, "bfloat16": the checkpoint's own dtype, asked for}."""
    return {"float32": SpiceEngine.load(bf16_dir, device="cpu"),
            "bfloat16": SpiceEngine.load(bf16_dir, device="cpu", dtype=torch.bfloat16)}


def test_cpu_computes_in_float32_and_accounts_in_the_checkpoints_dtype(engines):
    fp32, bf16 = engines["float32"].lm, engines["bfloat16"].lm
    assert fp32.layout.dtype == torch.float32 and fp32.model.dtype == torch.float32
    assert fp32.offload_dtype == torch.bfloat16 and bf16.offload_dtype is None
    assert fp32.expert_bytes == bf16.expert_bytes == fp32.layout.numel * 2
    assert engines["float32"].routed_bytes == engines["bfloat16"].routed_bytes == len(fp32.host) * fp32.expert_bytes
    assert engines["float32"].native_shape == engines["bfloat16"].native_shape
    assert engines["float32"].info().expert_bytes == fp32.layout.numel * 2


@pytest.mark.parametrize("shape", ["native", "deepseek-v2-lite"])
def test_float32_compute_keeps_the_cache_size_and_byte_counts_of_the_checkpoint(engines, shape):
    s = RunSettings(policy="lru", cache_frac=0.3, max_new_tokens=8, shape=shape)
    slots = {k: e.build_runtime(s, notes=[], modeled=True).slots.n_slots for k, e in engines.items()}
    assert slots["float32"] == slots["bfloat16"]
    eng = engines["float32"]
    steps = list(eng.start_ids(PROMPT, s))
    assert all(st.bytes_copied % eng.lm.expert_bytes == 0 for st in steps)
    assert sum(st.bytes_copied for st in steps) > 0
    totals = eng.get_record(eng.list_runs()[0].run_id).totals
    assert totals["expert_bytes"] == eng.lm.expert_bytes
    assert totals["cache_capacity_bytes"] == slots["float32"] * eng.lm.expert_bytes


def test_float32_engine_matches_stock_transformers_loaded_in_float32(engines, bf16_dir):
    model = AutoModelForCausalLM.from_pretrained(bf16_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=16, min_new_tokens=16, do_sample=False,
                             pad_token_id=0)
    ref = out[0, len(PROMPT):].tolist()
    for policy in ("resident", "lru", "on_demand"):
        run = engines["float32"].start_ids(PROMPT, RunSettings(policy=policy, cache_frac=0.3, max_new_tokens=16))
        assert [st.token_id for st in run] == ref, policy
