"""The engine on its fast path (GraphExecutor): every exact policy gives the same tokens, bit for bit, as
`resident` on the same path, in all five families; a step that cannot be captured falls back to the
eager executor with a note. On the CPU the graphed step runs op by op; on a GPU it replays CUDA graphs."""

import dataclasses
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
    kw.setdefault("cpu_lane", False)
    run = eng.start_ids(ids, RunSettings(policy=policy, cache_frac=0.3, max_new_tokens=n, **kw))
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
        for policy in ("lru", "on_demand", "gate_prefetch", "oracle_prefetch"):
            toks, s = _tokens(eng, ids, policy)
            assert toks == ref, (policy, s.notes)
            assert any(n.startswith("fast path:") for n in s.notes), s.notes


@pytest.mark.parametrize("family", ("deepseek_v2", "qwen3_moe"))
def test_the_gate_predictor_runs_on_the_fast_path(graphed, family, monkeypatch):
    """gate_prefetch's next routers are captured into each segment (`GatePredictor.head_readback`, whose rows parse
    to the eager predictor's predictions: tests/predictor/test_gate_readback.py): the fast path runs it from the
    read-back rows and gives resident's tokens. (Its decisions may differ from the eager executor's: there the
    lookahead is planned before the layer's experts, here while the next segment runs.)"""
    from spice_core.predictor.gate import GatePredictor

    parsed = []
    real = GatePredictor.predictions_from_readback
    monkeypatch.setattr(GatePredictor, "predictions_from_readback",
                        lambda self, *a: parsed.append(real(self, *a)) or parsed[-1])
    # Every lookahead planned: on a GPU, measured costs judge the tiny model's plans not worth their host time.
    eng = SpiceEngine(graphed[family].lm, executor="graphed", timing=graphed[family].timing, host_aware=False)
    toks, s = _tokens(eng, PROMPTS[0], "gate_prefetch", n=8)
    assert any(n.startswith("fast path:") for n in s.notes) and not any("fast path off" in n for n in s.notes)
    assert any(parsed), "the fast path never parsed a gate prediction"
    assert toks == _tokens(eng, PROMPTS[0], "resident", n=8)[0]


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


@pytest.mark.parametrize("family", ("deepseek_v2", "mixtral"))
def test_resident_decodes_without_a_host_step_and_still_reports_every_layer(graphed, family, monkeypatch):
    """Every expert resident: each layer's plan row is computed on the device (one graph a step on a GPU), and the
    host hears of each layer once the step is done. Same tokens and outcomes as the segmented step, which the
    same decoder runs when the table is withheld."""
    from spice_core.runtime.graph_exec import GraphExecutor

    eng = graphed[family]
    seen = []
    real = GraphExecutor._static_slots
    monkeypatch.setattr(GraphExecutor, "_static_slots", lambda self, planner: seen.append(t := real(self, planner)) or t)
    static_run = eng.start_ids(PROMPTS[0], RunSettings(policy="resident", cache_frac=0.3, max_new_tokens=8,
                                                       cpu_lane=False))
    steps = list(static_run)
    assert seen and seen[-1] is not None
    n_moe, k = len(eng.lm.moe_layers), eng.lm.top_k
    assert all(len(st.outcomes) == n_moe * k and {o.outcome for o in st.outcomes} == {"hit"} for st in steps[1:])
    # Greedy: every decode step but the last launched the next one early (the first token is the prefill's).
    assert any(n.startswith("fast path: 6 steps launched before") and "0 of them rolled back" in n
               for n in eng.get_summary(static_run.run_id).notes), eng.get_summary(static_run.run_id).notes
    monkeypatch.setattr(GraphExecutor, "_static_slots", lambda self, planner: None)    # the segmented step
    run = eng.start_ids(PROMPTS[0], RunSettings(policy="resident", cache_frac=0.3, max_new_tokens=8, cpu_lane=False))
    segmented = list(run)
    assert [st.token_id for st in segmented] == [st.token_id for st in steps]
    assert [st.outcomes for st in segmented] == [st.outcomes for st in steps]
    if torch.cuda.is_available():
        assert any("one graph, no host step" in n for n in eng.get_summary(static_run.run_id).notes)


def test_spice_approximates_with_lore_on_the_fast_path():
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
    assert s.miss_split["approx"] > 0
    assert not any("eager executor only" in n for n in s.notes), s.notes
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



