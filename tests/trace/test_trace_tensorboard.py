"""TensorBoard run layout: a genuine torch.profiler trace with SPICE's lanes merged in."""
from __future__ import annotations

import gzip
import json
import re
import zipfile
from pathlib import Path

import pytest

from spice_core.trace.chrome_schema import validate_chrome_trace
from spice_core.trace.events import TraceEvent
from spice_core.trace.tensorboard import merge_into_profiler_trace, write_tensorboard_run, zip_dir

# torch-tb-profiler 0.4.3's consts.WORKER_PATTERN: the plugin lists only files that match it.
TB_WORKER_PATTERN = re.compile(r"^(.*?)(\.\d+)?\.pt\.trace\.json(?:\.gz)?$")

EVENTS = [
    TraceEvent(0, -1, -1, "host", "token", 0.0, 6.0),
    TraceEvent(0, 1, -1, "gpu", "layer", 0.0, 1.0),
    TraceEvent(0, 1, 3, "copy", "copy", 0.5, 2.5, bytes=17_300_000),
    TraceEvent(0, 1, 4, "copy", "prefetch", 1.0, 3.0, bytes=17_300_000),   # overlaps: goes to copy#2
    TraceEvent(0, 1, 5, "gpu", "hit", 1.0, 1.0),
    TraceEvent(0, 1, 6, "cpu0", "cpu_run", 1.0, 2.0),
]


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("logdir") / "run1"
    return write_tensorboard_run(EVENTS, run_dir, metadata={"run_id": "r1", "timing": "modeled"})


@pytest.fixture(scope="module")
def trace(run_file):
    return json.loads(gzip.decompress(run_file.read_bytes()))


def test_file_uses_the_tensorboard_worker_layout(run_file):
    assert run_file.parent.name == "run1" and run_file.name == "spice.pt.trace.json.gz"
    match = TB_WORKER_PATTERN.match(run_file.name)
    assert match and match.group(1) == "spice"


def test_profiler_fields_and_events_are_kept(trace):
    for key in ("schemaVersion", "deviceProperties", "traceName", "traceEvents"):
        assert key in trace
    assert trace["traceName"] == "spice.pt.trace.json.gz"
    assert trace["spice"] == {"run_id": "r1", "timing": "modeled"}
    ops = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    assert any(e["name"].startswith("aten::") for e in ops)


def test_spice_events_sit_on_their_own_pid_beside_the_profile(trace):
    spice = [e for e in trace["traceEvents"] if str(e.get("cat", "")).startswith("spice.")]
    assert sorted(e["args"]["kind"] for e in spice) == sorted(ev.kind for ev in EVENTS)
    spice_pids = {e["pid"] for e in spice}
    assert len(spice_pids) == 1
    other_pids = {e.get("pid") for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
    assert not spice_pids & other_pids
    pid = spice_pids.pop()
    names = {e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e["pid"] == pid and e["name"] == "thread_name"}
    assert names == {"gpu", "copy", "copy#2", "cpu0", "host"}
    first_op = min(e["ts"] for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op")
    token = next(e for e in spice if e["args"]["kind"] == "token")
    assert first_op - 1e6 < token["ts"] <= first_op       # aligned with the profile, not at 0


def test_merged_trace_passes_the_schema_check(trace):
    assert validate_chrome_trace(trace) == []


def test_merge_does_not_change_the_profiler_trace():
    base = {"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7,
                                                 "tid": 7, "ts": 1000.0, "dur": 5.0}]}
    merged = merge_into_profiler_trace(base, EVENTS)
    assert len(base["traceEvents"]) == 1 and "spice" not in base
    assert all(e["pid"] == 8 for e in merged["traceEvents"][1:])


def test_zip_unpacks_as_a_logdir_holding_the_run(run_file, tmp_path):
    zpath = zip_dir(run_file.parent, tmp_path / "out" / "tb.zip")
    with zipfile.ZipFile(zpath) as zf:
        assert zf.namelist() == ["run1/spice.pt.trace.json.gz"]
        assert zf.read("run1/spice.pt.trace.json.gz") == run_file.read_bytes()


@pytest.mark.parametrize("worker", ["", "a/b", "x."])
def test_worker_must_be_a_file_name_stem(worker, tmp_path):
    with pytest.raises(ValueError, match="worker"):
        write_tensorboard_run(EVENTS, tmp_path, worker=worker)


