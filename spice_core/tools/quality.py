"""Quality of any policy and thresholds against the exact model, and `python -m spice_core quality`.

    held-out text ─► windows ─► teacher forcing, one token per step through the engine's runtime
                                 ├─ exact reference (policy resident)   ─► perplexity, logits
                                 └─ the policy under test               ─► perplexity, logits, miss split
                                 ─► perplexity delta, mean KL(exact ‖ policy), top-1 agreement
    prompt set ─► greedy generation (engine.start_ids) exact and under the policy
                                 ─► share of identical tokens, first divergence position

Teacher forcing feeds the true next token but runs the model exactly as decoding does: one token
per forward pass with the KV cache, the runtime installed (the same cache state, prefetches,
hits and per-token miss decisions as a generation would see). A single prefill pass over the
text would not do: with many tokens in one pass nearly every expert is needed by some token
with a large router weight, so hardly anything would be approximated.

Exact policies give bit-identical logits here (KL 0, delta 0), so any nonzero number is the
cost of approximation. Modeled timing only: quality does not depend on the clock. This module
knows nothing of plotting or of the benchmark that sweeps it.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from spice_core.config import DEFAULT_LORE_RANK, SETTING_RANGES, RunSettings
from spice_core.trace.metrics import first_divergence, matching_tokens
from spice_core.exec.experts import installed
from spice_core.errors import ConfigError
from spice_core.user_files import file_problem

EXACT_REFERENCE_POLICY = "resident"
DEFAULT_MAX_TOKENS = 1024      # teacher-forced tokens scored
DEFAULT_WINDOW = 128           # tokens per teacher-forced window (each starts with a fresh cache)
DEFAULT_PROMPTS = 8
DEFAULT_PROMPT_TOKENS = 24
DEFAULT_NEW_TOKENS = 32


@dataclass(frozen=True)
class QualityReport:
    """One policy + thresholds against the exact model. ``*_pct`` in percent."""

    policy: str
    tau_approx: float
    lore_rank: int
    cpu_lane: bool
    cache_frac: float
    profile: str
    tokens: int                     # teacher-forced predictions scored
    ppl: float
    ppl_exact: float
    ppl_delta_pct: float
    mean_kl: float                  # nats per token, KL(exact ‖ policy)
    top1_agreement: float           # teacher-forced: argmax identical
    miss_split: dict = field(default_factory=dict)   # outcome -> count over the teacher-forced steps
    prompts: int = 0
    new_tokens: int = 0
    greedy_agreement: float = 1.0   # share of identical greedy tokens over the prompt set
    first_divergence: tuple = ()    # per prompt: index of the first differing token, or None
    source: str = ""
    notes: tuple = ()
    step_ms_median: float = 0.0     # modeled ms per teacher-forced step (one decode-like token each)
    tau_int8: float = 0.0           # lossy int8 CPU runs below this router weight (0: off)
    step_ms_timing: str = "modeled"  # how step_ms_median was timed: "modeled (profile P, shape S)"

    @property
    def approx_share(self) -> float:
        n = sum(self.miss_split.values())
        return self.miss_split.get("approx", 0) / n if n else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["approx_share"] = self.approx_share
        d["first_divergence"] = list(self.first_divergence)
        return d


# ---------------------------------------------------------------------- running the model
@contextmanager
def installed_runtime(engine, settings: RunSettings):
    """The engine's runtime for ``settings`` installed on every MoE layer (modeled timing), as
    `GenerationRun` does for a generation; yields (runtime, notes). Holds the engine's lock."""
    from spice_core.engine import EngineBusyError

    engine._validate(settings)
    if not engine._lock.acquire(blocking=False):   # the engine's one-generation-at-a-time lock
        raise EngineBusyError("the engine is busy with another generation: wait for it to finish")
    try:
        notes: list[str] = []
        rt = engine.build_runtime(settings, notes=notes, modeled=True)
        with installed(engine.lm, rt):
            yield rt, notes
    finally:
        engine._lock.release()


