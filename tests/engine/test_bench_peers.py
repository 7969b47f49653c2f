"""benchmarks/peers.py on the CPU: the offload placement for a budget, accelerate's device map, the plain greedy
loop against transformers' generate, the record format bench reads and merges, and the command line's refusals
(no CUDA, bad flags). No GPU and no accelerate needed: the GPU rows themselves run on the GPU machine."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from spice_core.errors import ConfigError
from spice_core.tools.bench_config import load_results
from spice_core.tools.bench_models import deepseek_v2_lite_config, param_counts, tiny_deepseek_config
from spice_core.tools.bench_records import derive, merge_records

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def peers():
    spec = importlib.util.spec_from_file_location("peers", ROOT / "benchmarks" / "peers.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["peers"] = mod          # dataclasses look their module up
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("peers", None)


@pytest.fixture(scope="module")
def tiny():
    """The tiny DeepSeek-V2 config as a real fp32 model: 5 layers, the first dense, 4 MoE layers of 16 experts."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_deepseek_config()).eval()


def test_the_budget_keeps_whole_moe_layers_on_the_gpu_from_the_first(peers, tiny):
    experts = peers.moe_experts(tiny)
    assert [e.layer for e in experts] == [1, 2, 3, 4]
    layer_bytes = 16 * 3 * 32 * 16 * 4            # experts x (gate, up, down) x hidden x width x fp32
    assert {e.nbytes for e in experts} == {layer_bytes} and experts[0].n_experts == 16
    for frac, gpu in [(0.25, [1]), (0.5, [1, 2]), (0.74, [1, 2]), (0.75, [1, 2, 3]), (0.1, []), (1.0, [1, 2, 3, 4])]:
        plan = peers.plan_offload(experts, frac)
        assert plan.budget_bytes == round(frac * 4 * layer_bytes)
        assert [e.layer for e in plan.gpu] == gpu and [e.layer for e in plan.cpu] == [x for x in (1, 2, 3, 4)
                                                                                    if x not in gpu]
        assert plan.gpu_bytes <= plan.budget_bytes < plan.gpu_bytes + layer_bytes or not plan.cpu
        assert plan.gpu_bytes + plan.cpu_bytes == 4 * layer_bytes


def test_deepseek_v2_lite_at_25_percent_offloads_20_of_its_26_moe_layers(peers):
    cfg = deepseek_v2_lite_config()
    routed, _ = param_counts(cfg)
    n_moe = cfg.num_hidden_layers - cfg.first_k_dense_replace
    layer = routed * 2 // n_moe                    # bf16: 64 experts x 3 x 2048 x 1408 x 2 bytes
    assert layer == 64 * 3 * 2048 * 1408 * 2
    experts = [peers.MoeExperts(i + 1, f"model.layers.{i + 1}.mlp.experts", layer, 64) for i in range(n_moe)]
    assert {frac: len(peers.plan_offload(experts, frac).cpu) for frac in (0.10, 0.25, 0.50)} == \
        {0.10: 24, 0.25: 20, 0.50: 13}


def _covering(device_map: dict, name: str) -> list[str]:
    return [k for k in device_map if k == "" or name == k or name.startswith(k + ".")]


def test_the_device_map_puts_only_the_offloaded_experts_on_the_cpu_and_covers_every_weight_once(peers, tiny):
    plan = peers.plan_offload(peers.moe_experts(tiny), 0.25)
    cpu = {e.module for e in plan.cpu}
    dmap = peers.offload_device_map(tiny, cpu, 0)
    assert {k for k, v in dmap.items() if v == "cpu"} == cpu == {f"model.layers.{i}.mlp.experts" for i in (2, 3, 4)}
    assert set(dmap.values()) == {0, "cpu"}
    # the layer kept on the GPU is one entry, an offloaded layer's attention, router and shared expert stay on it
    assert dmap["model.layers.1"] == 0 and dmap["model.layers.2.self_attn"] == 0
    assert dmap["model.layers.2.mlp.gate"] == 0 and dmap["model.layers.2.mlp.shared_experts"] == 0
    for name in [*tiny.state_dict(), *(n for n, _ in tiny.named_buffers())]:
        assert len(_covering(dmap, name)) == 1, name
    assert peers.offload_device_map(tiny, set(), 0) == {"": 0}
    with pytest.raises(ConfigError, match="no module named model.layers.9"):
        peers.offload_device_map(tiny, {"model.layers.9.mlp.experts"}, 0)


