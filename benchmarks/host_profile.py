"""Where the fast path's host time goes, per policy: cProfile of decode steps on the lifted model (CUDA).

    python benchmarks/host_profile.py [--mini assets/spice-mini] [--policies spice lru] [--tokens 16]
        [--cache-frac 0.25] [--top 35] [--out FILE.txt]

One warm-up generation per policy, then one profiled generation of ``--tokens`` tokens; prints the top
functions by own time and by cumulative time, and the decoder's host µs per MoE layer (critical: the
GPU idle; overlapped: while a launched segment runs). cProfile slows Python down: read the split, not
the absolute times. Timing label: *measured* (wall clock, under a profiler).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spice_core.api import RunSettings  # noqa: E402
from spice_core.engine import SpiceEngine  # noqa: E402
from spice_core.heldout import DEFAULT_PROMPTS  # noqa: E402
from spice_core.tools.lift import lifted_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mini", type=Path, default=Path("assets/spice-mini"))
    ap.add_argument("--policies", nargs="+", default=["spice", "lru"])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--cache-frac", type=float, default=0.25)
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    lm, _, desc = lifted_model(a.mini, "cuda")
    from spice_core.tools.lift import lift_artifacts
    eng = SpiceEngine(lm, timing="measured", executor="graphed")
    eng.artifacts = lift_artifacts(a.mini, lm) or None      # the miniature's draft heads and LoRE, lifted
    text = io.StringIO()
    for policy in a.policies:
        st = RunSettings(policy=policy, cache_frac=a.cache_frac, max_new_tokens=a.tokens, tau_approx=0.05,
                         tau_prefetch=0.2, max_lookahead=4, lore_rank=4)
        list(eng.start_prompt(DEFAULT_PROMPTS[0], st))
        prof = cProfile.Profile()
        prof.enable()
        run = eng.start_prompt(DEFAULT_PROMPTS[1], st)
        steps = list(run)
        prof.disable()
        s = eng.get_summary(run.run_id)
        tot = run.record.totals
        print(f"===== {policy} on {desc}: TPOT median {s.tpot_ms_median:.2f} ms (profiled), {len(steps)} tokens; "
              f"host us/layer {tot.get('host_critical_us')} critical, {tot.get('host_overlap_us')} overlapped; "
              f"notes {s.notes}", file=text)
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(a.top)
            text.write(buf.getvalue())
    print(text.getvalue())
    if a.out:
        a.out.write_text(text.getvalue())


if __name__ == "__main__":
    main()
