"""The agreement sweep's report: the fastest spice setting that reaches the agreement target, ratios against the
same file's baselines, CPU quality matched by setting, and a plain line when no setting reaches the target."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _report():
    spec = importlib.util.spec_from_file_location("agreement_report", ROOT / "benchmarks/agreement_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rec(policy, ms, variant="", agree=1.0, ta=0.05, tp=0.2, la=4):
    return {"policy": policy, "variant": variant, "link": "native", "budget_frac": 0.25, "tpot_ms_median": ms,
            "tpot_ms_median_ci95": [ms - 0.5, ms + 0.5], "bytes_per_token": 1e9, "hit_rate": 0.5,
            "miss_split": {"approx": 3, "cpu": 0, "copy": 2}, "greedy_agreement": agree,
            "n_runs": 8, "timing": "measured",
            "settings": {"tau_approx": ta, "tau_prefetch": tp, "max_lookahead": la, "lore_rank": 4}}


def test_the_fastest_setting_that_meets_the_target_is_named_with_its_ratio(tmp_path):
    rep = _report()
    records = [_rec("on_demand", 60.0, "headline"), _rec("lru", 48.0, "headline"),
               _rec("spice", 24.0, "headline", agree=0.70),
               _rec("spice", 30.0, "ta0.02", agree=0.93, ta=0.02), _rec("spice", 40.0, "ta0.01", agree=0.99, ta=0.01)]
    q = tmp_path / "q.json"
    q.write_text(json.dumps({"settings": {"tau_approx": 0.02, "tau_prefetch": 0.2, "max_lookahead": 4},
                             "rows": [{"link": "native", "budget_frac": 0.25, "ppl_delta_pct": 0.02,
                                       "greedy_agreement": 1.0, "top1_agreement": 0.99,
                                       "first_divergence": [None, 7]}]}))
    text = rep.report(records, rep._quality_rows([q]), 0.9)
    assert "τ_approx 0.02, τ_prefetch 0.2, lookahead 4 (ta0.02): 30.00 ms, 2.00× on_demand" in text
    assert "### Link native (timing measured)" in text
    row = next(line for line in text.splitlines() if "(ta0.02)" in line and line.startswith("|"))
    assert "| 2.00 | 1.60 |" in row                                 # ratios against the same file's baselines
    assert "| +0.02 | 1.000 | 0.990 | · 7 |" in row                 # the CPU run of its setting
    headline = next(line for line in text.splitlines() if "(headline)" in line and "spice" in line)
    assert headline.endswith("| – | – | – | – | – |")           # no CPU run at 0.05 given


def test_no_setting_meeting_the_target_is_said_plainly():
    rep = _report()
    text = rep.report([_rec("on_demand", 60.0), _rec("spice", 24.0, agree=0.7)], {}, 0.9)
    assert "No `spice` setting reached greedy agreement ≥ 0.9 (native)." in text


def test_a_missing_file_is_refused_with_its_name(tmp_path, capsys):
    rep = _report()
    assert rep.main(["--records", str(tmp_path / "none.json")]) == 2
    assert "none.json: no such file" in capsys.readouterr().err


def test_the_agreement_interval_resamples_prompts_and_is_reproducible():
    rep = _report()
    per_prompt = [1.0, 1.0, 0.2, 1.0, 0.9, 1.0, 1.0, 0.3]
    lo, hi = rep.agreement_ci(per_prompt)
    assert lo < sum(per_prompt) / len(per_prompt) < hi and 0.0 <= lo and hi <= 1.0
    assert rep.agreement_ci(per_prompt) == (lo, hi)          # seeded: the same table every time
    assert rep.agreement_ci([1.0] * 8) == (1.0, 1.0) and rep.agreement_ci([0.5]) is None
    rec = dict(_rec("spice", 24.0, agree=sum(per_prompt) / 8), raw={"agreements": per_prompt})
    assert f"0.800 [{lo:.2f}, {hi:.2f}]" in rep.report([rec], {}, 0.9)


def test_a_row_cut_short_is_shown_but_not_picked_and_a_full_rerun_replaces_it():
    rep = _report()
    short = dict(_rec("spice", 15.0, "ta0.1", agree=0.98, ta=0.1), n_runs=2)
    text = rep.report([_rec("on_demand", 60.0), _rec("spice", 24.0, "headline", agree=0.95), short], {}, 0.9)
    assert "| 2 (cut short) |" in text and "(headline): 24.00 ms" in text
    full = dict(_rec("spice", 16.0, "ta0.1", agree=0.7, ta=0.1), n_runs=8)
    text = rep.report([_rec("on_demand", 60.0), short, full], {}, 0.9)
    assert "(cut short)" not in text and "| 16.00 [" in text and "| 15.00 [" not in text


def test_links_get_sections_of_their_own():
    rep = _report()
    x8 = dict(_rec("spice", 45.0, agree=0.95), link="pcie4x8")
    text = rep.report([_rec("on_demand", 60.0), _rec("spice", 24.0, agree=0.7), x8], {}, 0.9)
    assert "### Link native" in text and "### Link pcie4x8" in text
    assert "(pcie4x8): τ_approx 0.05" in text and "No `spice` setting reached greedy agreement ≥ 0.9 (native)." in text


def test_the_committed_readme_holds_what_the_report_makes_of_the_committed_files():
    rep = _report()
    sweep = ROOT / "docs/benchmarks/cpu-lane/agreement"
    quality = rep._quality_rows(sorted((sweep / "quality-cpu").glob("*.json")))
    readme = (sweep / "README.md").read_text(encoding="utf-8")
    runs = (sweep / "native/results.partial.json", sweep / "part2/results.json")
    gpu = [r for p in runs for r in rep._load_records(p)]
    cpu = rep._load_records(sweep / "modeled-native/results.json")
    for records in (gpu, cpu):
        assert rep.report(records, quality, 0.9).replace("### Link", "#### Link") in readme


def test_a_file_that_is_not_bench_output_is_refused_with_its_name(tmp_path, capsys):
    rep = _report()
    bad = tmp_path / "notes.txt"
    bad.write_text("not json")
    assert rep.main(["--records", str(bad)]) == 2
    assert "notes.txt: is not valid JSON" in capsys.readouterr().err