@dataclass(frozen=True)
class ForcedPass:
    """One teacher-forced pass: logits [len(ids)-1, V] (float32, CPU), the outcome of every routed selection,
    the runtime's notes and the modeled ms of each step (decode-like: one token per forward pass)."""

    logits: torch.Tensor
    outcomes: Counter
    notes: list
    step_ms: list


@torch.no_grad()
def forced_pass(engine, ids: list[int], settings: RunSettings) -> ForcedPass:
    """Feed ``ids`` one token per step with ``settings``' runtime installed (modeled timing)."""
    from transformers import DynamicCache

    lm = engine.lm
    out_logits, outcomes, step_ms = [], Counter(), []
    with installed_runtime(engine, settings) as (rt, notes):
        cache = DynamicCache(config=lm.model.config)
        for t, tok in enumerate(ids[:-1]):
            rt.begin_token(t)
            out = lm.model(input_ids=torch.tensor([[tok]], device=lm.device), use_cache=True,
                           **{engine._fwd_cache_kw: cache})
            step_ms.append(float(rt.end_token()))
            token = rt.recorder.end_token()
            out_logits.append(out.logits[0, -1].float().cpu())
            outcomes.update(o.outcome for o in token.outcomes)
    return ForcedPass(torch.stack(out_logits), outcomes, notes, step_ms)


def forced_logits(engine, ids: list[int], settings: RunSettings) -> tuple[torch.Tensor, Counter, list[str]]:
    """Logits [len(ids)-1, V] predicting ids[1:] when ids[:t+1] was fed one token per step (float32,
    CPU), the outcomes of every routed selection, and the runtime's notes."""
    p = forced_pass(engine, ids, settings)
    return p.logits, p.outcomes, p.notes


def greedy_tokens(engine, prompt: list[int], settings: RunSettings, max_new_tokens: int) -> list[int]:
    run = engine.start_ids(prompt, replace(settings, max_new_tokens=max_new_tokens, temperature=0.0))
    return [step.token_id for step in run]


def agreement(reference: list[int], tokens: list[int]) -> tuple[int, int | None]:
    """(matching positions, first divergence): trace.metrics' definitions (greedy agreement pools the
    matching positions over the longer length of each pair)."""
    return matching_tokens(reference, tokens)[0], first_divergence(reference, tokens)


# ---------------------------------------------------------------------- data
@dataclass(frozen=True)
class EvalSet:
    windows: tuple[tuple[int, ...], ...]     # teacher-forced token windows
    prompts: tuple[tuple[int, ...], ...]     # greedy prompts
    source: str


def eval_set(engine, *, text_file: Path | None = None, prompts_file: Path | None = None,
             max_tokens: int = DEFAULT_MAX_TOKENS, window: int = DEFAULT_WINDOW, n_prompts: int = DEFAULT_PROMPTS,
             prompt_tokens: int = DEFAULT_PROMPT_TOKENS, chat_prompts: bool = False) -> EvalSet:
    """Held-out windows and prompts for ``engine``'s model. Default text: the evaluation half of
    the calibration module's held-out set (disjoint from what calibration fits on, for the shipped
    model); prompts: one per line of ``prompts_file``, else ``chat_prompts``: held-out chat requests through
    the chat template (`chat_requests`), else the openings of held-out texts."""
    from spice_core.predictor.traces import calibration_texts, read_text_file, tokenize_texts

    if max_tokens < 2 or window < 2:
        raise ConfigError(f"--max-tokens {max_tokens} / --window {window}: use at least 2 tokens each")
    lm = engine.lm
    if window > lm.max_context_tokens:
        raise ConfigError(f"--window {window} is longer than the model's context ({lm.max_context_tokens}): "
                          f"use --window <= {lm.max_context_tokens}")
    texts, source = calibration_texts(lm, text_file, part="eval")
    windows = [tuple(r) for r in tokenize_texts(lm, texts, seq_len=window, max_tokens=max_tokens) if len(r) >= 2]
    if not windows:
        raise ConfigError(f"the held-out text ({source}) gave no window of >= 2 tokens: pass a longer --text file")
    if prompts_file is not None:
        from spice_core.user_files import read_text

        lines = [ln.strip() for ln in read_text(prompts_file, "--prompts").splitlines()]
        prompt_texts = [ln for ln in lines if ln]
        if not prompt_texts:
            raise ConfigError(f"--prompts {prompts_file}: holds no prompt: write one prompt per line")
        prompts = [lm.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompt_texts]
    elif chat_prompts:
        prompts, asked = chat_requests(engine, n_prompts)
        source += f" (prompts: {asked})"
    else:
        prompts = []
        for text in reversed(texts):     # the far end of the held-out set: not the scored windows
            ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"][:prompt_tokens]
            if len(ids) >= 2:
                prompts.append(ids)
            if len(prompts) >= n_prompts:
                break
        if text_file is not None:
            source += f" (prompts: openings of {len(prompts)} of its documents)"
    prompts = [p for p in prompts if p]
    if not prompts:
        raise ConfigError("no usable prompt: pass --prompts FILE with one prompt per line")
    return EvalSet(tuple(windows), tuple(tuple(p) for p in prompts), source)


