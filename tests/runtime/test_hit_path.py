"""The one-call path for a token's all-hit layers (LayerPlanner.plan_hits, EagerExecutor.run_hits) changes nothing
a run reports: the same tokens, logits, outcomes and trace events as planning and running every layer in phases."""
import pytest
import torch

from spice_core.api import RunSettings
from spice_core.policy.planner import LayerPlanner

PROMPT = [3, 14, 15, 9, 26, 5]


def _run(eng, policy):
    run = eng.start_ids(PROMPT, RunSettings(policy=policy, cache_frac=0.5, max_new_tokens=10))
    logits = []
    steps = []
    for st in run:
        steps.append(st)
        logits.append(run.last_logits.clone())
    return steps, logits, [e.as_dict() for e in eng.get_events(run.run_id)]


def _assert_same_report(fast_steps, fast_logits, fast_events, steps, logits, events) -> None:
    """Two runs of one prompt (with and without the hit path) report the same tokens, logits, outcomes, step
    stats and trace events."""
    assert [s.token_id for s in fast_steps] == [s.token_id for s in steps]
    assert all(torch.equal(a, b) for a, b in zip(fast_logits, logits))
    assert [s.outcomes for s in fast_steps] == [s.outcomes for s in steps]
    assert [(s.hits, s.misses, s.step_ms, s.intervals) for s in fast_steps] == \
        [(s.hits, s.misses, s.step_ms, s.intervals) for s in steps]
    assert fast_events == events


@pytest.mark.parametrize("family", ["deepseek_v2", "qwen2_moe"])
@pytest.mark.parametrize("policy", ["resident", "lru", "cpu_compute"])
def test_hit_path_reports_what_the_phases_report(engines, monkeypatch, family, policy):
    eng = engines[family]
    calls = []
    real = LayerPlanner.plan_hits
    monkeypatch.setattr(LayerPlanner, "plan_hits", lambda self, layer, ids: calls.append(r := real(self, layer, ids)) or r)
    fast_steps, fast_logits, fast_events = _run(eng, policy)
    assert any(c is not None for c in calls)          # the hit path ran
    monkeypatch.setattr(LayerPlanner, "plan_hits", lambda self, layer, ids: None)
    _assert_same_report(fast_steps, fast_logits, fast_events, *_run(eng, policy))


@pytest.mark.parametrize("policy", ["resident", "lru"])
def test_the_fast_paths_host_step_takes_the_hit_path_and_reports_the_same(engines, monkeypatch, policy):
    """The graphed executor's per-layer host step (LayerRuntime.decide_layer), run op by op on the CPU."""
    from spice_core.engine import SpiceEngine

    from spice_core.runtime.copies import CopyEngine
    from spice_core.runtime.layer import LayerRuntime

    base = engines["qwen2_moe"]
    eng = SpiceEngine(base.lm, executor="graphed", timing=base.timing)
    calls, waits, observed = [], [], []
    real = LayerPlanner.plan_hits
    monkeypatch.setattr(LayerPlanner, "plan_hits", lambda self, layer, ids: calls.append(r := real(self, layer, ids)) or r)
    real_wait = CopyEngine.wait_ready   # on a GPU a missing or reordered wait is a race: compare the calls
    monkeypatch.setattr(CopyEngine, "wait_ready", lambda self, slot: waits.append(slot) or real_wait(self, slot))
    real_init = LayerRuntime.__init__

    def observed_init(self, *a, **kw):
        real_init(self, *a, **kw)
        self.layer_observers.append(lambda rt, layer: observed.append(layer))

    monkeypatch.setattr(LayerRuntime, "__init__", observed_init)
    fast_steps, fast_logits, fast_events = _run(eng, policy)
    assert any(c is not None for c in calls)          # the hit path ran
    assert any(n.startswith("fast path:") for n in eng.list_runs()[0].notes)
    fast_waits, fast_observed = list(waits), list(observed)
    waits.clear()
    observed.clear()
    monkeypatch.setattr(LayerPlanner, "plan_hits", lambda self, layer, ids: None)
    slow = _run(eng, policy)
    assert fast_waits == waits and fast_observed == observed and observed
    _assert_same_report(fast_steps, fast_logits, fast_events, *slow)


@pytest.mark.parametrize("policy", ["lru", "on_demand"])
def test_the_host_step_records_each_layer_after_it_returns_and_before_the_next(engines, monkeypatch, policy):
    """The graphed host step leaves a layer's recording (outcomes, observers) to the after-replay hook, so the
    GPU need not wait for it: each decided layer is recorded exactly once, after its decide_layer returned and
    before the next layer is decided, and the run reports what it reported before (the test above)."""
    from spice_core.engine import SpiceEngine
    from spice_core.runtime.layer import LayerRuntime
    from spice_core.trace.recorder import Recorder

    base = engines["qwen2_moe"]
    eng = SpiceEngine(base.lm, executor="graphed", timing=base.timing)
    log = []
    real_decide = LayerRuntime.decide_layer

    def decide(self, layer, *a, **kw):
        log.append(("decide", layer))
        out = real_decide(self, layer, *a, **kw)
        log.append(("decided", layer))
        return out

    monkeypatch.setattr(LayerRuntime, "decide_layer", decide)
    for name in ("layer_outcomes", "layer_hits"):
        real = getattr(Recorder, name)
        monkeypatch.setattr(Recorder, name, lambda self, layer, *a, _real=real: log.append(("record", layer))
                            or _real(self, layer, *a))
    steps, _, _ = _run(eng, policy)
    assert any(n.startswith("fast path:") for n in eng.list_runs()[0].notes)
    decode = log[next(i for i, x in enumerate(log) if x[0] == "decide"):]   # the prefill records per layer, eagerly
    decided = [x for x in decode if x[0] == "decided"]
    assert decided and len([x for x in decode if x[0] == "record"]) == len(decided)
    for i, (kind, layer) in enumerate(decode):
        if kind == "decided":
            nxt = next((k for k in decode[i + 1:] if k[0] != "decided"), None)
            assert nxt == ("record", layer), f"layer {layer}: recorded out of turn ({nxt})"
    assert sum(s.hits + s.misses for s in steps[1:]) > 0
