"""bench's quality passes (``"teacher_forced": true``): each policy's quality measured on the run's own device and code.

    prompt ─► the exact policy's greedy tokens (its timed run) ─► the exact policy fed those tokens again
           (teacher forcing: its logits along its own path, the reference) ─► every other policy fed the same
           tokens ─► per position: top-1 agreement (strict, and counting the reference's exact ties as agreeing),
           KL(reference ‖ policy), the NLL of the reference's token under each ─► sums in the record's totals
    the policy's greedy run ─► its first divergence from the reference: at an exact tie of the reference's logits?

Held-out text (``"heldout_text_tokens": N``): the same policies, and the exact one, are also fed windows of the
model's held-out evaluation text (its first token as the prompt, the rest forced, one token a step on the fast
path), so perplexity is measured on text no policy chose: its change against the exact policy's perplexity on
the same windows, KL and top-1 agreement. It runs with prompt 0 only, so a sharded run makes it once.

Why ties matter: greedy decoding in bf16 takes the argmax of logits rounded to bf16, and the exact model's top two
logits are equal at a few percent of positions (measured: 6% on the lifted miniature); at those the lower token id
wins and a change of summation order picks the other one as often as not.

A tie is the exact model's own indifference, not a loss of quality: greedy agreement over a whole generation loses
every position after one flip there, while the teacher-forced numbers measure every position on the exact path.

Pure bookkeeping over logits the runs produce (the passes are ordinary engine runs with
`GenerationRun.forced_ids`); the sums merge across shards like every other raw count (bench_records.QUALITY_SUMS,
which also derives the record's numbers from them).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

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
    run = engine.start_ids(ids, replace(settings, max_new_tokens=max(settings.max_new_tokens, len(forced))))
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


def heldout_windows(lm, model_dir: Path | None, tokens: int, window: int) -> tuple[list[list[int]], str]:
    """(windows of at most ``window`` token ids, at most ``tokens`` in all, source) of ``lm``'s held-out evaluation
    text: the shipped model's eval half (``model_dir``: the miniature a lifted model came from)."""
    from spice_core.predictor.traces import calibration_texts, tokenize_texts

    texts, source = calibration_texts(lm, part="eval", model_dir=model_dir)
    rows = [list(r) for r in tokenize_texts(lm, texts, seq_len=window, max_tokens=tokens) if len(r) >= 2]
    return rows, source


def text_totals(ref_logits: list[torch.Tensor], windows: list[list[int]], logits: list[torch.Tensor]) -> dict:
    """The held-out text sums of one policy: its forced logits per window against the exact policy's
    (``ref_logits``); each window's row i scores token i + 1."""
    out = {"text_positions": 0, "text_nll_sum": 0.0, "text_nll_ref_sum": 0.0, "text_kl_sum": 0.0, "text_top1": 0}
    for w, ref_l, pol_l in zip(windows, ref_logits, logits):
        n = min(len(w) - 1, ref_l.shape[0], pol_l.shape[0])
        target, at = torch.tensor(w[1:n + 1], dtype=torch.long), torch.arange(n)
        ref_lp, pol_lp = torch.log_softmax(ref_l[:n], -1), torch.log_softmax(pol_l[:n], -1)
        out["text_positions"] += n
        out["text_nll_sum"] += float(-pol_lp[at, target].sum())
        out["text_nll_ref_sum"] += float(-ref_lp[at, target].sum())
        out["text_kl_sum"] += float((ref_lp.exp() * (ref_lp - pol_lp)).sum(-1).clamp_min(0).sum())
        out["text_top1"] += int((pol_l[:n].argmax(-1) == ref_l[:n].argmax(-1)).sum())
    return out


class QualityPasses:
    """A bench block's quality passes: per prompt its reference path, made once (the block's policies run back to
    back per prompt, so one path is kept at a time), and each policy's sums against it; per (link, repetition,
    budget) the exact policy's logits on the held-out text windows, if any."""

    def __init__(self, policies, text_windows: list[list[int]] | None = None) -> None:
        """``policies``: the policies that get a teacher-forced pass (the config's ``"teacher_forced"``: true for
        all of them, or a list); every policy's greedy run is checked for a divergence at a tie.
        ``text_windows``: held-out text to feed them too (`heldout_windows`; None or empty: none)."""
        self.policies = policies
        self.text_windows = text_windows or []
        self._key, self._path = None, None
        self._text_key, self._text_ref = None, None

    def forced(self, policy: str, ref_policy: str) -> bool:
        return policy != ref_policy and (self.policies is True or policy in self.policies)

    def totals(self, engine, key, ids: list[int], settings, ref_policy: str, ref_tokens: list[int],
               greedy_tokens: list[int]) -> dict:
        if key != self._key:
            self._key = key
            self._path = reference_path(engine, ids, replace(settings, policy=ref_policy), ref_tokens)
        logits = forced_pass(engine, ids, settings, ref_tokens) if self.forced(settings.policy, ref_policy) else None
        return quality_totals(self._path, greedy_tokens, logits)

    def text(self, engine, key, settings, ref_policy: str) -> dict:
        """The held-out text sums of ``settings.policy`` (the exact policy's own: against itself, for its
        perplexity); {} for a policy without a teacher-forced pass or with no windows."""
        pol = settings.policy
        if not self.text_windows or (pol != ref_policy and not self.forced(pol, ref_policy)):
            return {}
        if key != self._text_key:
            ref_settings = replace(settings, policy=ref_policy)
            self._text_key = key
            self._text_ref = [forced_pass(engine, w[:1], ref_settings, w[1:]) for w in self.text_windows]
        if pol == ref_policy:
            logits = self._text_ref
        else:
            logits = [forced_pass(engine, w[:1], settings, w[1:]) for w in self.text_windows]
        return text_totals(self._text_ref, self.text_windows, logits)