def chat_requests(engine, n: int) -> tuple[list[list[int]], str]:
    """(token ids of ``n`` chat requests, what they are): the held-out chat requests beside the shipped model (never
    trained on), else the built-in prompts, each sent as one user message through the model's chat template, as a
    chat sends it (`generation.build_prompt_ids`)."""
    from spice_core import heldout
    from spice_core.generation import build_prompt_ids
    from spice_core.predictor.traces import shipped_folder

    folder = shipped_folder(engine.lm)
    data = heldout.load_heldout(folder) if folder is not None else None
    asked = [p["chat"] for p in data["prompts"] if "chat" in p] if data is not None else []
    what = "held-out chat requests"
    if not asked:
        asked, what = list(heldout.DEFAULT_PROMPTS), "built-in prompts sent as chat requests"
    ids = [build_prompt_ids(engine.lm.tokenizer, messages=[{"role": "user", "content": m}]) for m in asked[:n]]
    return ids, f"{len(ids)} {what}, chat template"


# ---------------------------------------------------------------------- metrics
@dataclass
class ExactReference:
    """The exact model's teacher-forced logits and greedy tokens on an `EvalSet` (computed once,
    shared by every policy a sweep evaluates)."""

    data: EvalSet
    logits: list[torch.Tensor]
    tokens: list[list[int]]
    new_tokens: int


class Stopped(Exception):
    """A quality pass asked to stop (``should_stop``) ended between two of its windows or prompts."""


def _check(should_stop) -> None:
    if should_stop is not None and should_stop():
        raise Stopped("stopped")


def exact_reference(engine, data: EvalSet, new_tokens: int = DEFAULT_NEW_TOKENS, base: RunSettings | None = None,
                    should_stop=None):
    """``should_stop``: asked before each window and prompt; True ends the pass with `Stopped` (a tune's Stop must
    not wait for a whole pass, a minute and more on a CPU)."""
    s = replace(base or RunSettings(), policy=EXACT_REFERENCE_POLICY, tau_approx=0.0)
    logits, tokens = [], []
    for w in data.windows:
        _check(should_stop)
        logits.append(forced_logits(engine, list(w), s)[0])
    for p in data.prompts:
        _check(should_stop)
        tokens.append(greedy_tokens(engine, list(p), s, new_tokens) if new_tokens > 0 else [])
    return ExactReference(data, logits, tokens, new_tokens)


def _nll(logits: torch.Tensor, targets: list[int]) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits, torch.tensor(targets), reduction="none")


