"""Every bad input gets a one-line SpiceError naming the setting to change; the CLI exits 2 without a traceback."""
import json
import re
import shutil

import pytest
from safetensors.torch import load_file, save_file

from spice_core.api import SETTING_RANGES, RunSettings
from spice_core.tools.cli import main
from spice_core.errors import ConfigError, ModelLoadError, PromptError, UnsupportedModelError
from spice_core.model.loader import load_model
from spice_core.units import format_bytes


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *needles):
    assert code == 2
    assert "Traceback" not in err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]


def test_empty_prompt(capsys, tiny_dirs):
    code, _, err = run_cli(capsys, "generate", "--model", str(tiny_dirs["mixtral"]), "--prompt", "   ")
    assert_one_line_error(code, err, "--prompt")


@pytest.mark.parametrize("n", ["0", "-3", "1000000"])
def test_max_new_tokens_out_of_range(capsys, tiny_dirs, n):
    code, _, err = run_cli(capsys, "generate", "--model", str(tiny_dirs["mixtral"]), "--prompt", "hi",
                           "--max-new-tokens", n)
    assert_one_line_error(code, err, "--max-new-tokens")


@pytest.mark.parametrize("flag,value,needle", [("--policy", "fifo", "policy"), ("--profile", "tpu-v9", "profile"),
                                               ("--shape", "gpt-5", "shape")])
def test_unknown_policy_profile_shape(capsys, tiny_dirs, flag, value, needle):
    code, _, err = run_cli(capsys, "generate", "--model", str(tiny_dirs["mixtral"]), "--prompt", "hi", flag, value)
    assert_one_line_error(code, err, needle, value)


def test_missing_path(capsys, tmp_path):
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "nope"), "--prompt", "hi")
    assert_one_line_error(code, err, "no such directory")


def test_folder_without_safetensors(capsys, tmp_path, tiny_dirs):
    d = tmp_path / "pickled"
    d.mkdir()
    shutil.copy(tiny_dirs["mixtral"] / "config.json", d / "config.json")
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    code, _, err = run_cli(capsys, "generate", "--model", str(d), "--prompt", "hi")
    assert_one_line_error(code, err, "no .safetensors", "pickled")


def test_hub_id_while_offline_fails_fast(capsys):
    import time

    t = time.time()
    code, _, err = run_cli(capsys, "generate", "--model", "deepseek-ai/DeepSeek-V2-Lite", "--prompt", "hi")
    assert_one_line_error(code, err, "offline")
    assert time.time() - t < 15


def test_missing_expert_tensor_is_named(tmp_path, tiny_dirs):
    d = tmp_path / "broken"
    shutil.copytree(tiny_dirs["deepseek_v2"], d)
    f = d / "model.safetensors"
    sd = load_file(f)
    victim = next(k for k in sd if ".mlp.experts.3.down_proj" in k)
    del sd[victim]
    save_file(sd, f, metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="expert 3"):
        load_model(d, "cpu")


def test_truncated_shard_is_named(tmp_path, tiny_dirs):
    d = tmp_path / "trunc"
    shutil.copytree(tiny_dirs["olmoe"], d)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        load_model(d, "cpu")


