"""validate_chrome_trace accepts well-formed traces and names each kind of defect."""
from __future__ import annotations

import copy

import pytest

from spice_core.trace.chrome_schema import MAX_PROBLEMS, validate_chrome_trace


def good_trace():
    return {
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "SPICE"}},
            {"ph": "M", "name": "process_sort_index", "pid": 1, "tid": 0, "args": {"sort_index": 0}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "gpu"}},
            {"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": 1, "args": {"sort_index": 1}},
            {"ph": "X", "name": "token 0", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0, "args": {}},
            {"ph": "X", "name": "layer", "pid": 1, "tid": 1, "ts": 10.0, "dur": 20.0},      # nested
            {"ph": "X", "name": "expert", "pid": 1, "tid": 1, "ts": 30.0, "dur": 70.0},     # touches, nested
            {"ph": "X", "name": "copy", "pid": 1, "tid": 2, "ts": 5.0, "dur": 200.0},       # other tid
            {"ph": "X", "name": "spans", "pid": "Spans", "tid": "PyTorch Profiler", "ts": 0, "dur": 9},
            {"ph": "i", "name": "hit", "pid": 1, "tid": 1, "ts": 12.0, "s": "t"},
            {"ph": "i", "name": "Record Window End", "pid": "", "tid": "", "ts": 50.0, "s": "g"},
            {"ph": "C", "name": "hits/misses", "pid": 1, "tid": 0, "ts": 0.0, "args": {"hits": 3, "misses": 1}},
            {"ph": "B", "name": "driver", "pid": 1, "tid": 3, "ts": 0.0},
            {"ph": "E", "pid": 1, "tid": 3, "ts": 4.0},
        ],
        "displayTimeUnit": "ms",
        "otherData": {"run_id": "r"},
    }


def test_a_well_formed_trace_has_no_problems():
    assert validate_chrome_trace(good_trace()) == []
    assert validate_chrome_trace(good_trace()["traceEvents"]) == []     # JSON Array Format


def test_slices_are_judged_in_whole_nanoseconds_as_perfetto_reads_them():
    def trace(dur_b):
        return {"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0.0, "dur": 10.0},
                                {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 5.0, "dur": dur_b}]}

    assert validate_chrome_trace(trace(5.0 + 1e-7)) == []         # float noise under half a nanosecond
    problems = validate_chrome_trace(trace(5.001))                # ends 1 ns after its parent: Perfetto moves it
    assert len(problems) == 1 and "[5000, 10001] ns partially overlaps" in problems[0]
    huge = {"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1e306, "dur": 1.0}]}
    assert any("too large" in p for p in validate_chrome_trace(huge))     # a problem, not an OverflowError


def _event(trace, target):
    return next(e for e in trace["traceEvents"] if e.get("name") == target)


def _set(target, **changes):
    def mutate(t):
        _event(t, target).update(changes)
    return mutate


def _drop(target, key):
    def mutate(t):
        del _event(t, target)[key]
    return mutate


def _append(event):
    def mutate(t):
        t["traceEvents"].append(event)
    return mutate


DEFECTS = {
    "no traceEvents": (lambda t: t.pop("traceEvents"), "traceEvents"),
    "traceEvents not a list": (lambda t: t.update(traceEvents={}), "traceEvents"),
    "bad displayTimeUnit": (lambda t: t.update(displayTimeUnit="s"), "displayTimeUnit"),
    "otherData not an object": (lambda t: t.update(otherData=[1]), "otherData"),
    "event not an object": (_append(["X"]), "not an object"),
    "unknown phase": (_set("layer", ph="Z"), "phase"),
    "missing phase": (_drop("layer", "ph"), "phase"),
    "X missing dur": (_drop("layer", "dur"), "'dur'"),
    "X missing ts": (_drop("layer", "ts"), "'ts'"),
    "X missing pid": (_drop("layer", "pid"), "'pid'"),
    "X missing tid": (_drop("layer", "tid"), "'tid'"),
    "X missing name": (_drop("layer", "name"), "'name'"),
    "negative ts": (_set("layer", ts=-1.0), "'ts'"),
    "negative dur": (_set("layer", dur=-0.5), "'dur'"),
    "nan ts": (_set("layer", ts=float("nan")), "'ts'"),
    "string dur": (_set("layer", dur="20"), "'dur'"),
    "bool ts": (_set("layer", ts=True), "'ts'"),
    "tid a list": (_set("layer", tid=[1]), "'tid'"),
    "name not a string": (_set("layer", name=3), "'name'"),
    "args not an object": (_set("layer", args=[1]), "'args'"),
    "partial overlap": (_set("layer", dur=25.0), "partially overlaps"),
    "overlap with outer end": (_set("expert", dur=70.5), "partially overlaps"),
    "thread instant without tid": (_drop("hit", "tid"), "'tid'"),
    "bad instant scope": (_set("hit", s="x"), "scope"),
    "counter without args": (_drop("hits/misses", "args"), "'args'"),
    "counter with a string value": (_set("hits/misses", args={"hits": "3"}), "counter value"),
    "counter with no values": (_set("hits/misses", args={}), "no values"),
    "unknown metadata name": (_append({"ph": "M", "name": "thread_colour", "pid": 1, "tid": 1,
                                       "args": {"name": "x"}}), "metadata name"),
    "thread_name without args.name": (_set("thread_name", args={}), "args['name']"),
    "thread_sort_index not an int": (_set("thread_sort_index", args={"sort_index": "1"}), "sort_index"),
    "thread_name without tid": (_drop("thread_name", "tid"), "'tid'"),
    "metadata without args": (_drop("process_name", "args"), "'args'"),
    "E without B": (_append({"ph": "E", "pid": 1, "tid": 9, "ts": 1.0}), "without a matching"),
    "B never ended": (_append({"ph": "B", "name": "open", "pid": 1, "tid": 9, "ts": 1.0}), "never ended"),
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_each_kind_of_defect_is_reported(defect):
    mutate, expected = DEFECTS[defect]
    trace = copy.deepcopy(good_trace())
    mutate(trace)
    problems = validate_chrome_trace(trace)
    assert problems, f"{defect} was not caught"
    assert any(expected in p for p in problems), problems


def test_a_non_trace_object_is_rejected():
    assert validate_chrome_trace("trace") != []


def test_problem_list_is_capped():
    t = {"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": -1, "dur": 1}] * (MAX_PROBLEMS + 5)}
    problems = validate_chrome_trace(t)
    assert len(problems) == MAX_PROBLEMS + 1 and "5 more" in problems[-1]
