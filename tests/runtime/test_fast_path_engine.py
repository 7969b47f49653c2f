"""The engine on its fast path (GraphExecutor): every exact policy gives the same tokens, bit for bit, as
`resident` on the same path, in all five families; what the fast path cannot run falls back to the
eager executor with a note. On the CPU the graphed step runs op by op; on a GPU it replays CUDA graphs."""

import gc
import weakref

import pytest
import torch

from tiny_models import FAMILIES, build_tiny

from spice_core.api import RunSettings
from spice_core.engine import SpiceEngine

PROMPTS = ([5, 17, 33, 2, 9, 41, 7], [3, 14, 15, 9, 26, 5, 35, 8])
EXACT = ("lru", "on_demand", "gate_prefetch", "oracle_prefetch")


def _tokens(eng, ids, policy, n=12, **kw):
    run = eng.start_ids(ids, RunSettings(policy=policy, cache_frac=0.3, max_new_tokens=n, cpu_lane=False, **kw))
    toks = [s.token_id for s in run]
    return toks, eng.get_summary(run.run_id)


@pytest.fixture(scope="module")
def graphed(tmp_path_factory):
    root = tmp_path_factory.mktemp("fast")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return {f: SpiceEngine.load(build_tiny(f, root / f), device=device, executor="graphed") for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_exact_policies_are_bitwise_identical_to_resident_on_the_fast_path(graphed, family):
    eng = graphed[family]
    for ids in PROMPTS:
        ref, summary = _tokens(eng, ids, "resident")
        assert any(n.startswith("fast path:") for n in summary.notes), summary.notes
        for policy in ("lru", "on_demand", "oracle_prefetch"):
            toks, s = _tokens(eng, ids, policy)
            assert toks == ref, (policy, s.notes)
            assert any(n.startswith("fast path:") for n in s.notes), s.notes


def test_what_the_fast_path_cannot_run_falls_back_to_eager_with_a_note(graphed):
    eng = graphed["deepseek_v2"]
    _, s = _tokens(eng, PROMPTS[0], "gate_prefetch")
    assert any("fast path off" in n and "eager" in n for n in s.notes), s.notes
    run = eng.start_ids(PROMPTS[0], RunSettings(policy="cpu_compute", cache_frac=0.3, max_new_tokens=4))
    list(run)
    assert any("fast path off" in n for n in eng.get_summary(run.run_id).notes)


def test_fast_path_matches_the_eager_executor_on_hits_and_misses_per_step(graphed):
    """Same decisions on both executors while the tokens agree (the planner is shared)."""
    eng = graphed["qwen2_moe"]
    eager = SpiceEngine(eng.lm, executor="eager", timing=eng.timing)
    a, sa = _tokens(eng, PROMPTS[1], "lru", n=8)
    b, sb = _tokens(eager, PROMPTS[1], "lru", n=8)
    if a == b:
        assert sa.hit_rate == sb.hit_rate


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_fast_path_replays_cuda_graphs(graphed):
    _, s = _tokens(graphed["mixtral"], PROMPTS[0], "lru")
    assert any("replay CUDA graphs" in n for n in s.notes), s.notes


def test_spice_approximates_with_lore_on_the_fast_path_and_says_its_cpu_lane_is_off():
    """The shipped model's LoRE factors run as a branch of the graphed expert step."""
    cuda = torch.cuda.is_available()
    shipped = SpiceEngine.load(None, device="cuda" if cuda else "cpu", executor="graphed")
    # Measured on a GPU the miniature is sized at its own shape, where the draft heads and LoRE factors take
    # 0.009 GB of the budget: half the experts' 0.0154 GB would leave no slot for them (a ConfigError).
    run = shipped.start_prompt("Tell me a story about a cat and a ball",
                               RunSettings(policy="spice", cache_frac=0.9 if cuda else 0.5, tau_approx=0.05,
                                           max_new_tokens=12))
    steps = list(run)
    s = shipped.get_summary(run.run_id)
    assert s.miss_split["approx"] > 0 and s.miss_split["cpu"] == 0
    assert any("CPU lane runs on the eager executor only" in n for n in s.notes), s.notes
    assert any(n.startswith("fast path: decode steps") for n in s.notes), s.notes
    assert s.text.strip() and len(steps) == 12


def test_a_finished_or_cancelled_run_frees_its_slot_buffer_at_once(graphed, monkeypatch):
    """The decoder, its hook and the executor refer to each other; a run must not leave its expert cache
    (23 GiB per run at full scale) to the cyclic garbage collector, or a few runs in a row fill the GPU."""
    from spice_core.runtime import slots

    made = []
    init = slots.SlotBuffer.__init__

    def recording_init(self, *a, **kw):
        init(self, *a, **kw)
        made.append(weakref.ref(self.buffer))

    monkeypatch.setattr(slots.SlotBuffer, "__init__", recording_init)
    eng = graphed["qwen2_moe"]
    gc.disable()
    try:
        _tokens(eng, PROMPTS[0], "lru", n=4)
        run = eng.start_ids(PROMPTS[1], RunSettings(policy="on_demand", cache_frac=0.3, max_new_tokens=8, cpu_lane=False))
        steps = iter(run)
        next(steps)
        run.cancel()
        list(steps)
        del run, steps
        assert len(made) == 2 and all(ref() is None for ref in made)
    finally:
        gc.enable()