def evaluate(engine, settings: RunSettings, ref: ExactReference, should_stop=None) -> QualityReport:
    """Teacher-forced perplexity, mean KL and top-1 agreement against ``ref``, and greedy agreement
    over its prompts, for ``settings`` (any policy and thresholds). ``should_stop`` as for `exact_reference`."""
    nll, nll_exact, kls, top1, n = 0.0, 0.0, 0.0, 0, 0
    split: Counter = Counter()
    notes: set[str] = set()
    step_ms: list[float] = []
    for w, exact in zip(ref.data.windows, ref.logits):
        _check(should_stop)
        fp = forced_pass(engine, list(w), settings)
        got = fp.logits
        split.update(fp.outcomes)
        notes.update(fp.notes)
        step_ms.extend(fp.step_ms[1:])      # the first step of a window starts from an empty cache
        targets = list(w[1:])
        nll += float(_nll(got, targets).sum())
        nll_exact += float(_nll(exact, targets).sum())
        logp_e, logp_g = torch.log_softmax(exact, -1), torch.log_softmax(got, -1)
        kls += float((logp_e.exp() * (logp_e - logp_g)).sum(-1).clamp_min(0).sum())
        top1 += int((exact.argmax(-1) == got.argmax(-1)).sum())
        n += len(targets)
    same, total, firsts = 0, 0, []
    for prompt, exact_toks in zip(ref.data.prompts, ref.tokens):
        _check(should_stop)
        toks = greedy_tokens(engine, list(prompt), settings, ref.new_tokens) if ref.new_tokens > 0 else []
        k, first = agreement(exact_toks, toks)
        same += k
        total += matching_tokens(exact_toks, toks)[1]
        firsts.append(first)
    ppl, ppl_exact = math.exp(nll / n), math.exp(nll_exact / n)
    profile = engine.machine.modeled_profile(settings.profile).name      # a --hw-profile file's own name
    return QualityReport(
        policy=settings.policy, tau_approx=settings.tau_approx, lore_rank=settings.lore_rank,
        cpu_lane=settings.cpu_lane, cache_frac=settings.cache_frac, profile=profile, tokens=n, ppl=ppl,
        ppl_exact=ppl_exact, ppl_delta_pct=100.0 * (ppl / ppl_exact - 1.0), mean_kl=kls / n, top1_agreement=top1 / n,
        miss_split=dict(sorted(split.items())), prompts=len(ref.data.prompts),
        new_tokens=ref.new_tokens, greedy_agreement=same / total if total else 1.0, first_divergence=tuple(firsts),
        source=ref.data.source, notes=tuple(sorted(notes)),
        step_ms_median=statistics.median(step_ms) if step_ms else 0.0, tau_int8=settings.tau_int8,
        step_ms_timing=f"modeled (profile {profile}, shape {settings.shape})")