@pytest.mark.parametrize("implementation,static", [(None, False), ("batched_mm", True)])
def test_the_plain_greedy_loop_gives_transformers_generate_tokens(peers, tiny, implementation, static):
    ids = [5, 17, 33, 2, 90, 41]
    ref = tiny.generate(torch.tensor([ids]), max_new_tokens=6, min_new_tokens=6, do_sample=False,
                        pad_token_id=0)[0, len(ids):].tolist()
    before = tiny.get_experts_implementation()[""]
    try:
        if implementation:
            tiny.set_experts_implementation(implementation)
        g = peers.greedy_timed(tiny, ids, 6, peers.make_cache(tiny, static, len(ids) + 6), set(), torch.device("cpu"))
    finally:
        tiny.set_experts_implementation(before)
    assert g.tokens == ref
    assert len(g.step_ms) == 5 and all(ms > 0 for ms in g.step_ms) and g.ttft_ms > 0     # first token apart
    stop = peers.greedy_timed(tiny, ids, 6, peers.make_cache(tiny, False, 12), {ref[2]}, torch.device("cpu"))
    assert stop.tokens == ref[:3]                   # stops at an EOS token, as the engine does


def _peer(peers, tiny, budget: float, steps: list[float], prov: dict):
    experts = peers.moe_experts(tiny)
    plan = peers.plan_offload(experts, budget) if budget < 1 else None
    gens = [peers.Generation([1] * (len(steps) + 1), steps, 50.0, 1000)]
    setup = {"experts_implementation": "grouped_mm", "cache": "DynamicCache", "prompts": 1, "max_new_tokens": 8}
    return peers.peer_record("hf_offload" if plan else "hf_resident_eager", budget, gens, [0.75], model="lift:m",
                             experts=experts, top_k=4, plan=plan, link_gbps=50.0, prov=prov, setup=setup)


def test_a_peer_row_is_a_bench_record_that_merge_keeps_beside_a_bench_run(peers, tiny, tmp_path):
    rec = _peer(peers, tiny, 0.25, [3000.0, 3200.0, 3100.0], {"config": "p", "prompts": "p", "code": "p"})
    assert rec["policy"] == "peer_hf_offload" and rec["peer"] == "hf_offload" and rec["timing"] == "measured"
    assert rec["n_decode_tokens"] == 3 and rec["n_runs"] == 1 and rec["tpot_ms_median"] == 3100.0
    assert rec["hit_rate"] == 0.25                 # 1 of 4 MoE layers on the GPU
    assert rec["bytes_per_token"] == 3 * 98304      # every offloaded layer's whole experts, each token
    assert rec["miss_split"] == {"approx": 0, "cpu": 0, "copy": 3 * 4 * 3}
    assert rec["greedy_agreement"] == 0.75 and rec["routed_bytes_per_token"] == 4 * 4 * (98304 // 16)
    assert rec["peer_setup"]["offload"]["cpu_moe_layers"] == [2, 3, 4]
    resident_peer = _peer(peers, tiny, 1.0, [40.0, 41.0], {"config": "p", "prompts": "p", "code": "p"})
    assert resident_peer["hit_rate"] == 1.0 and resident_peer["bytes_per_token"] == 0

    path = tmp_path / "results.json"
    path.write_text(json.dumps([rec, resident_peer]))
    assert len(load_results(path, "--merge")) == 2           # what bench --merge and --replot read

    raw = {"step_ms": [8.0, 8.0], "ttft_ms": [90.0], "selections": 32, "hits": 32, "bytes": 0, "stall_ms": 0.0,
           "miss_split": {"copy": 0}, "wasted_prefetch_bytes": 0, "agreements": [1.0], "gpu_peak_bytes": 0, "n_runs": 1}
    bench = {"model": "lift:m", "timing": "measured", "profile": "this machine", "shape": "native", "link": "native",
             "budget_frac": 0.25, "policy": "resident", "workload": "prompts", "variant": "", "ppl_delta_pct": 0.0,
             "routed_bytes_per_token": rec["routed_bytes_per_token"], "link_gbps": 50.0, "raw": raw, **derive(raw),
             "provenance": {"config": "b", "prompts": "b", "code": "b"}}
    merged = {r["policy"]: r for r in merge_records([bench, rec, resident_peer], ["bench", "peers", "peers"])}
    assert set(merged) == {"resident", "peer_hf_offload", "peer_hf_resident_eager"}
    assert merged["peer_hf_resident_eager"]["floor_ms"] == 8.0          # bench's resident step is the compute floor
    link_ms = 0.75 * rec["routed_bytes_per_token"] / (50.0 * 1e6)       # 3 of 4 layers' selections over the link
    assert merged["peer_hf_offload"]["floor_ms"] == max(8.0, link_ms)

    other = _peer(peers, tiny, 0.5, [2000.0], {"config": "q", "prompts": "q", "code": "q"})
    with pytest.raises(ConfigError, match="provenance"):     # two peer runs of different configs are not one run
        merge_records([rec, other], ["peers", "other peers"])


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model": "lift:assets/spice-mini", "budgets": [0.25], "prompts": ["a", "b"],
                                "max_new_tokens": 4}))
    return path


