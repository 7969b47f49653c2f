"""The prefetch benchmark's floor charges the experts a token carried over the link, prefetches it used included,
and its report can be written again from a run's JSON alone (`--render`), identical but for what changed."""
import json

import pytest

from test_benchmark_scripts import load

INFO = {"model": "m", "shape": "s", "expert_mb_at_shape": 10.0, "routed_gb_per_token": 1.0, "timing": "modeled",
        "repetitions": 1, "prompts": 1, "prompt_tokens": [5], "max_new_tokens": 4, "tau_prefetch": 0.2,
        "max_lookahead": 4, "identical_tokens": True, "has_draft": True, "draft_bytes": 0,
        "environment": {"device": "cpu", "dtype": "float32", "torch": "x", "python": "3", "threads": 1}, "seconds": 1.0}


def _row(tpot: float, hit: float, copied: float, wasted: float = 0.0) -> dict:
    return {"tpot_median_ms": tpot, "tpot_p90_ms": tpot, "ttft_median_ms": 1.0, "hit_rate": hit,
            "experts_copied_per_token": copied, "experts_wasted_per_token": wasted, "stall_ms_per_token": 0.0,
            "lookahead_depth": 0.0, "stop_reasons": {}, "h_min": None, "draft_ms_per_token": 0.0, "notes": []}


def test_a_used_prefetch_crossed_the_link_and_a_wasted_one_is_not_charged():
    floor_ms = load("prefetch_modeled").floor_ms
    # every selection a hit, but all 100 of them prefetched over a 10 GB/s link: 100 x 10 MB = 1 GB = 100 ms
    assert floor_ms(_row(150.0, 1.0, 100.0), INFO, 10.0, 20.0) == pytest.approx(100.0)
    assert floor_ms(_row(150.0, 1.0, 100.0, wasted=40.0), INFO, 10.0, 20.0) == pytest.approx(60.0)
    assert floor_ms(_row(150.0, 1.0, 1.0), INFO, 10.0, 20.0) == pytest.approx(20.0)      # compute bounds it


def test_a_report_rendered_from_its_json_keeps_the_runs_command_and_numbers(tmp_path):
    mod = load("prefetch_modeled")
    prof = "h200-pcie5x16"
    table = {f"{prof} | compute": _row(5.0, 1.0, 0.0)}
    for pol, row in {"lru": _row(90.0, 0.3, 70.0), "oracle_prefetch": _row(60.0, 1.0, 70.0),
                     "spice_prefetch": _row(70.0, 0.8, 80.0, wasted=10.0)}.items():
        table[f"{prof} | 0.25 | {pol}"] = row
    dump = tmp_path / "run.json"
    dump.write_text(json.dumps({"info": INFO, "table": table, "sweep": {}}))
    out = tmp_path / "run.md"
    out.write_text("```\npython benchmarks/prefetch_modeled.py --profiles h200-pcie5x16 --out run.md\n```\n")
    assert mod.main(["--render", str(dump), "--out", str(out)]) == 0
    text = out.read_text()
    assert "python benchmarks/prefetch_modeled.py --profiles h200-pcie5x16 --out run.md" in text   # the run's own
    gbps = mod.get_profile(prof).h2d_pinned_gbps
    oracle = next(ln for ln in text.splitlines() if ln.startswith("| oracle_prefetch |"))
    assert f"| {70 * 10.0 / 1e3 / gbps * 1e3:.2f} |" in oracle      # 70 prefetched experts, not the compute floor
    assert "## Target: spice_prefetch closes >= 80%" in text
    out.unlink()                    # nothing says which command made the numbers: refused, nothing written
    assert mod.main(["--render", str(dump), "--out", str(out)]) == 2 and not out.exists()


def test_render_refuses_a_file_this_benchmark_did_not_write_with_a_message(tmp_path, capsys):
    mod = load("prefetch_modeled")
    out = tmp_path / "run.md"
    for i, text in enumerate(("not json", '{"x": 1}', '{"info": {}, "table": {"h200-pcie5x16 | compute": {}}}')):
        bad = tmp_path / f"bad{i}.json"
        bad.write_text(text)
        assert mod.main(["--render", str(bad), "--out", str(out)]) == 2
        assert str(bad) in capsys.readouterr().err and not out.exists()