# ---------------------------------------------------------------------- CLI
def add_cli(sub) -> None:
    from spice_core.tools import args as ca
    from spice_core.config import MAX_NEW_TOKENS_LIMIT
    from spice_core.tools.generate import add_engine_args

    p = sub.add_parser("quality", help="perplexity, KL and greedy agreement of a policy against the exact model",
                       description="Teacher-forced perplexity and mean KL against the exact model on held-out text, "
                                   "and greedy agreement over a prompt set, for any policy and thresholds.")
    add_engine_args(p)
    p.add_argument("--text", type=ca.utf8_text_file, default=None,
                   help="held-out UTF-8 text (documents separated by blank lines); default: the evaluation half "
                        "of the shipped model's held-out split, or a built-in set for other models")
    p.add_argument("--prompts", type=ca.utf8_text_file, default=None, help="prompt file, one prompt per line "
                                                              "(default: openings of held-out texts)")
    p.add_argument("--max-tokens", type=ca.int_in(2, 10_000_000), default=DEFAULT_MAX_TOKENS, help="teacher-forced tokens to score")
    p.add_argument("--window", type=ca.int_in(2, 1_000_000), default=DEFAULT_WINDOW, help="tokens per teacher-forced window")
    p.add_argument("--n-prompts", type=ca.int_in(1, 100_000), default=DEFAULT_PROMPTS, help="prompts for greedy agreement")
    p.add_argument("--new-tokens", type=ca.int_in(0, MAX_NEW_TOKENS_LIMIT), default=DEFAULT_NEW_TOKENS, help="greedy tokens per prompt (0: skip)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_cli, policy="spice")


def _check_args(args) -> None:
    low, high = SETTING_RANGES["tau_approx"]
    if not low <= args.tau_approx <= high:
        raise ConfigError(f"--tau-approx {args.tau_approx} is out of range: use a value in [{low:g}, {high:g}] "
                          "(0 = exact)")
    if args.lore_rank < 1:
        raise ConfigError(f"--lore-rank {args.lore_rank} is out of range: use an integer >= 1")
    if args.new_tokens < 0 or args.n_prompts < 1:
        raise ConfigError(f"--new-tokens {args.new_tokens} / --n-prompts {args.n_prompts}: use >= 0 / >= 1")


def run_cli(args) -> int:
    from spice_core.tools.generate import load_engine, settings_from_args

    _check_args(args)
    for flag, path in (("--text", args.text), ("--prompts", args.prompts)):
        if path is not None and not Path(path).is_file():    # before the model loads
            raise ConfigError(f"{flag} {path}: {file_problem(path)}: pass a UTF-8 text file"
                              + (" with one prompt per line" if flag == "--prompts" else ""))
    engine = load_engine(args)
    settings = settings_from_args(args, engine)
    engine._validate(settings)
    if settings.policy in ("spice", "spice_no_cpu"):     # the rank reported is the one used, whatever tau_approx
        lore = engine.artifacts.lore if engine.artifacts is not None else None
        if lore is not None:
            if settings.lore_rank == DEFAULT_LORE_RANK and lore.max_rank < DEFAULT_LORE_RANK:
                # The default means "up to 16", as in generate: smaller factors (the shipped model's) are used whole.
                settings = replace(settings, lore_rank=lore.max_rank)
            lore.with_rank(settings.lore_rank)          # a bad --lore-rank fails before the long work
    data = eval_set(engine, text_file=args.text, prompts_file=args.prompts, max_tokens=args.max_tokens,
                    window=args.window, n_prompts=args.n_prompts)
    ref = exact_reference(engine, data, args.new_tokens, base=settings)
    rep = evaluate(engine, settings, ref)
    if args.json:
        out = rep.as_dict()
        if rep.new_tokens == 0:          # nothing generated: no agreement was measured
            out.update(greedy_agreement=None, first_divergence=None)
        print(json.dumps(out, allow_nan=False))
    else:
        print(format_report(rep))
    return 0


def format_report(rep: QualityReport) -> str:
    firsts = [f for f in rep.first_divergence if f is not None]
    rows = [("policy", rep.policy), ("tau_approx", rep.tau_approx), ("lore rank", rep.lore_rank),
            ("cpu lane", "on" if rep.cpu_lane else "off"), ("cache frac", rep.cache_frac),
            ("held-out tokens", rep.tokens), ("perplexity", f"{rep.ppl:.4f}"), ("perplexity (exact)", f"{rep.ppl_exact:.4f}"),
            ("perplexity delta", f"{rep.ppl_delta_pct:+.3f}%"), ("mean KL (nats/token)", f"{rep.mean_kl:.5f}"),
            ("top-1 agreement (forced)", f"{rep.top1_agreement:.4f}"),
            ("misses approx/cpu/copy", "/".join(str(rep.miss_split.get(k, 0)) for k in ("approx", "cpu", "copy"))),
            *([("tau_int8, misses on the CPU from int8", f"{rep.tau_int8:g}, {rep.miss_split.get('cpu_int8', 0)}")]
              if rep.tau_int8 > 0 else []),
            *([("greedy agreement", f"{rep.greedy_agreement:.4f} over {rep.prompts} prompts x {rep.new_tokens} tokens"),
               ("first divergence", f"{len(firsts)} of {rep.prompts} prompts diverge"
                                    + (f", first at token {min(firsts)}" if firsts else ""))] if rep.new_tokens > 0
              else [("greedy agreement", "not measured (--new-tokens 0)")]),
            ("step ms (median)", f"{rep.step_ms_median:.2f}, {rep.step_ms_timing}"),
            ("held-out text", rep.source)]
    width = max(len(k) for k, _ in rows)
    return "\n".join([f"{k:<{width}}  {v}" for k, v in rows] + [f"note: {n}" for n in rep.notes])


def main(argv: list[str] | None = None) -> int:    # for `python -m spice_core.tools.quality`
    from spice_core.tools.cli import main as cli_main

    return cli_main(["quality", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    raise SystemExit(main())
