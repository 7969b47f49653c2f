"""The table of bench's quality passes (``"teacher_forced"``), from a results file.

    python benchmarks/quality_gpu_report.py docs/benchmarks/cpu-lane/quality-gpu/run/results.partial.json

One row per record: TPOT, miss split, greedy agreement with resident, how many greedy runs left resident and how
many of those at an exact tie of resident's logits, then the teacher-forced numbers (top-1 agreement strict and
with resident's ties agreeing, mean KL, the perplexity change of resident's continuation). Timing label: the
records' own ("measured" on a GPU). A file that is not bench output is refused with its name.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spice_core.errors import ConfigError  # noqa: E402
from spice_core.tools.bench_config import load_results  # noqa: E402

HEAD = ("| link | setting | policy | prompts | TPOT median ms | miss split approx/cpu/copy | greedy agreement | "
        "runs that left resident | of them at an exact tie | teacher-forced top-1 | top-1, ties agreeing | "
        "mean KL (nats) | perplexity change, resident's continuation |")


def _num(v, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def rows(records: list[dict]) -> list[str]:
    out = [HEAD, "|" + "---|" * HEAD.count(" | ") + "---|"]
    for r in records:
        ms = r.get("miss_split") or {}
        ppl = r.get("tf_ppl_delta_pct")
        split = f"{ms.get('approx', 0)}/{ms.get('cpu', 0)}/{ms.get('copy', 0)}"
        out.append(f"| {r['link']} | {r.get('variant') or '–'} | {r['policy']} | {r.get('n_runs')} | "
                   f"{_num(r.get('tpot_ms_median'), 2)} | {split} | "
                   f"{_num(r.get('greedy_agreement'))} | {r.get('divergences', '–')} | "
                   f"{r.get('divergences_at_tie', '–')} | {_num(r.get('tf_top1_agreement'), 4)} | "
                   f"{_num(r.get('tf_top1_agreement_ties'), 4)} | {_num(r.get('tf_kl_mean'), 5)} | "
                   f"{'–' if ppl is None else f'{ppl:+.3f}%'} |")
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.splitlines()[2].strip())
        return 2
    try:
        records = load_results(Path(argv[0]), "results")
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    timing = sorted({r["timing"] for r in records})
    ties = sorted({round(r["ref_tie_share"], 4) for r in records if r.get("ref_tie_share") is not None})
    print(f"timing: **{', '.join(timing)}**; resident's top two logits tie exactly (bf16) at a share of "
          f"{', '.join(f'{t:.3f}' for t in ties) or '–'} of its positions\n")
    print("\n".join(rows(records)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
