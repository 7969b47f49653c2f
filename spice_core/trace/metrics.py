"""Run-level numbers from per-token StepStats: TTFT, TPOT, hit rate, bytes and stalls per token.

Definitions (the UI, the CLI and the benchmarks all read them from here):
- TTFT is the first step's ``step_ms`` (it includes the prefill).
- TPOT (median and p90, linear interpolation) is over the decode steps, i.e. every step after the
  first; with one step there is no TPOT and it is reported as 0.0 (never NaN), as is tokens/s.
- tokens_per_s = 1000 / median TPOT.
- The *scope* of the rates is the decode steps, or every step when there is only the first one:
  hit_rate = (hit + prefetch_hit) / all outcomes in scope; miss_split counts approx / cpu / cpu_int8 /
  copy outcomes in scope (cpu_int8: the lossy int8 CPU run); hit_rate_per_layer is the same ratio per layer; bytes_per_token and
  stall_ms_per_token are means over the steps in scope. The prefill moves many tokens' experts
  at once, so mixing it into per-token rates would hide the decode behaviour we care about.
- A late prefetch is a stall, not a hit: a ``prefetch_hit`` whose copy arrived after its layer needed it
  (the step's PrefetchRecord for that layer and expert is ``late``) is accounted as ``prefetch_late``
  (`accounted_outcomes`), neither a hit nor a miss; late_prefetch_rate = prefetch_late / all outcomes in
  scope, so hit_rate + late_prefetch_rate + the misses' share = 1. The engine's own outcome stays
  ``prefetch_hit`` (the planner found the expert in the cache); only the accounts tell it apart.
- A trace holds the same outcomes as instants (trace/recorder.py writes both in one call, and marks a
  late prefetch's instant with ``LATE_DETAIL``); `outcomes_from_events` reads them back, so tables built
  from a trace match the StepStats'.
- When the steps in scope record no outcomes at all, hit_rate falls back to the steps'
  ``hits / (hits + misses)`` counters, and is 0.0 when those are zero too.

This module deliberately does not know how steps were timed (measured or modeled: ``timing``
is only passed through), what the policies do, or how anything is displayed.
"""
from __future__ import annotations

import math
from typing import Container, Iterable, Sequence

import numpy as np
import pandas as pd

from spice_core.records import ExpertOutcome, PrefetchRecord, RunSummary, StepStats
from spice_core.trace.events import CPU_INT8_OUTCOME, LATE_DETAIL, TraceEvent

HIT_OUTCOMES = ("hit", "prefetch_hit")
LATE_OUTCOME = "prefetch_late"            # a prefetch_hit that came late (see the module docstring)
MISS_OUTCOMES = ("approx", "cpu", CPU_INT8_OUTCOME, "copy")
ACCOUNT_OUTCOMES = (*HIT_OUTCOMES, LATE_OUTCOME, *MISS_OUTCOMES)
PER_LAYER_COLUMNS = ("layer", "selections", *ACCOUNT_OUTCOMES, "hit_rate")


def _finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if math.isfinite(v)]


def _mean(values: Sequence[float]) -> float:
    vals = _finite(values)
    return float(np.mean(vals)) if vals else 0.0


def rate_scope(steps: Sequence[StepStats]) -> list[StepStats]:
    """The steps per-token rates are taken over: decode steps (after the first), else all."""
    ordered = sorted(steps, key=lambda s: s.index)
    return ordered[1:] if len(ordered) > 1 else ordered


def scope_tokens(n_tokens: int) -> range:
    """Token indices per-token rates are taken over (see `rate_scope`): 1..n-1, or 0 alone."""
    return range(1, n_tokens) if n_tokens > 1 else range(0, n_tokens)


def late_keys(prefetches: Iterable[PrefetchRecord]) -> set[tuple[int, int]]:
    """(layer, expert) of the prefetches that were used after their copy was due: the layer stalled for them."""
    return {(p.layer, p.expert) for p in prefetches if p.late}


def accounted_outcomes(step: StepStats) -> tuple[ExpertOutcome, ...]:
    """The step's outcomes with each late prefetch (see `late_keys`) named ``prefetch_late``."""
    late = late_keys(step.prefetches)
    if not late:
        return step.outcomes
    return tuple(ExpertOutcome(o.layer, o.expert, LATE_OUTCOME)
                 if o.outcome == "prefetch_hit" and (o.layer, o.expert) in late else o for o in step.outcomes)


def outcomes_from_events(events: Iterable[TraceEvent], tokens: Container[int] | None = None) -> list[ExpertOutcome]:
    """The routed selections' outcomes as the recorder wrote them into the trace: ``hit`` and
    ``prefetch_hit`` instants (``prefetch_late`` where the instant's detail says it came late), and ``miss``
    instants whose detail names the miss's outcome, as `accounted_outcomes` names the steps'.
    ``tokens``: keep only these token indices (e.g. `scope_tokens(n)`)."""
    out = []
    for e in events:
        if tokens is not None and e.token not in tokens:
            continue
        if e.kind in HIT_OUTCOMES:
            late = e.kind == "prefetch_hit" and e.detail == LATE_DETAIL
            out.append(ExpertOutcome(e.layer, e.expert, LATE_OUTCOME if late else e.kind))
        elif e.kind == "miss" and e.detail in MISS_OUTCOMES:
            out.append(ExpertOutcome(e.layer, e.expert, e.detail))
    return out