@pytest.mark.parametrize("family", ("deepseek_v2", "qwen2_moe"))
def test_the_cpu_lane_runs_inside_the_fast_path_and_gives_resident_s_tokens(graphed, family):
    """cpu_compute and spice_no_lore send exact misses to the CPU lane inside the graphed step: the host computes
    them from the slab on the hidden state the segment read back, and the next segment takes their outputs."""
    eng = graphed[family]
    for ids in PROMPTS:
        ref, _ = _tokens(eng, ids, "resident")
        toks, s = _tokens(eng, ids, "cpu_compute", cpu_lane=True)
        assert not any("fast path off" in n for n in s.notes), s.notes
        assert toks == ref, s.notes
        assert s.miss_split["cpu"] > 0 and s.miss_split["copy"] == 0


def test_spice_no_lore_orchestrates_misses_onto_the_cpu_lane_on_the_fast_path_and_stays_exact():
    """The shipped model has draft heads, so spice_no_lore runs the fast path with its lookahead and the lane."""
    cuda = torch.cuda.is_available()
    eng = SpiceEngine.load(None, device="cuda" if cuda else "cpu", executor="graphed")
    prompt = "Tell me a story about a cat and a ball"
    settings = dict(cache_frac=0.9 if cuda else 0.3, max_new_tokens=24, cpu_lane=True)
    ref = [s.token_id for s in eng.start_prompt(prompt, RunSettings(policy="resident", **settings))]
    run = eng.start_prompt(prompt, RunSettings(policy="spice_no_lore", **settings))
    toks = [s.token_id for s in run]
    s = eng.get_summary(run.run_id)
    assert any(n.startswith("fast path: decode steps") for n in s.notes), s.notes
    assert toks == ref
    assert s.miss_split["approx"] == 0


class _Failed:
    """A CPU-lane job that failed (as a dead worker's does): its result raises."""

    def __init__(self, err):
        self.err = err

    def result(self, timeout=None):
        raise self.err


@pytest.mark.parametrize("how", ("error", "stall"))
def test_a_failed_or_stalled_cpu_job_falls_back_to_a_copy_mid_token_and_the_tokens_stay_right(graphed, monkeypatch,
                                                                                               how):
    from spice_core.exec import cpu_lane as lane_mod
    from spice_core.runtime.cpu_jobs import CpuJobs

    eng = graphed["deepseek_v2"]
    ref, _ = _tokens(eng, PROMPTS[0], "resident")
    real_submit, calls = CpuJobs.submit, [0]
    stalled = lane_mod.CpuLane(workers=1, threads_per_worker=1, timeout_s=0.05) if how == "stall" else None

    def submit(self, key, xs, n, act, out_device, stream=None, decode=False, batch=1):
        calls[0] += 1
        if calls[0] % 3:                      # every job but one in three fails
            return real_submit(self, key, xs, n, act, out_device, stream=stream, decode=decode, batch=batch)
        op = self.clock.cpu_expert(key, n)
        if stalled is None:
            return op, _Failed(RuntimeError("CPU-lane worker died")), "exact"   # (op, job, kernel) as CpuJobs makes
        gate_up, down = self.lm.host.weights(key)
        return op, stalled.submit(xs, gate_up, down, act, out_device, stream=stream), "exact"   # as CpuJobs would

    def slow_expert(*a, **kw):
        import time
        time.sleep(0.3)                       # past the lane's 0.05 s timeout
        return lane_mod.__dict__["_real_expert_forward"](*a, **kw)

    monkeypatch.setattr(CpuJobs, "submit", submit)
    if stalled is not None:
        monkeypatch.setitem(lane_mod.__dict__, "_real_expert_forward", lane_mod.expert_forward)
        monkeypatch.setattr(lane_mod, "expert_forward", slow_expert)
    try:
        run = eng.start_ids(PROMPTS[0], RunSettings(policy="cpu_compute", cache_frac=0.3, max_new_tokens=12,
                                                    cpu_lane=True))
        toks = [st.token_id for st in run]
    finally:
        if stalled is not None:
            stalled.close()
    assert toks == ref
    failed = calls[0] // 3
    if how == "error" or not torch.cuda.is_available():
        assert run.record.totals["cpu_fallbacks"] == failed > 0      # each failed job was copied in instead
    else:       # on a GPU a stalled job whose result is needed only after it finished (in a prefill) is no failure
        assert 0 < run.record.totals["cpu_fallbacks"] <= failed


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the real CPU lane runs in measured timing, on a GPU")
def test_lane_offer_always_offers_the_lane_where_auto_does_not_and_stays_exact():
    """On the native link one CPU expert is slower than a copy, so "auto" keeps the lane off (and says so); "always"
    offers it anyway, for an A/B of that rule, and an exact policy's tokens stay resident's."""
    prompt = "Tell me a story about a cat and a ball"
    settings = dict(cache_frac=0.9, max_new_tokens=16, cpu_lane=True)
    notes = {}
    for offer in ("auto", "always"):
        eng = SpiceEngine.load(None, device="cuda", executor="graphed", lane_offer=offer)
        ref = [s.token_id for s in eng.start_prompt(prompt, RunSettings(policy="resident", **settings))]
        run = eng.start_prompt(prompt, RunSettings(policy="spice_no_lore", **settings))
        assert [s.token_id for s in run] == ref
        notes[offer] = eng.get_summary(run.run_id).notes
    assert any(n.startswith("CPU lane not offered") for n in notes["auto"]), notes["auto"]
    assert any("lane_offer=always" in n for n in notes["always"]), notes["always"]
    assert not any(n.startswith("CPU lane not offered") for n in notes["always"]), notes["always"]