def test_dense_or_unknown_architecture_lists_supported(tmp_path, tiny_dirs):
    d = tmp_path / "llama"
    shutil.copytree(tiny_dirs["mixtral"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="DeepseekV2ForCausalLM"):
        load_model(d, "cpu")


def test_cache_budget_below_top_k_says_minimum(engines):
    eng = engines["deepseek_v2"]
    with pytest.raises(ConfigError, match=r"cache-gb to >= [0-9.]+"):
        eng.start_ids([1, 2, 3], RunSettings(policy="lru", cache_frac=0.01))


def test_cache_budget_refusal_gives_sizes_for_humans_and_bounds_that_hold_when_typed_back(engines):
    """Regression: the refusal read "cache budget 0.0000 GB is smaller than one layer's top-3 experts (0.0000 GB):
    raise --cache-frac to >= 0.0938 or --cache-gb to >= 0.0000": sizes in GB to four decimals, zero for a small
    model, and bounds rounded to the nearest, so the value typed back could still be refused."""
    eng = engines["deepseek_v2"]
    with pytest.raises(ConfigError) as refused:
        eng.start_ids([1, 2, 3], RunSettings(policy="lru", cache_frac=0.01))
    said = re.fullmatch(r"cache budget (.+) is smaller than one layer's top-3 experts \((.+)\): raise --cache-frac "
                        r"to >= ([0-9.]+) or --cache-gb to >= ([0-9.]+)", str(refused.value))
    assert said, str(refused.value)
    assert said.group(1, 2) == (format_bytes(0.01 * eng.routed_bytes), format_bytes(eng.min_cache_bytes()))
    assert re.fullmatch(r"[0-9.]+ kB", said.group(2))          # the tiny model's experts are a few kB
    frac, gb = float(said.group(3)), float(said.group(4))
    for typed_back in (frac, gb * 1e9 / eng.routed_bytes):   # as --cache-frac, and as generate turns --cache-gb
        eng._validate(RunSettings(policy="lru", cache_frac=typed_back))


def test_cache_budget_below_top_k_via_cli(capsys, tiny_dirs):
    code, _, err = run_cli(capsys, "generate", "--model", str(tiny_dirs["deepseek_v2"]), "--prompt", "hi",
                           "--policy", "lru", "--cache-gb", "0.0000001")
    assert_one_line_error(code, err, "--cache-gb to >=")


def test_cli_generate_json_on_a_tiny_model(capsys, tiny_dirs):
    code, out, err = run_cli(capsys, "generate", "--model", str(tiny_dirs["qwen3_moe"]), "--prompt", "the cat saw a ball",
                             "--policy", "lru", "--cache-frac", "0.5", "--max-new-tokens", "6", "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert len(obj["tokens"]) == 6 and obj["summary"]["timing"] == "modeled"
    assert {"tpot_ms", "hit_rate", "bytes_per_token", "profile", "shape", "policy"} <= set(obj["summary"])
    assert len(obj["per_token"]) == 6


def test_prompt_longer_than_context(engines):
    eng = engines["deepseek_v2"]
    ctx = eng.lm.max_context_tokens
    with pytest.raises(PromptError, match="context"):
        eng.start_ids([1] * (ctx + 5), RunSettings(policy="lru", cache_frac=0.5))


@pytest.mark.parametrize("field,value", [("tau_prefetch", 1.5), ("tau_approx", -0.1), ("cache_frac", 2.0),
                                         ("max_lookahead", 0), ("max_new_tokens", 0), ("policy", "nope"),
                                         ("tau_int8", 1.5), ("tau_int8", -0.1), ("tau_int8", float("nan"))])
def test_run_settings_validate_with_the_field_name(field, value):
    with pytest.raises(ConfigError, match=field):
        RunSettings(**{field: value})


@pytest.mark.parametrize("field", sorted(SETTING_RANGES))
def test_run_settings_take_each_range_from_the_one_table(field):
    """Both ends of every range in SETTING_RANGES are taken, and a value past either end is refused in words
    that give the table's ends. Regression: max_lookahead's 1-64 was written out by hand in RunSettings."""
    low, high = SETTING_RANGES[field]
    RunSettings(**{field: low})
    RunSettings(**{field: high})
    past = (low - 1, high + 1) if isinstance(low, int) and not isinstance(low, float) else (low - 1e-3, high + 1e-3)
    for value in past:
        with pytest.raises(ConfigError, match=rf"{field}={value!r} is out of range: use .*\[{low:g}(\.0)?, "
                                              rf"{high:g}(\.0)?\]"):
            RunSettings(**{field: value})


def test_the_settings_range_table_cannot_be_changed_in_place():
    """Regression: SETTING_RANGES was a plain dict that any module (or a test's setitem) could widen behind
    RunSettings' back."""
    with pytest.raises(TypeError):
        SETTING_RANGES["tau_approx"] = (0.0, 2.0)
    with pytest.raises(AttributeError):
        SETTING_RANGES.pop("tau_approx")
    assert SETTING_RANGES["max_lookahead"] == (1, 64)


def test_hw_profile_missing_or_broken_is_one_clear_line(capsys, tiny_dirs, tmp_path):
    code, _, err = run_cli(capsys, "generate", "--model", str(tiny_dirs["mixtral"]), "--prompt", "hi",
                           "--hw-profile", str(tmp_path / "nope.json"))
    assert_one_line_error(code, err, "--hw-profile", "calibrate-hw")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = run_cli(capsys, "generate", "--model", str(tiny_dirs["mixtral"]), "--prompt", "hi",
                           "--hw-profile", str(bad))
    assert_one_line_error(code, err, "not valid JSON")


def test_generate_times_with_a_given_profile(capsys, tiny_dirs, tmp_path):
    """--hw-profile replaces --profile: a profile with a slow host shows in the modeled times."""
    import json as _json
    from dataclasses import replace

    from spice_core.timing.profiles import get_profile

    slow = tmp_path / "slow.json"
    slow.write_text(_json.dumps(replace(get_profile("h200-pcie5x16"), host_layer_us=20000.0).as_dict()))
    times = {}
    for name, extra in (("plain", []), ("slow", ["--hw-profile", str(slow)])):
        code, out, _ = run_cli(capsys, "generate", "--model", str(tiny_dirs["mixtral"]), "--prompt", "hi",
                               "--max-new-tokens", "3", "--json", "--profile", "h200-pcie5x16", *extra)
        assert code == 0
        times[name] = _json.loads(out)["summary"]["tpot_ms"]
    assert times["slow"] > times["plain"] + 20.0


@pytest.mark.parametrize("device", ["gpu", "tpu", "mps", "cuda:abc", "cpu:x"])
def test_a_device_that_is_not_cpu_or_cuda_is_one_clear_error_before_anything_loads(tmp_path, device):
    """A mistyped device is refused by name before the model is read (the path does not even exist)."""
    with pytest.raises(ModelLoadError, match=re.escape(f"--device {device}: use cpu or cuda")):
        load_model(tmp_path / "nowhere", device=device)


def test_the_app_refuses_a_mistyped_device_in_one_line(tmp_path):
    """app.py's --device takes what the CLI takes: a mistyped one is one argparse line, exit 2, no traceback."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(root / "app.py"), "--model", "spice-mini", "--device", "gpu"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "'gpu' is not a device: use cpu, cuda or cuda:N" in proc.stderr.strip().splitlines()[-1]


def test_the_app_refuses_a_taken_or_bad_port_in_one_line_before_loading(tmp_path):
    """Regression (review): with GRADIO_SERVER_PORT taken the app served on the next port without a word (a
    script polling the port asked for talked to the old app), and a port that is not a number was a traceback
    from Gradio's import. Both are one line, exit 2."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for value, said in ((str(port), f"port {port} on 127.0.0.1 (GRADIO_SERVER_PORT) is not free"),
                            ("http", "GRADIO_SERVER_PORT='http' is not a port: use a number from 1 to 65535")):
            env = dict(os.environ, GRADIO_SERVER_PORT=value, GRADIO_SERVER_NAME="127.0.0.1")
            proc = subprocess.run([sys.executable, str(root / "app.py"), "--model", "spice-mini"], env=env,
                                  capture_output=True, text=True, timeout=120, cwd=tmp_path)
            assert proc.returncode == 2, proc.stderr
            assert "Traceback" not in proc.stderr
            assert said in proc.stderr.strip().splitlines()[-1], proc.stderr
            assert "offloaded" not in proc.stderr, "refused before the model loads"


@pytest.mark.parametrize("args, kw, said", [
    (("",), {}, "model is empty: pass a shipped model's name"),
    ((123,), {}, "model=123: pass a folder (str or Path), a shipped model's name or a hub id, or None"),
    (("no-such-model",), {}, "model 'no-such-model' is neither a shipped model"),
    (("spice-mini",), {"artifacts": 7}, "artifacts=7: pass a folder (str or Path), or None"),
    (("spice-mini",), {"timing": "foo"}, "timing='foo'"),
    (("spice-mini",), {"executor": "bad"}, "executor='bad' is unknown"),
    (("spice-mini",), {"link_gbps": -1.0}, "link_gbps=-1.0 must be a positive number"),
    (("spice-mini",), {"prefetch_admission": "zzz"}, "prefetch_admission='zzz' is unknown"),
    (("spice-mini",), {"bogus": 1}, "SpiceEngine.load: unknown argument(s) bogus"),
])
def test_engine_load_refuses_bad_arguments_before_loading(monkeypatch, args, kw, said):
    """Regression (review): these were refused only after the model had loaded (seconds, minutes at full scale),
    or as a TypeError, or (an empty name) loaded the default model."""
    from spice_core import engine as engine_module
    from spice_core.engine import SpiceEngine

    def no_loading(*_a, **_k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(engine_module, "load_model", no_loading)
    with pytest.raises(ConfigError) as info:
        SpiceEngine.load(*args, device="cpu", **kw)
    assert said in str(info.value), str(info.value)


def test_engine_load_takes_a_shipped_models_name_as_the_command_line_does():
    """Regression (review): SpiceEngine.load("spice-mini") said "no such directory"; only the CLI knew the names."""
    from spice_core.engine import SpiceEngine

    assert SpiceEngine.load("spice-mini", device="cpu").info().model_name == "spice-mini"


def test_a_shard_whose_bytes_changed_is_named_by_its_checksum(tmp_path, tiny_dirs):
    """Regression (review): a shard with its data overwritten (header intact, NaN weights) loaded and generated an
    empty text, although the checkpoint's checksums.sha256 flagged it. Where that file lists a shard, it must match;
    an unchanged checkpoint with the file loads."""
    import hashlib
    import struct

    d = tmp_path / "sums"
    shutil.copytree(tiny_dirs["mixtral"], d)
    f = d / "model.safetensors"
    (d / "checksums.sha256").write_text("not a checksum line\n" + "".join(
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in (f, d / "config.json")))
    assert load_model(d, "cpu").n_experts > 0
    data = bytearray(f.read_bytes())
    header = struct.unpack("<Q", data[:8])[0]
    data[8 + header:] = b"\xff" * (len(data) - 8 - header)
    f.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"checkpoint file model.safetensors in .* does not match its digest in "
                                             r"checksums.sha256 \(corrupted or changed\): restore it"):
        load_model(d, "cpu")


def test_a_stray_safetensors_file_beside_the_checkpoint_is_not_read(tmp_path, tiny_dirs):
    """Regression (review): the loader opened every *.safetensors in the folder, so a stray or truncated calibration
    file there was "checkpoint shard ... corrupted" and the model did not load. It reads the shards transformers
    reads: the index's, else model.safetensors."""
    d = tmp_path / "stray"
    shutil.copytree(tiny_dirs["mixtral"], d)
    (d / "notes.safetensors").write_bytes(b"garbage")
    assert load_model(d, "cpu").n_experts > 0


def test_checksums_written_as_sha256sum_does_are_read_and_an_index_beside_a_single_file_is_ignored(tmp_path, tiny_dirs):
    """Review of the checksum check: `sha256sum ./*` lines ("./name") and a byte-order mark were skipped (the file went
    unchecked); with model.safetensors and a stale index side by side the index's shards were checked, though
    transformers loads model.safetensors."""
    import hashlib

    d = tmp_path / "sums2"
    shutil.copytree(tiny_dirs["mixtral"], d)
    f = d / "model.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "model-00009-of-00009.safetensors"}}))
    (d / "checksums.sha256").write_text("\ufeff" + "0" * 64 + "  ./model.safetensors\r\n", encoding="utf-8")
    with pytest.raises(ModelLoadError, match="model.safetensors .* or if you changed it on purpose, update or remove"):
        load_model(d, "cpu")
    (d / "checksums.sha256").write_text(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  ./model.safetensors\n")
    assert load_model(d, "cpu").n_experts > 0


def test_a_checkpoint_whose_weights_are_nan_is_refused_at_its_first_token(tmp_path, tiny_dirs):
    """Regression (review): without a checksums file, a checkpoint whose weights were NaN loaded and generated an
    empty text with exit 0. The first token's logits are checked: the run stops with a ModelOutputError that says
    what to do, it is recorded as an error, and the engine stays usable for another model's runs."""
    import torch
    from safetensors.torch import load_file, save_file

    from spice_core.engine import SpiceEngine
    from spice_core.errors import ModelOutputError
    from spice_core.run import RunSettings

    d = tmp_path / "nan"
    shutil.copytree(tiny_dirs["mixtral"], d)
    f = d / "model.safetensors"
    weights = load_file(f)
    save_file({k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in weights.items()},
              f, metadata={"format": "pt"})
    engine = SpiceEngine.load(d, device="cpu")
    run = engine.start_ids([5, 6, 7], RunSettings(policy="lru", max_new_tokens=4))
    with pytest.raises(ModelOutputError, match=r"logits for the first token are not finite .*restore the checkpoint"):
        list(run)
    assert engine.get_summary(run.run_id).finish_reason == "error"
    good = SpiceEngine.load(tiny_dirs["mixtral"], device="cpu")
    assert len(list(good.start_ids([5, 6, 7], RunSettings(policy="lru", max_new_tokens=4)))) == 4
