"""Hostile input for every subcommand: each exits 2 with one `error:` line naming the setting, no
traceback, before any model is loaded (the `no_long_work` fixture fails the test otherwise).

Each case is a function ``(tmp_path, model_dir) -> (argv, needles)``; needles must all appear in
the error line. Regression cases from the hostile review are marked in their ids.
"""
import gzip
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spice_core.tools.cli import main

from cli_helpers import GOOD_PROFILE, REPO, run_cli  # noqa: E402,F401 - shared by the CLI tests


def assert_one_clear_line(code, err, needles):
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])


# ---------------------------------------------------------------- file builders
def write(tmp_path: Path, name: str, content) -> Path:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        p.write_bytes(content)
    elif isinstance(content, str):
        p.write_text(content)
    else:
        p.write_text(json.dumps(content))
    return p


def model_with_config(tmp_path: Path, model: Path, config) -> Path:
    d = tmp_path / "model"
    shutil.copytree(model, d)
    (d / "config.json").unlink()
    if config == "DIR":
        (d / "config.json").mkdir()
    else:
        write(d, "config.json", config)
    return d


def good_config(model: Path) -> dict:
    return json.loads((model / "config.json").read_text())


def profile(tmp_path: Path, **patch) -> Path:
    d = {**GOOD_PROFILE, **patch}
    d = {k: v for k, v in d.items() if v is not DROP}
    return write(tmp_path, "hw.json", json.dumps(d, allow_nan=True))


DROP = object()
# A Qwen2-MoE miniature of Qwen2-57B-A14B's topology whose rope_theta is not the real model's 1e6.
QWEN2_ROPE_1E4 = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "vocab_size": 96,
                  "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 4,
                  "shared_expert_intermediate_size": 8, "num_hidden_layers": 28, "num_attention_heads": 2,
                  "num_key_value_heads": 1, "head_dim": 128, "num_experts": 64, "num_experts_per_tok": 8,
                  "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
                  "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


def gen(*extra):
    return lambda model: ["generate", "--model", model, "--prompt", "hi", *extra]


def bench_cfg(tmp_path: Path, cfg) -> list:
    return ["bench", "--config", write(tmp_path, "cfg.json", cfg), "--out", tmp_path / "out"]