def per_layer_table(steps: Sequence[StepStats]) -> pd.DataFrame:
    """Per MoE layer: selections, a count per accounted outcome (late prefetches apart), and
    hit_rate = (hit + prefetch_hit) / selections.

    Counts every outcome of the given steps (pass `rate_scope(steps)` for decode-only numbers).
    Rows are sorted by layer; layers without selections do not appear.
    """
    return per_layer_counts(o for s in steps for o in accounted_outcomes(s))


def per_layer_counts(outcomes: Iterable[ExpertOutcome]) -> pd.DataFrame:
    """`per_layer_table` over bare outcomes (from steps, or from a trace via `outcomes_from_events`)."""
    counts: dict[int, dict[str, int]] = {}
    for o in outcomes:
        row = counts.setdefault(o.layer, dict.fromkeys(ACCOUNT_OUTCOMES, 0))
        if o.outcome in row:
            row[o.outcome] += 1
    rows = []
    for layer in sorted(counts):
        row = counts[layer]
        selections = sum(row.values())
        hits = row["hit"] + row["prefetch_hit"]
        rows.append({"layer": layer, "selections": selections, **row,
                     "hit_rate": hits / selections if selections else 0.0})
    return pd.DataFrame(rows, columns=list(PER_LAYER_COLUMNS))


def _hit_and_late_rates(scope: Sequence[StepStats]) -> tuple[float, float]:
    """(hit_rate, late_prefetch_rate) over the steps in scope (the counters' fallback cannot tell late apart)."""
    outcomes = [o.outcome for s in scope for o in accounted_outcomes(s) if o.outcome in ACCOUNT_OUTCOMES]
    if outcomes:
        return sum(o in HIT_OUTCOMES for o in outcomes) / len(outcomes), outcomes.count(LATE_OUTCOME) / len(outcomes)
    hits = sum(s.hits for s in scope)
    total = hits + sum(s.misses for s in scope)
    return (hits / total if total else 0.0), 0.0


def matching_tokens(reference: Sequence[int], tokens: Sequence[int]) -> tuple[int, int]:
    """(positions where both hold the same token, positions compared): over the LONGER sequence, so a
    generation that stops early disagrees on the rest."""
    return sum(a == b for a, b in zip(reference, tokens)), max(len(reference), len(tokens))


def greedy_agreement(reference: Sequence[int], tokens: Sequence[int]) -> float:
    """Positional greedy agreement with the exact reference: matching positions / the longer length
    (1.0 when both are empty). The one definition the bench records, the quality report and the app's
    "agreement" use; pooled over several prompts, sum the `matching_tokens` pairs first."""
    same, total = matching_tokens(reference, tokens)
    return same / total if total else 1.0


def first_divergence(reference: Sequence[int], tokens: Sequence[int]) -> int | None:
    """The first position where the two differ (a sequence that stops early differs where it stops), or None."""
    first = next((i for i, (a, b) in enumerate(zip(reference, tokens)) if a != b), None)
    if first is None and len(reference) != len(tokens):
        first = min(len(reference), len(tokens))
    return first


def identical_prefix_share(reference: Sequence[int], tokens: Sequence[int]) -> float:
    """Share of the reference reproduced before the first divergence (1.0 = identical): a prefix
    measure, not greedy agreement (after a divergence the texts continue from different contexts)."""
    if not reference:
        return 1.0 if not tokens else 0.0
    first = first_divergence(reference, tokens)
    return 1.0 if first is None else min(first, len(reference)) / len(reference)


def p90(values: Sequence[float]) -> float:
    """The 90th percentile with linear interpolation (numpy's default), the one p90 of TPOT everywhere."""
    return float(np.percentile(values, 90))


def summarize(steps: Sequence[StepStats], *, run_id: str, policy: str, timing: str, profile: str,
              shape: str, notes: Sequence[str] = (), text: str = "", finish_reason: str = "") -> RunSummary:
    """Aggregate one run's steps into a RunSummary (see the module docstring for definitions)."""
    ordered = sorted(steps, key=lambda s: s.index)
    ttft_ms = float(ordered[0].step_ms) if ordered and math.isfinite(ordered[0].step_ms) else 0.0
    tpots = _finite([s.step_ms for s in ordered[1:]])
    tpot_median = float(np.median(tpots)) if tpots else 0.0
    tpot_p90 = p90(tpots) if tpots else 0.0
    tokens_per_s = 1000.0 / tpot_median if tpot_median > 0 else 0.0

    scope = rate_scope(ordered)
    miss_split = dict.fromkeys(MISS_OUTCOMES, 0)
    for s in scope:
        for o in s.outcomes:
            if o.outcome in miss_split:
                miss_split[o.outcome] += 1
    table = per_layer_table(scope)
    hit_rate_per_layer = {int(r.layer): float(r.hit_rate) for r in table.itertuples(index=False)}
    hit_rate, late_rate = _hit_and_late_rates(scope)

    return RunSummary(
        run_id=run_id, policy=policy, timing=timing, profile=profile, shape=shape,
        n_tokens=len(ordered), ttft_ms=ttft_ms, tpot_ms_median=tpot_median, tpot_ms_p90=tpot_p90,
        tokens_per_s=tokens_per_s, hit_rate=hit_rate, late_prefetch_rate=late_rate,
        bytes_per_token=_mean([s.bytes_copied for s in scope]),
        shape_bytes_per_token=_mean([s.shape_bytes_copied for s in scope]),
        stall_ms_per_token=_mean([s.stall_ms for s in scope]),
        miss_split=miss_split, hit_rate_per_layer=hit_rate_per_layer, notes=tuple(notes),
        text=text, finish_reason=finish_reason,
    )
