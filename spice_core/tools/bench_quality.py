"""bench's quality passes (``"teacher_forced": true``): each policy's quality measured on the run's own device and code.

    prompt ─► the exact policy's greedy tokens (its timed run) ─► the exact policy fed those tokens again
           (teacher forcing: its logits along its own path, the reference) ─► every other policy fed the same
           tokens ─► per position: top-1 agreement (strict, and with the reference's exact ties counted as agreeing),
           KL(reference ‖ policy), the NLL of the reference's token under each ─► sums in the record's totals
    the policy's greedy run ─► its first divergence from the reference: at an exact tie of the reference's logits?

Why ties: greedy decoding in bf16 takes the argmax of logits rounded to bf16 (a step of 0.125 between 16 and 32),
so the exact model's top two logits are often *equal* and the lower token id wins; any change of summation order
(the CPU lane's exact experts, another kernel) then picks the other one as often as not, and greedy agreement over
a whole generation loses every position after that first flip. A divergence at such a tie is the exact model's own
indifference, not a loss of quality; the teacher-forced numbers measure every position on the exact path, so one
flip does not decide the rest.

Pure bookkeeping over logits the runs produce (the passes are ordinary engine runs with
`GenerationRun.forced_ids`); the sums merge across shards like every other raw count (bench_records.QUALITY_SUMS,
which also derives the record's numbers from them).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from spice_core.trace.metrics import first_divergence

@dataclass(frozen=True)
class ReferencePath:
    """The exact policy's tokens of one prompt and its logits [n, V] (float32, host) along them."""

    tokens: list[int]
    logits: torch.Tensor

    def tied(self, p: int, token: int) -> bool:
        """Whether ``token`` ties for the top logit at position ``p`` (an exact tie in the logits' own dtype)."""
        row = self.logits[p]
        return bool(row[token] == row.max())


def forced_pass(engine, ids: list[int], settings, forced: list[int]) -> torch.Tensor:
    """[len(forced), V] float32 on the host: the logits of each step of a run fed ``forced`` (teacher forcing)."""
    run = engine.start_ids(ids, settings)
    run.forced_ids = list(forced)
    rows = []
    for _ in run:
        rows.append(run.last_logits.float().cpu())
    return torch.stack(rows)


def reference_path(engine, ids: list[int], settings, tokens: list[int]) -> ReferencePath:
    """The exact policy fed its own greedy ``tokens``: the same logits its greedy run saw, kept."""
    return ReferencePath(list(tokens), forced_pass(engine, ids, settings, tokens))


def quality_totals(ref: ReferencePath, greedy_tokens: list[int] | None, logits: torch.Tensor | None) -> dict:
    """One generation's quality sums against ``ref``: the teacher-forced pass's ``logits`` [n, V] (None: not run)
    and where its greedy run (``greedy_tokens``) first left the reference, and whether that was at a tie."""
    n_ref = len(ref.tokens)
    top2 = ref.logits.topk(2, dim=-1).values if ref.logits.shape[-1] > 1 else None
    out = {"ref_positions": n_ref,
           "ref_tie_positions": int((top2[:, 0] == top2[:, 1]).sum()) if top2 is not None else 0}
    if greedy_tokens is not None:
        p = first_divergence(ref.tokens, greedy_tokens)
        diverged = p is not None and p < min(n_ref, len(greedy_tokens))
        out["diverged_runs"] = int(diverged)
        out["diverged_at_tie"] = int(diverged and ref.tied(p, greedy_tokens[p]))
    if logits is not None:
        n = min(n_ref, logits.shape[0])
        ref_l, pol_l = ref.logits[:n], logits[:n]
        target = torch.tensor(ref.tokens[:n], dtype=torch.long)
        ref_lp, pol_lp = torch.log_softmax(ref_l, -1), torch.log_softmax(pol_l, -1)
        pick = pol_l.argmax(-1)
        at = torch.arange(n)
        out.update({
            "tf_positions": n,
            "tf_top1": int((pick == target).sum()),
            "tf_top1_ties": int((ref_l[at, pick] == ref_l.max(-1).values).sum()),
            "tf_kl_sum": float((ref_lp.exp() * (ref_lp - pol_lp)).sum(-1).clamp_min(0).sum()),
            "tf_nll_sum": float(-pol_lp[at, target].sum()),
            "tf_nll_ref_sum": float(-ref_lp[at, target].sum()),
        })
    return out



class QualityPasses:
    """A bench block's quality passes: per prompt its reference path, made once (the block's policies run back to
    back per prompt, so one path is kept at a time), and each policy's sums against it."""

    def __init__(self, policies) -> None:
        """``policies``: the policies that get a teacher-forced pass (the config's ``"teacher_forced"``: true for
        all of them, or a list); every policy's greedy run is checked for a divergence at a tie."""
        self.policies = policies
        self._key, self._path = None, None

    def totals(self, engine, key, ids: list[int], settings, ref_policy: str, ref_tokens: list[int],
               greedy_tokens: list[int]) -> dict:
        if key != self._key:
            from dataclasses import replace
            self._key = key
            self._path = reference_path(engine, ids, replace(settings, policy=ref_policy), ref_tokens)
        pol = settings.policy
        run_forced = pol != ref_policy and (self.policies is True or pol in self.policies)
        logits = forced_pass(engine, ids, settings, ref_tokens) if run_forced else None
        return quality_totals(self._path, greedy_tokens, logits)
