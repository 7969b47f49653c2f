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

    from spice_core.runtime.graph_exec import GraphExecutor
    from spice_core.runtime.layer import LayerRuntime

    base = engines["qwen2_moe"]
    eng = SpiceEngine(base.lm, executor="graphed", timing=base.timing)
    calls, waits, observed = [], [], []
    real = LayerPlanner.plan_hits
    monkeypatch.setattr(LayerPlanner, "plan_hits", lambda self, layer, ids: calls.append(r := real(self, layer, ids)) or r)
    real_wait = GraphExecutor.wait_ready   # on a GPU a missing or reordered wait is a race: compare the calls
    monkeypatch.setattr(GraphExecutor, "wait_ready", lambda self, slot: waits.append(slot) or real_wait(self, slot))
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
