"""The benchmark scripts refuse bad input while parsing, before any long work: exit status 2, one error line that
names the flag, no traceback, and no model loaded, child started or run begun (each is replaced by a failure here).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "docs/benchmarks/headline/model-check/config-modeled-dsv2-x8-50-lane.json"
# Names a script binds at import (or a function of its own) that start long work: loading, children, runs.
LONG_WORK = ("load_model", "kernel_rows", "quality_rows", "run_profile", "lore_report", "run_one", "child")


class LongWorkStarted(AssertionError):
    pass


def _boom(*a, **k):
    raise LongWorkStarted("long work started before the bad input was refused")


@lru_cache(maxsize=None)
def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_args_test_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod            # a dataclass looks its module up while the module runs
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def no_long_work(monkeypatch):
    """Fail the test if a script loads a model, runs bench, starts a child process or begins its runs; and see no
    CUDA GPU, so that --device cuda is refused on any machine."""
    import torch
    import transformers

    import spice_core.model.loader as loader
    import spice_core.tools.cli as cli
    from spice_core.engine import SpiceEngine

    monkeypatch.setattr(SpiceEngine, "load", classmethod(_boom))
    monkeypatch.setattr(loader, "load_model", _boom)
    monkeypatch.setattr(cli, "main", _boom)
    monkeypatch.setattr(subprocess, "run", _boom)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", _boom)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)

    def load(name: str):
        mod = _module(name)
        for attr in LONG_WORK:
            if hasattr(mod, attr):
                monkeypatch.setattr(mod, attr, _boom)
        return mod
    return load


@pytest.fixture
def files(tmp_path):
    """{name: path} of inputs the cases point at."""
    (tmp_path / "empty").mkdir()
    no_models = tmp_path / "no-models"
    no_models.mkdir()
    (no_models / "results.json").write_text(json.dumps({"date": "2026-12-01", "machine": "m"}))
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    return {"tmp": str(tmp_path), "empty": str(tmp_path / "empty"), "no_models": str(no_models),
            "a_file": str(a_file), "config": str(ROOT / CONFIG)}


# (script, argv, what the error line must name); {name} is a path from `files`.
CASES = [
    # 1: routing_realism_report had no argument handling
    ("routing_realism_report", [], "folder"),
    ("routing_realism_report", ["/nonexistent-folder"], "folder /nonexistent-folder"),
    ("routing_realism_report", ["{empty}"], "results.json"),
    ("routing_realism_report", ["{no_models}"], "models"),
    # 2: story_requests
    ("story_requests", ["--requests", "0"], "--requests 0"),
    ("story_requests", ["--threads", "0"], "--threads 0"),
    ("story_requests", ["--max-new-tokens", "-1"], "--max-new-tokens -1"),
    ("story_requests", ["--models", "nope"], "--models 'nope'"),
    ("story_requests", ["--models", "/nonexistent-model"], "--models /nonexistent-model"),
    # 3: no median of no runs
    ("engine_cpu_speed", ["--runs", "0"], "--runs"),
    ("engine_cpu_speed", ["--runs", "-1"], "--runs"),
    ("engine_cpu_speed", ["bogus"], "'bogus' is not a policy"),
    ("cpu_speed_shipped", ["--runs", "0"], "--runs 0"),
    ("int8_quality", ["--reps", "-1", "--skip-quality", "--out", "{tmp}/int8.json"], "--reps -1"),
    # 4: cpu_speed_shipped checks in the parent, before any child
    ("cpu_speed_shipped", ["--threads", "-1"], "--threads -1"),
    ("cpu_speed_shipped", ["--dtypes", "bogus"], "--dtypes 'bogus'"),
    # 5: host_overhead, before the model loads
    ("host_overhead", ["--cache-frac", "-1"], "--cache-frac -1"),
    ("host_overhead", ["--tokens", "0"], "--tokens 0"),
    ("host_overhead", ["--policies", "bogus"], "--policies 'bogus'"),
    ("host_overhead", ["--device", "cuda"], "--device cuda"),
    ("host_overhead", ["--timing", "bogus"], "--timing"),
    ("host_overhead", ["--timing", "measured", "--device", "cpu"], "--timing measured"),
    # 6: prefetch_modeled, before the model loads and before the run (an --out it cannot write)
    ("prefetch_modeled", ["--budgets", "-1"], "--budgets -1"),
    ("prefetch_modeled", ["--budgets", "nan"], "--budgets nan"),
    ("prefetch_modeled", ["--prompts", "-3"], "--prompts -3"),
    ("prefetch_modeled", ["--out", "{a_file}/sub/tpot.md"], "--out"),
    ("prefetch_modeled", ["--out", "{empty}"], "--out"),
    # 7: speed_quality
    ("speed_quality", ["--from-json", "/nonexistent.json"], "--from-json /nonexistent.json"),
    ("speed_quality", ["--from-json", "{no_models}/results.json"], "--from-json"),
    ("speed_quality", ["--cache-frac", "5"], "--cache-frac 5"),
    # 8: predictor_recall
    ("predictor_recall", ["--max-tokens", "-1"], "--max-tokens -1"),
    ("predictor_recall", ["--model", "/nonexistent-model"], "--model /nonexistent-model"),
    # 9: agreement_report
    ("agreement_report", ["--records", "x.json", "--target-agreement", "nan"], "--target-agreement nan"),
    ("agreement_report", ["--records", "x.json", "--target-agreement", "1.5"], "--target-agreement 1.5"),
    # 10: lane_batches names --budget, not its temporary config, and prints no table
    ("lane_batches", ["--config", "{config}", "--budget", "-1"], "--budget -1"),
    ("lane_batches", ["--config", "{config}", "--budget", "0"], "--budget 0"),
]


def _error_line(err: str) -> str:
    """The one line that says what is wrong (argparse may print its usage above it)."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err
    return errors[0]