# ---------------------------------------------------------------- cases
# Each: id -> (tmp_path, model) -> (argv, needles)
CASES = {
    # config.json in a model folder (hostile review)
    "config-not-json": lambda t, m: (gen()(model_with_config(t, m, "{not json")), ["config.json", "JSON"]),
    "config-a-list": lambda t, m: (gen()(model_with_config(t, m, [1, 2])), ["config.json", "JSON object"]),
    "config-a-folder": lambda t, m: (gen()(model_with_config(t, m, "DIR")), ["config.json"]),
    "config-not-utf8": lambda t, m: (gen()(model_with_config(t, m, b"\xff\xfe{}")), ["config.json"]),
    "config-architectures-a-string": lambda t, m: (
        gen()(model_with_config(t, m, {**good_config(m), "architectures": "MixtralForCausalLM"})),
        ["architectures", "list"]),
    "config-architectures-numbers": lambda t, m: (
        gen()(model_with_config(t, m, {**good_config(m), "architectures": [1]})), ["architectures"]),
    "config-layers-a-string": lambda t, m: (
        gen()(model_with_config(t, m, {**good_config(m), "num_hidden_layers": "three"})), ["num_hidden_layers"]),
    "model-is-a-file": lambda t, m: (gen()(write(t, "f.txt", "x")), ["--model", "file"]),
    # hardware profile files (hostile review)
    "hw-profile-missing-keys": lambda t, m: (gen("--hw-profile", profile(t, cpu_threads=DROP, d2h_gbps=DROP))(m),
                                             ["--hw-profile", "lacks", "cpu_threads"]),
    "hw-profile-string-number": lambda t, m: (gen("--hw-profile", profile(t, gpu_tflops="fast"))(m),
                                              ["--hw-profile", "gpu_tflops", "number"]),
    "hw-profile-nan": lambda t, m: (gen("--hw-profile", profile(t, h2d_pinned_gbps=math.nan), "--json")(m),
                                    ["--hw-profile", "NaN"]),
    "hw-profile-infinity": lambda t, m: (gen("--hw-profile", profile(t, copy_latency_us=math.inf))(m),
                                         ["--hw-profile", "Infinity"]),
    "hw-profile-float-threads": lambda t, m: (gen("--hw-profile", profile(t, cpu_threads=2.5))(m),
                                              ["cpu_threads", "integer"]),
    "hw-profile-bool": lambda t, m: (gen("--hw-profile", profile(t, gpu_kernel_us=True))(m), ["gpu_kernel_us"]),
    "hw-profile-a-list": lambda t, m: (gen("--hw-profile", write(t, "hw.json", [GOOD_PROFILE]))(m),
                                       ["--hw-profile", "object"]),
    "hw-profile-empty": lambda t, m: (gen("--hw-profile", write(t, "hw.json", ""))(m), ["--hw-profile", "JSON"]),
    "hw-profile-a-folder": lambda t, m: (gen("--hw-profile", t)(m), ["--hw-profile", "directory"]),
    "hw-profile-unknown-key": lambda t, m: (gen("--hw-profile", profile(t, turbo=1))(m), ["unknown keys", "turbo"]),
    # generate flags (hostile review: seed, device, trace dir, cache-gb nan)
    "seed-past-64-bits": lambda t, m: (gen("--seed", 2**70)(m), ["--seed", "out of range"]),
    "seed-negative": lambda t, m: (gen("--seed", -1)(m), ["--seed"]),
    "seed-not-a-number": lambda t, m: (gen("--seed", "x")(m), ["--seed", "integer"]),
    "device-tpu": lambda t, m: (gen("--device", "tpu")(m), ["--device", "cpu, cuda"]),
    "device-cpu-index": lambda t, m: (gen("--device", "cpu:1")(m), ["--device"]),
    "trace-dir-is-a-file": lambda t, m: (gen("--trace-dir", write(t, "trace.txt", "x"))(m), ["--trace-dir", "file"]),
    "trace-dir-under-a-file": lambda t, m: (gen("--trace-dir", write(t, "trace.txt", "x") / "sub")(m),
                                            ["--trace-dir"]),
    "cache-gb-nan": lambda t, m: (gen("--cache-gb", "nan")(m), ["--cache-gb", "finite"]),
    "cache-gb-inf": lambda t, m: (gen("--cache-gb", "inf")(m), ["--cache-gb", "finite"]),
    "cache-gb-zero": lambda t, m: (gen("--cache-gb", "0")(m), ["--cache-gb", "out of range"]),
    "cache-gb-negative": lambda t, m: (gen("--cache-gb", "-1")(m), ["--cache-gb"]),
    "cache-frac-nan": lambda t, m: (gen("--cache-frac", "nan")(m), ["--cache-frac"]),
    "cache-frac-above-one": lambda t, m: (gen("--cache-frac", "1.5")(m), ["--cache-frac", "[0, 1]"]),
    "tau-prefetch-nan": lambda t, m: (gen("--tau-prefetch", "nan")(m), ["--tau-prefetch"]),
    "tau-approx-negative": lambda t, m: (gen("--tau-approx", "-0.1")(m), ["--tau-approx"]),
    "tau-int8-above-one": lambda t, m: (gen("--tau-int8", "1.5")(m), ["--tau-int8", "[0, 1]"]),
    "temperature-inf": lambda t, m: (gen("--temperature", "inf")(m), ["--temperature"]),
    "top-p-zero": lambda t, m: (gen("--top-p", "0")(m), ["--top-p"]),
    "max-lookahead-zero": lambda t, m: (gen("--max-lookahead", "0")(m), ["--max-lookahead"]),
    "max-lookahead-past-the-settings-range": lambda t, m: (gen("--max-lookahead", "65")(m),
                                                           ["--max-lookahead 65", "use an integer in [1, 64]"]),
    "lore-rank-zero": lambda t, m: (gen("--lore-rank", "0")(m), ["--lore-rank"]),
    "max-new-tokens-huge": lambda t, m: (gen("--max-new-tokens", 10**9)(m), ["--max-new-tokens"]),
    "max-new-tokens-float": lambda t, m: (gen("--max-new-tokens", "2.5")(m), ["--max-new-tokens", "integer"]),
    "stop-empty": lambda t, m: (gen("--stop", "")(m), ["--stop", "empty"]),
    "timing-measured-on-cpu": lambda t, m: (gen("--timing", "measured", "--device", "cpu")(m),
                                            ["--timing measured", "modeled"]),
    "unknown-flag": lambda t, m: (gen("--turbo")(m), ["--turbo"]),
    "log-level-attribute": lambda t, m: (["--log-level", "BASIC_FORMAT", *gen()(m)], ["--log-level"]),
    # calibrate (hostile review: --train-seconds -5, non-UTF-8 text)
    "calibrate-train-seconds-negative": lambda t, m: (["calibrate", "--model", m, "--train-seconds", "-5"],
                                                      ["--train-seconds", "out of range"]),
    "calibrate-train-seconds-nan": lambda t, m: (["calibrate", "--model", m, "--train-seconds", "nan"],
                                                 ["--train-seconds", "finite"]),
    "calibrate-text-not-utf8": lambda t, m: (["calibrate", "--model", m, "--text", write(t, "t.txt", b"ok \xff\xfe")],
                                             ["--text", "UTF-8"]),
    "calibrate-text-empty": lambda t, m: (["calibrate", "--model", m, "--text", write(t, "t.txt", "  \n")],
                                          ["--text", "empty"]),
    "calibrate-text-a-folder": lambda t, m: (["calibrate", "--model", m, "--text", t], ["--text", "folder"]),
    "calibrate-text-missing": lambda t, m: (["calibrate", "--model", m, "--text", t / "nope.txt"],
                                            ["--text", "no such file"]),
    "calibrate-threads-zero": lambda t, m: (["calibrate", "--model", m, "--threads", "0"], ["--threads"]),
    "calibrate-seed-huge": lambda t, m: (["calibrate", "--model", m, "--seed", 2**70], ["--seed"]),
    "calibrate-max-tokens-tiny": lambda t, m: (["calibrate", "--model", m, "--max-tokens", "10"], ["--max-tokens"]),
    "calibrate-seq-len-tiny": lambda t, m: (["calibrate", "--model", m, "--seq-len", "2"], ["--seq-len"]),
    "calibrate-epochs-zero": lambda t, m: (["calibrate", "--model", m, "--epochs", "0"], ["--epochs"]),
    "calibrate-distances-zero": lambda t, m: (["calibrate", "--model", m, "--distances", "0"], ["distances"]),
    "calibrate-lore-rank-zero": lambda t, m: (["calibrate", "--model", m, "--lore-max-rank", "0"],
                                              ["--lore-max-rank"]),
    "calibrate-out-is-a-file": lambda t, m: (["calibrate", "--model", m, "--out", write(t, "o.txt", "x")],
                                             ["--out", "file"]),
    "calibrate-lore-only-and-no-lore": lambda t, m: (["calibrate", "--model", m, "--lore-only", "--no-lore"],
                                                     ["--lore-only", "--no-lore"]),
    "calibrate-device-tpu": lambda t, m: (["calibrate", "--model", m, "--device", "tpu"], ["--device"]),
    "calibrate-broken-config": lambda t, m: (["calibrate", "--model", model_with_config(t, m, [])], ["config.json"]),
    # quality
    "quality-prompts-not-utf8": lambda t, m: (["quality", "--model", m, "--prompts", write(t, "p.txt", b"\x80\x81")],
                                              ["--prompts", "UTF-8"]),
    "quality-prompts-missing": lambda t, m: (["quality", "--model", m, "--prompts", t / "nope"], ["--prompts"]),
    "quality-window-one": lambda t, m: (["quality", "--model", m, "--window", "1"], ["--window"]),
    "quality-new-tokens-negative": lambda t, m: (["quality", "--model", m, "--new-tokens", "-1"], ["--new-tokens"]),
    "quality-new-tokens-huge": lambda t, m: (["quality", "--model", m, "--new-tokens", 10**6], ["--new-tokens"]),
    "quality-n-prompts-zero": lambda t, m: (["quality", "--model", m, "--n-prompts", "0"], ["--n-prompts"]),
    "quality-max-tokens-zero": lambda t, m: (["quality", "--model", m, "--max-tokens", "0"], ["--max-tokens"]),
    "quality-cache-gb-nan": lambda t, m: (["quality", "--model", m, "--cache-gb", "nan"], ["--cache-gb"]),
    "quality-hw-profile-nan": lambda t, m: (["quality", "--model", m, "--hw-profile",
                                             profile(t, cpu_mem_gbps=math.nan)], ["--hw-profile"]),
    # calibrate-hw
    "calibrate-hw-reps-zero": lambda t, m: (["calibrate-hw", "--reps", "0"], ["--reps"]),
    "calibrate-hw-out-a-folder": lambda t, m: (["calibrate-hw", "--out", t], ["--out", "folder"]),
    "calibrate-hw-shape-unknown": lambda t, m: (["calibrate-hw", "--shape", "gpt-9", "--out", t / "o.json"],
                                                ["shape", "gpt-9"]),
    "calibrate-hw-name-empty": lambda t, m: (["calibrate-hw", "--name", ""], ["--name"]),
    # lift
    "lift-device-tpu": lambda t, m: (["lift", "--device", "tpu"], ["--device"]),
    "lift-max-new-tokens-zero": lambda t, m: (["lift", "--max-new-tokens", "0"], ["--max-new-tokens"]),
    "lift-broken-config": lambda t, m: (["lift", "--model", model_with_config(t, m, "nope"), "--device", "cpu"],
                                        ["config.json"]),
    "lift-unsupported-family": lambda t, m: (["lift", "--model", m, "--device", "cpu"],
                                             ["lift", "DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM"]),
    "lift-qwen2-other-rope-theta": lambda t, m: (["lift", "--model", model_with_config(t, m, QWEN2_ROPE_1E4),
                                                  "--device", "cpu"], ["rope_theta", "Qwen2-57B-A14B"]),
    # a model by name (shipped models)
    "generate-model-unknown-name": lambda t, m: (["generate", "--model", "spice-maxi", "--prompt", "hi"],
                                                 ["--model", "spice-maxi", "spice-mini, spice-mini-qwen2"]),
    "calibrate-model-unknown-name": lambda t, m: (["calibrate", "--model", "qwen2"], ["--model", "spice-mini-qwen2"]),
    "quality-model-unknown-name": lambda t, m: (["quality", "--model", "mini"], ["--model", "spice-mini"]),
    "tune-tau-int8": lambda t, m: (["tune", "--model", m, "--tau-int8", "0.3"], ["tune", "--tau-int8"]),
    "lift-model-unknown-name": lambda t, m: (["lift", "--model", "deepseek"], ["--model", "spice-mini-qwen2"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input_is_one_clear_line_before_any_work(case, capsys, tmp_path, tiny_model, no_long_work):
    argv, needles = CASES[case](tmp_path, tiny_model)
    code, _, err = run_cli(capsys, argv)
    assert_one_clear_line(code, err, needles)


# ---------------------------------------------------------------- recalibrate traces and profiles
def _event(**args):
    a = {"timing": "measured", "token": 1, "layer": 1, "lane": "gpu", "kind": "layer", "start_ms": 0.0,
         "dur_ms": 0.1}
    a.update(args)
    return {"ph": "X", "name": "x", "ts": 0, "dur": 1, "pid": 0, "tid": 0, "args": a}


def _without(key):
    e = _event()
    del e["args"][key]
    return e


TRACES = {
    "a-number": (5, ["--trace", "object"]),
    "a-string": ('"trace"', ["--trace", "object"]),
    "events-not-a-list": ({"traceEvents": "all"}, ["traceEvents"]),
    "events-are-strings": ({"traceEvents": ["a", "b"]}, ["no measured engine events"]),
    "event-lacks-token": ({"traceEvents": [_without("token")]}, ["args.token"]),
    "event-lacks-dur": ({"traceEvents": [_without("dur_ms")]}, ["args.dur_ms"]),
    "event-string-layer": ({"traceEvents": [_event(layer="one")]}, ["args.layer"]),
    "event-nan-start": ('{"traceEvents": [{"ph": "X", "args": {"timing": "measured", "token": 1, "layer": 1, '
                        '"lane": "gpu", "kind": "layer", "start_ms": NaN, "dur_ms": 1}}]}', ["NaN"]),
    "too-few-layers": ({"traceEvents": [_event()]}, ["fewer than 8"]),
    "layers-without-experts": ({"traceEvents": [_event(token=t) for t in range(1, 10)]}, ["no experts"]),
    "not-json": ("{{{", ["JSON"]),
    "empty": ("", ["JSON"]),
}


@pytest.mark.parametrize("case", sorted(TRACES))
def test_recalibrate_refuses_malformed_traces(case, capsys, tmp_path):
    content, needles = TRACES[case]
    trace = write(tmp_path, "t.json", content)
    code, _, err = run_cli(capsys, ["recalibrate", "--profile", profile(tmp_path), "--trace", trace,
                                    "--out", tmp_path / "new.json"])
    assert_one_clear_line(code, err, needles)
    assert not (tmp_path / "new.json").exists()


def test_recalibrate_refuses_a_gzip_bomb_without_inflating_it(capsys, tmp_path, monkeypatch):
    """Regression (hostile review): a 255 KB .json.gz that inflates to 741 MB was read whole. The
    limit is lowered here so the test inflates a few MB; the real one is far below 741 MB."""
    import spice_core.tools.recalibrate as recal

    assert recal.MAX_TRACE_BYTES < 741e6
    monkeypatch.setattr(recal, "MAX_TRACE_BYTES", 1_000_000)
    bomb = tmp_path / "bomb.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        f.write(b'{"traceEvents": [' + b" " * 4_000_000 + b"]}")
    assert bomb.stat().st_size < 20_000
    code, _, err = run_cli(capsys, ["recalibrate", "--profile", profile(tmp_path), "--trace", bomb,
                                    "--out", tmp_path / "new.json"])
    assert_one_clear_line(code, err, ["--trace", "decompresses to more than"])


@pytest.mark.parametrize("content", [b"not gzip at all", gzip.compress(b'{"traceEvents": []}')[:-12]],
                         ids=["not-gzip", "truncated"])
def test_recalibrate_refuses_broken_gzip(capsys, tmp_path, content):
    trace = write(tmp_path, "t.json.gz", content)
    code, _, err = run_cli(capsys, ["recalibrate", "--profile", profile(tmp_path), "--trace", trace,
                                    "--out", tmp_path / "new.json"])
    assert_one_clear_line(code, err, ["--trace", "cannot be read"])


@pytest.mark.parametrize("patch,needles", [({"name": DROP}, ["lacks", "name"]), ({"cpu_threads": "8"}, ["cpu_threads"]),
                                           ({"d2h_gbps": -1}, ["d2h_gbps", ">= 0"])])
def test_recalibrate_refuses_a_bad_profile(capsys, tmp_path, patch, needles):
    trace = write(tmp_path, "t.json", {"traceEvents": [_event()]})
    code, _, err = run_cli(capsys, ["recalibrate", "--profile", profile(tmp_path, **patch), "--trace", trace,
                                    "--out", tmp_path / "new.json"])
    assert_one_clear_line(code, err, ["--profile", *needles])


@pytest.mark.parametrize("extra,needles", [(["--shape", "gpt-9"], ["shape", "gpt-9"]), (["--out", "DIR"], ["--out"])])
def test_recalibrate_checks_shape_and_out_before_reading_traces(capsys, tmp_path, extra, needles):
    extra = [str(tmp_path) if x == "DIR" else x for x in extra]
    argv = ["recalibrate", "--profile", tmp_path / "missing.json", "--trace", tmp_path / "missing.json",
            "--out", tmp_path / "o.json", *extra]
    code, _, err = run_cli(capsys, argv)
    assert_one_clear_line(code, err, needles)


# ---------------------------------------------------------------- bench configs and results
BENCH = {
    "config-a-list": ([{"model": "random:tiny-deepseek"}], ["object"]),
    "config-a-number": (3, ["object"]),
    "no-model": ({"policies": ["lru"]}, ["model"]),
    "model-a-number": ({"model": 5}, ["model"]),
    "random-shape-unknown": ({"model": "random:gpt-9", "timing": "modeled"}, ["random", "gpt-9"]),
    "unknown-key": ({"model": "random:tiny-deepseek", "budget": [0.5]}, ["unknown keys", "budget"]),
    "budgets-a-number": ({"model": "random:tiny-deepseek", "budgets": 0.5}, ["budgets", "list"]),
    "budgets-empty": ({"model": "random:tiny-deepseek", "budgets": []}, ["budgets"]),
    "budget-a-string": ({"model": "random:tiny-deepseek", "budgets": ["abc"]}, ["budget", "(0, 1]"]),
    "budget-null": ({"model": "random:tiny-deepseek", "budgets": [None]}, ["budget"]),
    "budget-nan": ('{"model": "random:tiny-deepseek", "budgets": [NaN]}', ["NaN"]),
    "budget-zero": ({"model": "random:tiny-deepseek", "budgets": [0]}, ["budget"]),
    "policies-a-string": ({"model": "random:tiny-deepseek", "policies": "lru"}, ["policies"]),
    "links-unknown": ({"model": "random:tiny-deepseek", "links": ["nvlink9"]}, ["link", "nvlink9"]),
    "random-ids-negative": ({"model": "random:tiny-deepseek", "prompts": {"random_ids": -1}}, ["random_ids"]),
    "random-ids-a-string": ({"model": "random:tiny-deepseek", "prompts": {"random_ids": "8"}}, ["random_ids"]),
    "random-ids-huge": ({"model": "random:tiny-deepseek", "prompts": {"random_ids": 10**9}}, ["random_ids"]),
    "prompt-length-zero": ({"model": "random:tiny-deepseek", "prompts": {"random_ids": 2, "length": 0}},
                           ["length"]),
    "heldout-zero": ({"model": "random:tiny-deepseek", "prompts": {"heldout": 0}}, ["heldout"]),
    "prompts-empty-list": ({"model": "random:tiny-deepseek", "prompts": []}, ["prompts"]),
    "prompts-a-string": ({"model": "random:tiny-deepseek", "prompts": "once upon"}, ["prompts"]),
    "prompts-unknown-key": ({"model": "random:tiny-deepseek", "prompts": {"count": 3}}, ["prompts", "count"]),
    "max-new-tokens-zero": ({"model": "random:tiny-deepseek", "max_new_tokens": 0}, ["max_new_tokens"]),
    "max-new-tokens-float": ({"model": "random:tiny-deepseek", "max_new_tokens": 2.5}, ["max_new_tokens"]),
    "repetitions-negative": ({"model": "random:tiny-deepseek", "repetitions": -1}, ["repetitions"]),
    "tau-above-one": ({"model": "random:tiny-deepseek", "tau_approx": 2}, ["tau_approx", "use a number in [0, 1]"]),
    "max-lookahead-past-the-settings-range": ({"model": "random:tiny-deepseek", "runs": [{"max_lookahead": 65}]},
                                              ["runs[0]", "max_lookahead", "use an integer in [1, 64]"]),
    "profile-unknown": ({"model": "random:tiny-deepseek", "profile": "tpu"}, ["profile", "tpu"]),
    "timing-unknown": ({"model": "random:tiny-deepseek", "timing": "fast"}, ["timing"]),
    "export-traces-a-string": ({"model": "random:tiny-deepseek", "export_traces": "lru"}, ["export_traces"]),
    "reference-generate-a-string": ({"model": "random:tiny-deepseek", "reference_generate": "yes"},
                                    ["reference_generate"]),
    "hw-profile-a-number": ({"model": "random:tiny-deepseek", "hw_profile": 3}, ["hw_profile"]),
    "lift-override-topology": ({"model": "lift:assets/spice-mini", "lift_overrides": {"num_hidden_layers": 3}},
                               ["lift override", "num_hidden_layers"]),
    "runs-n-prompts-zero": ({"model": "random:tiny-deepseek", "runs": [{"n_prompts": 0}]}, ["runs[0]", "n_prompts"]),
    "runs-unknown-key": ({"model": "random:tiny-deepseek", "runs": [{"policy": "lru"}]}, ["runs[0]", "policy"]),
    "runs-prompt-indices-empty": ({"model": "random:tiny-deepseek", "runs": [{"prompt_indices": []}]},
                                  ["runs[0]", "prompt_indices"]),
    "runs-prompt-indices-repeated": ({"model": "random:tiny-deepseek", "runs": [{"prompt_indices": [1, 1]}]},
                                     ["runs[0]", "prompt_indices", "distinct"]),
    "runs-prompt-indices-negative": ({"model": "random:tiny-deepseek", "runs": [{"prompt_indices": [-1]}]},
                                     ["runs[0]", "prompt_indices"]),
    "runs-a-string": ({"model": "random:tiny-deepseek", "runs": "all"}, ["runs"]),
    "not-json": ("{", ["--config", "JSON"]),
    "not-utf8": (b"\xff\xfe", ["--config", "UTF-8"]),
}


@pytest.mark.parametrize("case", sorted(BENCH))
def test_bench_refuses_bad_configs_before_any_work(case, capsys, tmp_path, no_long_work):
    cfg, needles = BENCH[case]
    code, _, err = run_cli(capsys, bench_cfg(tmp_path, cfg))
    assert_one_clear_line(code, err, needles)


def _pickled_model(tmp_path, model):
    d = tmp_path / "pickled"
    d.mkdir()
    shutil.copy(model / "config.json", d / "config.json")
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    return d


def test_bench_refuses_pickled_checkpoints(capsys, tmp_path, tiny_model, no_long_work):
    d = _pickled_model(tmp_path, tiny_model)
    for spec in (str(d), f"lift:{d}"):
        code, _, err = run_cli(capsys, bench_cfg(tmp_path, {"model": spec, "timing": "modeled"}))
        assert_one_clear_line(code, err, ["no .safetensors", "pickled"])


def test_lift_refuses_pickled_checkpoints(capsys, tmp_path, tiny_model, no_long_work):
    d = _pickled_model(tmp_path, tiny_model)
    code, _, err = run_cli(capsys, ["lift", "--model", d, "--device", "cpu"])
    assert_one_clear_line(code, err, ["no .safetensors", "pickled"])


def test_bench_out_that_is_a_file_is_refused_before_work(capsys, tmp_path, no_long_work):
    argv = bench_cfg(tmp_path, {"model": "random:tiny-deepseek", "timing": "modeled"})
    argv[-1] = write(tmp_path, "out.txt", "x")
    code, _, err = run_cli(capsys, argv)
    assert_one_clear_line(code, err, ["--out", "file"])


def test_bench_broken_config_json_in_model_folder(capsys, tmp_path, tiny_model, no_long_work):
    d = model_with_config(tmp_path, tiny_model, {**good_config(tiny_model), "architectures": "MixtralForCausalLM"})
    code, _, err = run_cli(capsys, bench_cfg(tmp_path, {"model": str(d), "timing": "modeled"}))
    assert_one_clear_line(code, err, ["architectures"])


REPLOT = {
    "not-json": ("garbage", ["--replot", "JSON"]),
    "an-object": ({"records": []}, ["--replot", "list"]),
    "numbers": ([1, 2], ["record 0"]),
    "empty-records": ([{}], ["record 0", "policy"]),
    "string-tpot": ([{"policy": "lru", "link": "native", "timing": "modeled", "budget_frac": 0.25, "model": "m",
                      "tpot_ms_median": "fast"}], ["tpot_ms_median"]),
    "bad-raw": ([{"policy": "lru", "link": "native", "timing": "modeled", "budget_frac": 0.25, "model": "m",
                  "raw": {"hits": 1}}], ["raw"]),
    "no-model": ([{"policy": "lru", "link": "native", "timing": "modeled", "budget_frac": 0.25}], ["model"]),
}


@pytest.mark.parametrize("case", sorted(REPLOT))
@pytest.mark.parametrize("mode", ["replot", "merge"])
def test_bench_replot_and_merge_refuse_garbage(case, mode, capsys, tmp_path):
    content, needles = REPLOT[case]
    shard = tmp_path / "shard"
    write(shard, "results.json", content)
    if mode == "replot":
        argv = ["bench", "--replot", "--out", shard]
    else:
        argv = ["bench", "--merge", shard, "--out", tmp_path / "merged"]
        needles = [n.replace("--replot", "--merge") for n in needles]
    code, _, err = run_cli(capsys, argv)
    assert_one_clear_line(code, err, needles)


@pytest.mark.parametrize("extra, needles", [(["--shard", "1/2"], ["--merge", "--shard", "drop it"]),
                                            (["--config", "c.json", "--hw-profile", "hw.json"],
                                             ["--config and --hw-profile", "drop them"])])
def test_bench_merge_refuses_run_flags_it_would_ignore(extra, needles, capsys, tmp_path):
    """Regression (review): --merge (and --replot) with --config, --shard, ... returned 0, the flags ignored unsaid."""
    code, _, err = run_cli(capsys, ["bench", "--merge", tmp_path, "--out", tmp_path / "m", *extra])
    assert_one_clear_line(code, err, needles)


@pytest.mark.parametrize("cfg, needles", [({"model": "/no/such/model", "timing": "modeled"},
                                           ['config\'s "model"', "no such directory"]),
                                          ({"model": "random:tiny-deepseek", "timing": "modeled",
                                            "hw_profile": "/no/such/hw.json"}, ['"hw_profile"', "no such file"])])
def test_bench_config_errors_name_the_config_key_not_a_flag_bench_lacks(cfg, needles, capsys, tmp_path):
    """Regression (review): a bad "model" in a bench config said `--model X` (bench has no --model), a bad
    "hw_profile" said `--hw-profile X` though no such flag was given."""
    code, _, err = run_cli(capsys, bench_cfg(tmp_path, cfg))
    assert_one_clear_line(code, err, needles)
    assert "--model" not in err and "--hw-profile" not in err, err


def test_bench_refuses_a_prompt_past_the_context_in_the_configs_words(capsys, tmp_path):
    """Regression (review): a bench prompt longer than the context was refused mid-run with the chat's advice ("or
    start a new chat"); it is refused before any run, naming the prompt and the config's keys."""
    code, _, err = run_cli(capsys, bench_cfg(tmp_path, {"model": "random:tiny-deepseek", "timing": "modeled",
                                                        "prompts": {"random_ids": 1, "length": 510},
                                                        "max_new_tokens": 8}))
    assert_one_clear_line(code, err, ["prompt 0", "max_new_tokens 8", "context of 512"])
    assert "chat" not in err


def test_bench_long_prompt_without_held_out_data_says_to_drop_it(capsys, tmp_path, tiny_model):
    """Regression (review): the advice was "or list the prompts as text", which does not make a long prompt."""
    code, _, err = run_cli(capsys, bench_cfg(tmp_path, {"model": str(tiny_model), "timing": "modeled",
                                                        "prompts": ["hello there"], "long_prompt_tokens": 64,
                                                        "max_new_tokens": 4}))
    assert code == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]          # after the model's loading bar
    assert last.startswith("error: no held-out data") and 'drop "long_prompt_tokens"' in last, last