def _run(peers, capsys, *argv):
    code = peers.main([str(a) for a in argv])
    err = capsys.readouterr().err
    return code, err


def test_without_cuda_it_says_it_needs_a_gpu_in_one_line(peers, config, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, err = _run(peers, capsys, "--config", config, "--out", tmp_path / "out")
    assert code == 2 and "needs a CUDA GPU" in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv,needle", [
    (["--peers", "hf_nope"], "--peers"),
    (["--peers", ""], "--peers"),
    (["--prompts", "3"], "--prompts 3"),
    (["--prompts", "0"], "--prompts"),
    (["--max-new-tokens", "-1"], "--max-new-tokens"),
    (["--offload-max-new-tokens", "1"], "--offload-max-new-tokens"),
    (["--surprise"], "--surprise"),
])
def test_bad_flags_are_refused_in_one_line(peers, config, tmp_path, capsys, monkeypatch, argv, needle):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)       # refused before any GPU work
    code, err = _run(peers, capsys, "--config", config, "--out", tmp_path / "out", *argv)
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_bad_or_modeled_config_is_refused_in_one_line(peers, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for body, needle in [({"model": "m", "budget": [0.25]}, "unknown keys"),
                         ({"model": "m", "timing": "modeled"}, "measured only")]:
        path = tmp_path / "c.json"
        path.write_text(json.dumps(body))
        code, err = _run(peers, capsys, "--config", path, "--out", tmp_path / "out")
        assert code == 2 and needle in err and err.count("\n") == 1
    code, err = _run(peers, capsys, "--config", tmp_path / "missing.json", "--out", tmp_path / "out")
    assert code == 2 and "--config" in err


def test_the_resident_rows_run_end_to_end_and_agree_with_the_engines_resident(peers, tmp_path):
    """The whole run on the CPU with a tiny random model (the GPU's timing aside): records written, prompts and
    tokens as asked, greedy agreement with the engine's resident measured on the same prompts."""
    cfg = {"model": "random:tiny-deepseek", "budgets": [0.25], "prompts": {"random_ids": 3, "length": 8},
           "max_new_tokens": 5}
    opts = peers.Options(rows=(peers.ROWS["hf_resident_eager"], peers.ROWS["hf_resident_static"]), prompts=2,
                         max_new_tokens=5, offload_prompts=2, offload_max_new_tokens=4, agreement=True)
    peers.run_peers(cfg, opts, tmp_path, device=torch.device("cpu"))
    records = {r["policy"]: r for r in load_results(tmp_path / "results.json", "--merge")}
    assert set(records) == {"peer_hf_resident_eager", "peer_hf_resident_static"}
    for r in records.values():
        assert r["n_runs"] == 2 and 2 <= r["n_decode_tokens"] <= 8 and r["budget_frac"] == 1.0
        assert r["greedy_agreement"] == 1.0 and r["hit_rate"] == 1.0
        assert r["peer_setup"]["prompts"] == 2 and r["peer_setup"]["max_new_tokens"] == 5
    assert records["peer_hf_resident_static"]["peer_setup"]["experts_implementation"] == "batched_mm"
    assert records["peer_hf_resident_static"]["peer_setup"]["cache"] == "StaticCache"
    assert "peer_hf_resident_static" in (tmp_path / "results.md").read_text()