def test_torch_tb_profiler_parses_the_file_when_installed(trace):
    pytest.importorskip("torch_tb_profiler")
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    data = RunProfileData.from_json("spice", None, trace)
    data.process()
    data.analyze()
    profile = RunGenerator("spice", None, data).generate_run_profile()
    assert "trace" in {v.name for v in profile.views}


def test_back_to_back_slices_stay_back_to_back_on_the_profilers_clock():
    """torch.profiler's clock reads ~5e12 µs, where a double cannot hold µs to 3 decimals: SPICE's slices placed
    there came out 1-2 ns overlapping once rounded (Perfetto moves them and reports an import error). The merge
    moves the whole trace near 0, and baseTimeNanoseconds by as much, so every instant stays where it was."""
    base_ts = 5787230384222.585
    base = {"schemaVersion": 1, "baseTimeNanoseconds": 1790857026000000000,
            "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": base_ts,
                             "dur": 5.0}]}
    events = [TraceEvent(token=t, layer=-1, expert=-1, lane="gpu", kind="token", start_ms=t * 0.3333337,
                         end_ms=(t + 1) * 0.3333337) for t in range(400)]
    merged = merge_into_profiler_trace(base, events)
    assert validate_chrome_trace(merged) == []
    op = next(e for e in merged["traceEvents"] if e.get("name") == "aten::mm")
    assert 0 <= op["ts"] < 1.0
    shift_us = merged["baseTimeNanoseconds"] - base["baseTimeNanoseconds"]
    assert shift_us % 1000 == 0 and abs(op["ts"] + shift_us / 1000 - base_ts) < 1e-3


def test_the_move_near_zero_keeps_odd_profiler_traces_whole():
    """Metadata at 0 stays at 0 (and does not turn the move off); a trace with a time that is not a number is left
    where it is (its events would part); a NaN time is left alone, not a crash."""
    events = [TraceEvent(token=0, layer=-1, expert=-1, lane="gpu", kind="token", start_ms=0.0, end_ms=1.0)]
    x = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": 5787230384222.585, "dur": 5.0}
    meta = {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "ts": 0, "args": {"name": "p"}}
    merged = merge_into_profiler_trace({"traceEvents": [meta, x]}, events)
    op = next(e for e in merged["traceEvents"] if e.get("name") == "aten::mm")
    assert op["ts"] < 1.0 and merged["traceEvents"][0]["ts"] == 0
    as_text = merge_into_profiler_trace({"traceEvents": [dict(x, ts="5787230384222.585"), x]}, events)
    assert next(e for e in as_text["traceEvents"][1:] if e.get("name") == "aten::mm")["ts"] == x["ts"]
    merge_into_profiler_trace({"traceEvents": [dict(x, ts=float("nan")), x]}, events)


def _run_python(code: str, **kw):
    import subprocess
    import sys
    kw.setdefault("stderr", subprocess.PIPE)
    return subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, timeout=300,
                          cwd=str(Path(__file__).resolve().parents[2]), **kw)


def test_the_profiler_template_prints_none_of_the_profilers_start_stop_lines():
    """The profiler's native library prints USDT/STAGE lines to descriptor 2 at start and stop; a user exporting a
    TensorBoard run saw them (in a fresh process: the template is recorded once per process)."""
    out = _run_python("from spice_core.trace import tensorboard as tb\n"
                      "tb.warm_profiler_template()\n"
                      "print(len(tb._profiler_trace()['traceEvents']) > 0)\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
    assert "USDT" not in out.stderr and "STAGE:" not in out.stderr, out.stderr


def test_other_stderr_output_written_while_the_profiler_runs_comes_through():
    out = _run_python("import os, sys\n"
                      "from spice_core.trace import tensorboard as tb\n"
                      "with tb._without_profiler_chatter():\n"
                      "    os.write(2, b'USDT: a start line\\nstill here\\n')\n"
                      "    print('python stderr', file=sys.stderr)\n")
    assert out.returncode == 0, out.stderr
    assert "USDT" not in out.stderr, out.stderr
    assert "still here" in out.stderr and "python stderr" in out.stderr, out.stderr


def test_the_profiler_template_is_made_in_a_process_started_without_stderr():
    """Regression (review): with descriptor 2 closed at start (a daemon), sys.stderr is None and the chatter filter's
    flush raised AttributeError, so a TensorBoard export failed."""
    import os
    out = _run_python("from spice_core.trace import tensorboard as tb\n"
                      "tb.warm_profiler_template()\n"
                      "print(len(tb._profiler_trace()['traceEvents']) > 0)\n", stderr=None, preexec_fn=lambda: os.close(2))
    assert out.returncode == 0 and out.stdout.strip() == "True", out