# ---------------------------------------------------------------- lift host memory
def test_lift_refuses_a_model_larger_than_host_memory_before_loading(capsys, monkeypatch, no_long_work):
    """Regression (hostile review): lift tried 31.6 GB on a 17.9 GB machine; it now says how much it
    needs and how much is available before reading any weight."""
    import spice_core.tools.bench_models as bm

    monkeypatch.setattr(bm, "available_host_bytes", lambda: int(17.9e9))
    code, _, err = run_cli(capsys, ["lift", "--device", "cpu"])
    assert_one_clear_line(code, err, ["host memory", "17.9 GB is available", "GB of host memory"])
    needed = float(err.split("needs about ")[1].split(" GB")[0])
    assert needed > 17.9


def test_available_host_memory_is_read():
    from spice_core.tools.bench_models import available_host_bytes

    avail = available_host_bytes()
    assert avail is None or avail > 0


# ---------------------------------------------------------------- the real entry point
def test_module_entry_point_prints_one_line_without_traceback(tmp_path):
    """`python -m spice_core` itself (not only `main`): a seed past 64 bits is one line, exit 2."""
    r = subprocess.run([sys.executable, "-m", "spice_core", "generate", "--prompt", "hi", "--seed", str(2**70)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert "--seed" in r.stderr


def test_help_still_exits_zero(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "--help"])
    assert e.value.code == 0
    assert "--seed" in capsys.readouterr().out


# ---------------------------------------------------------------- bounds only the loaded model knows
@pytest.mark.parametrize("argv,needles", [(["--seq-len", "100000"], ["--seq-len", "context"]),
                                          (["--lore-max-rank", "999"], ["--lore-max-rank", "expert width"])])
def test_calibrate_checks_model_bounds_before_tracing(capsys, tmp_path, tiny_model, monkeypatch, argv, needles):
    import spice_core.predictor.traces as traces

    def boom(*a, **k):
        raise AssertionError("tracing started before the bad flag was refused")

    monkeypatch.setattr(traces, "traces_for_model", boom)
    code, _, err = run_cli(capsys, ["calibrate", "--model", tiny_model, "--out", tmp_path / "arts", *argv])
    assert_one_clear_line(code, err, needles)


# ---------------------------------------------------------------- what must keep working
def test_every_shipped_bench_config_passes_the_checks():
    from spice_core.tools.bench_config import load_config_file

    configs = sorted((REPO / "docs" / "benchmarks").rglob("config*.json"))
    assert configs
    for path in configs:
        load_config_file(path)


def test_hardware_profile_refuses_non_finite_values_when_built_in_code():
    from spice_core.errors import ConfigError
    from spice_core.timing.profiles import HardwareProfile

    for bad in (math.nan, math.inf):
        with pytest.raises(ConfigError, match="gpu_tflops"):
            HardwareProfile(**{**GOOD_PROFILE, "gpu_tflops": bad})
    HardwareProfile(**GOOD_PROFILE)


def test_a_file_system_error_mid_run_is_one_line(capsys, monkeypatch):
    """A disk that fills or a path made read-only during a run: one line naming the path, exit 2."""
    import spice_core.tools.recalibrate as recal

    def full_disk(args):
        raise OSError(28, "No space left on device", "runs/hw.json")

    monkeypatch.setattr(recal, "run", full_disk)
    code, _, err = run_cli(capsys, ["recalibrate", "--profile", "p.json", "--trace", "t.json", "--out", "o.json"])
    assert_one_clear_line(code, err, ["runs/hw.json", "No space left"])


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CUDA is visible here")
@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["calibrate"], ["lift"], ["bench", "--out", "o"]])
def test_cuda_device_without_a_gpu_is_refused_as_parsed(command, capsys, no_long_work):
    code, _, err = run_cli(capsys, [*command, "--device", "cuda"])
    assert_one_clear_line(code, err, ["--device", "no CUDA GPU"])