def test_an_unknown_lane_offer_is_refused_with_the_choices():
    from spice_core.errors import ConfigError

    with pytest.raises(ConfigError, match="auto, always"):
        SpiceEngine.load(None, device="cpu", lane_offer="sometimes")


def test_an_unknown_copy_issue_is_refused_with_the_choices_before_the_model_loads(monkeypatch):
    from spice_core import engine as engine_mod
    from spice_core.errors import ConfigError

    monkeypatch.setattr(engine_mod, "load_model", lambda *a, **k: pytest.fail("the model was loaded first"))
    with pytest.raises(ConfigError, match="direct, torch"):
        SpiceEngine.load(None, device="cpu", copy_issue="fast")


def test_a_live_switch_to_sampling_stops_running_ahead_with_the_segmented_steps_tokens(graphed, monkeypatch):
    """`resident` decodes greedily, running each static step ahead; switched to sampling mid-run it stops (a
    sampled token is not the one a step run ahead took): the same tokens as the segmented step, same seed."""
    from spice_core.runtime.graph_exec import GraphExecutor

    eng = graphed["qwen2_moe"]
    greedy = RunSettings(policy="resident", cache_frac=0.3, max_new_tokens=10, cpu_lane=False)

    def tokens():
        torch.manual_seed(0)
        run = eng.start_ids(PROMPTS[1], greedy)
        toks = []
        for st in run:
            toks.append(st.token_id)
            if len(toks) == 4:
                run.update_settings(dataclasses.replace(greedy, temperature=1.5))
        return toks, eng.get_summary(run.run_id).notes

    ahead, notes = tokens()
    monkeypatch.setattr(GraphExecutor, "_static_slots", lambda self, planner: None)    # the segmented step
    segmented, _ = tokens()
    assert ahead == segmented
    assert any(n.startswith("fast path: 3 steps launched before") for n in notes), notes


def test_a_failed_capture_says_so_once_and_says_nothing_of_the_failed_build_twice(graphed, monkeypatch):
    """The eager build after a failed capture makes its own notes: the failed build's (here tau_int8's; on a GPU the
    slot copies' too) are not left beside them."""
    from spice_core.runtime.graph_exec import GraphExecutor
    from spice_core.runtime.graphed import GraphCaptureError

    def fail(self, rt):
        raise GraphCaptureError("capture refused for this test")

    monkeypatch.setattr(GraphExecutor, "attach", fail)
    eng = graphed["qwen2_moe"]
    toks, s = _tokens(eng, PROMPTS[0], "lru", tau_int8=0.1)
    assert toks
    assert sum(n.startswith("tau_int8 0.1 is ignored") for n in s.notes) == 1, s.notes
    assert [n for n in s.notes if n.startswith("fast path off")] == \
        ["fast path off: capture refused for this test; decode runs on the eager executor"], s.notes
    assert len(s.notes) == len(set(s.notes)), s.notes


@pytest.mark.parametrize("family", ("qwen2_moe", "mixtral"))
def test_a_repetition_penalty_gives_the_same_tokens_with_and_without_the_step_run_ahead(graphed, family):
    """`resident`'s one-graph step runs the next step ahead on the raw greedy token; a penalty that picks another
    token rolls it back. Its penalised tokens are lru's (segments, nothing run ahead), and the penalty changes them."""
    eng = graphed[family]
    for ids in PROMPTS:
        plain, _ = _tokens(eng, ids, "resident", n=16, repetition_penalty=1.0)
        ref, s = _tokens(eng, ids, "resident", n=16, repetition_penalty=3.0)
        assert any("fast path:" in n for n in s.notes), s.notes
        toks, _ = _tokens(eng, ids, "lru", n=16, repetition_penalty=3.0)
        assert toks == ref
        assert ref != plain