@pytest.mark.parametrize("script, argv, names", CASES, ids=[f"{s}:{' '.join(a)}" for s, a, _ in CASES])
def test_bad_input_is_one_line_and_exit_2_before_any_work(script, argv, names, no_long_work, files, capsys):
    main = no_long_work(script).main
    with pytest.raises(SystemExit) as exc:
        main([a.format(**files) for a in argv])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    line = _error_line(err)
    assert names.format(**files) in line, line
    assert out == ""                                 # no report, no empty table


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc, where no file can be made")
@pytest.mark.parametrize("script, argv", [
    ("prefetch_modeled", ["--out", "/proc/spice-test/tpot.md"]),
    ("predictor_recall", ["--out", "/proc/spice-test/recall.md"]),
    ("int8_quality", ["--out", "/proc/spice-test/int8.json"]),
    ("story_requests", ["--out", "/proc/spice-test"]),
    ("speed_quality", ["--out", "/proc/spice-test/speed-quality"]),
    ("engine_cpu_speed", ["--json", "/proc/spice-test/speed.json"]),
])
def test_an_output_that_cannot_be_written_is_refused_before_the_run(script, argv, no_long_work, capsys):
    """Even as root (os.access says yes to root): a scratch file is made and removed where the output goes."""
    with pytest.raises(SystemExit) as exc:
        no_long_work(script).main(argv)
    assert exc.value.code == 2
    assert argv[0] in _error_line(capsys.readouterr().err)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes in a read-only folder")
def test_a_read_only_folder_is_refused_before_the_run(no_long_work, tmp_path, capsys):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(SystemExit) as exc:
            no_long_work("prefetch_modeled").main(["--out", str(folder / "tpot.md")])
    finally:
        folder.chmod(0o755)
    assert exc.value.code == 2 and "--out" in _error_line(capsys.readouterr().err)


def test_routing_realism_report_has_a_usage(no_long_work, capsys):
    with pytest.raises(SystemExit) as exc:
        no_long_work("routing_realism_report").main(["--help"])
    assert exc.value.code == 0
    assert "usage: benchmarks/routing_realism_report.py" in capsys.readouterr().out


def test_routing_realism_report_writes_the_committed_readme_again(no_long_work, tmp_path, capsys):
    """Good input is unchanged: the committed run's README comes out as committed."""
    run = ROOT / "docs/benchmarks/routing-realism"
    (tmp_path / "results.json").write_text((run / "results.json").read_text())
    assert no_long_work("routing_realism_report").main([str(tmp_path)]) == 0
    assert (tmp_path / "README.md").read_text() == (run / "README.md").read_text()


@pytest.mark.parametrize("argv", [["benchmarks/routing_realism_report.py"],
                                  ["benchmarks/cpu_speed_shipped.py", "--threads", "-1"]])
def test_as_a_command_the_status_is_2_and_no_traceback(argv):
    """Run as scripts: the exit status and stderr a shell sees (cpu_speed_shipped would have started children)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and p.stdout == ""
    assert _error_line(p.stderr).startswith("error: ")


def test_lane_batches_budget_flag_wins_over_a_runs_budgets(tmp_path):
    """--budget runs that budget alone: a run entry's own "budgets" (the cpu-lane configs have them) overrode it."""
    import argparse
    import json

    from benchmarks.lane_batches import _config

    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps({"model": "assets/spice-mini", "timing": "modeled", "budgets": [0.1, 0.5],
                                    "runs": [{"budgets": [0.1, 0.5], "long_prompt": False}]}))
    cfg = _config(argparse.ArgumentParser(), argparse.Namespace(config=cfg_path, budget=0.25, prompts=None, policies=None))
    assert cfg["budgets"] == [0.25] and cfg["runs"] == [{"long_prompt": False}]