# ---------------------------------------------------------------- shipped models by name
def test_a_shipped_models_name_whose_folder_is_missing_says_which_are_present(capsys, tmp_path, monkeypatch,
                                                                              no_long_work):
    import spice_core.model.shipped as shipped

    (tmp_path / "spice-mini").mkdir()
    (tmp_path / "spice-mini" / "config.json").write_text("{}")
    monkeypatch.setattr(shipped, "ASSETS", tmp_path)
    for argv in (["generate", "--model", "spice-mini-qwen2", "--prompt", "hi"], ["lift", "--model", "spice-mini-qwen2"]):
        code, _, err = run_cli(capsys, argv)
        assert_one_clear_line(code, err, ["--model spice-mini-qwen2", "assets/spice-mini-qwen2", "present: spice-mini"])


def test_a_shipped_models_name_is_its_folder_and_a_folder_wins_over_a_name(tmp_path, monkeypatch):
    from spice_core.model.shipped import SHIPPED, model_argument

    assert model_argument("spice-mini") == str(SHIPPED[0].folder)
    assert model_argument(None) is None and model_argument("org/name") == "org/name"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spice-mini").mkdir()
    assert model_argument("spice-mini") == "spice-mini"          # a folder of that name here is used as is


def test_a_reader_that_goes_away_ends_the_command_quietly(tiny_model):
    """Regression (review): `generate ... | head -1` ended in "error: cannot read or write: Broken pipe: check the
    path, its permissions and free space", as if the disk had failed. It now stops as Unix tools do: nothing on
    stderr, SIGPIPE's status."""
    import os

    env = dict(os.environ, HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "spice_core", "generate", "--model", str(tiny_model), "--device", "cpu", "--raw",
           "--prompt", "hello", "--max-new-tokens", "8"]
    # `true` exits without reading, long before the model has loaded: the first write finds no reader.
    r = subprocess.run(["bash", "-c", 'set -o pipefail; "$@" | true', "_", *cmd], cwd=REPO,
                       capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 141 and r.stderr.strip() == "", (r.returncode, r.stderr[-2000:])
