"""What the main page writes: the numbers row, the run note after each reply, settings notes.

Plain functions from plain values (RunSettings, RunSummary, the live numbers) to Markdown or
HTML; the chat page decides when to show them. Styled by ``assets/static/spice.css``.
"""
from __future__ import annotations

import html
import re
import time

from spice_core import api
from spice_core.api import BASELINE_POLICIES, EXACT_POLICIES, EngineInfo, RunSettings, RunSummary, format_bytes
from pages.common import POLICY_LABELS, timed_bytes
from pages.live import CATEGORIES, LiveRun

OUTCOME_INDEX = {name: i - 1 for i, name in enumerate(CATEGORIES) if i}     # LiveRun.counts' last axis
from pages.runner import RunStream


def settings_hint() -> str:
    return ("Settings apply to your next message. During a reply, **τ_prefetch**, **τ_approx** and "
            "**max lookahead** apply from the next token.")


def preview(text: str, n: int = 48) -> str:
    one = " ".join(text.split())
    return one if len(one) <= n else one[: n - 1] + "…"


def wall_tps(live: LiveRun, first_wall: float | None) -> float:
    if first_wall is None or live.n_tokens < 2:
        return 0.0
    elapsed = time.perf_counter() - first_wall
    return (live.n_tokens - 1) / elapsed if elapsed > 0 else 0.0


def agreement_line(settings: RunSettings, check_exact: bool, changes=(), device: str = "cpu") -> tuple[str, str] | None:
    """(value, detail) of the agreement card when no re-run is needed; None when one should be made.

    Judged on every setting the reply ran with, not only those it started with: a τ_approx raised
    mid-reply makes the reply lossy, and then the agreement is measured (a claim of "identical by
    design" would be false). On a GPU an exact setting that may send misses to the CPU lane is measured too: the
    lane sums an expert's products in another order than the GPU's kernel, and a near-tie can flip a token
    (measured on the GPU in the headline: `cpu_compute` 0.87–0.88 against `resident` over 64 tokens at
    DeepSeek-V2-Lite's shapes, 1.00 at Qwen2-57B-A14B's).
    """
    ran_with = [settings] + [c.settings_after for c in changes if getattr(c, "settings_after", None) is not None]
    lane_on_gpu = device == "cuda" and any(s.cpu_lane and s.policy in CPU_LANE_POLICIES for s in ran_with)
    if all(s.exact for s in ran_with) and not lane_on_gpu:
        return "100%", "exact settings: identical by design"
    if settings.temperature > 0:
        return "n/a", "sampling: set temperature to 0"
    if settings.exact and not lane_on_gpu:   # became lossy mid-reply: the start's claim no longer holds, so measure
        return None
    if not check_exact:
        why = "exact, but the CPU lane sums in another order than the GPU: " if lane_on_gpu else ""
        return "not measured", why + "tick “measure greedy agreement” in the settings"
    return None


AGREEMENT_GOOD, AGREEMENT_WARN = 0.9, 0.8      # the benchmark's bar for lossy settings (BENCHMARK.md), and amber


def agreement_value(exact: list[int], reply: list[int]) -> tuple[str, str]:
    """The greedy agreement card's (value, detail): the share of positions holding the same token as the exact
    run (over the longer of the two, as the benchmarks count it), and where the two first differ."""
    same, total = api.matching_tokens(exact, reply)
    first = api.first_divergence(exact, reply)
    where = "identical" if first is None else f"first differs at token {first} (counted from 0, as the panels do)"
    return f"{100 * same / total if total else 100:.0f}%", f"measured: {same} of {total} tokens match · {where}"


def changes_text(stream: RunStream) -> str:
    lines = [f"- from token {c.from_token}: {', '.join(f'{f}={getattr(c_settings, f)!r}' for f in c.applied)}"
             for c, c_settings in applied_changes(stream)]
    deferred = list(dict.fromkeys(f for c in stream.changes for f in c.deferred))
    if deferred:
        reasons = {c.message for c in stream.changes if c.message}
        lines.append(f"- {', '.join(deferred)}: applies from your next message"
                     + (f" ({'; '.join(sorted(reasons))})" if reasons else ""))
    return "\n".join(lines)


def applied_changes(stream: RunStream):
    """(change, the settings after it) for every change that applied something."""
    out = []
    for c in stream.changes:
        if c.applied:
            out.append((c, c.settings_after))
    return out


def run_title(summary: RunSummary, live: LiveRun) -> str:
    tpot = f"TPOT {summary.tpot_ms_median:.2f} ms" if summary.n_tokens > 1 else "TPOT n/a (no decode step)"
    return (f"Run {summary.run_id} · {summary.n_tokens} tokens · {tpot} "
            f"({summary.timing}) · hit rate {100 * live.hit_rate:.0f}%"
            + (f" · late prefetches {100 * live.late_rate:.0f}%" if live.late_rate >= 0.005 else ""))


def copied_words(summary: RunSummary) -> str:
    """Bytes copied per token at the shape the run's times are for, the native bytes after them."""
    shown, native = timed_bytes(summary.shape_bytes_per_token, summary.bytes_per_token)
    if native is None:
        return f"{format_bytes(shown)} copied per token"
    return f"{format_bytes(shown)} copied per token at {summary.shape} ({format_bytes(native)} at its own sizes)"


def decode_words(summary: RunSummary) -> str:
    """p90 TPOT and tokens/s, or why there are none (a reply of one token has no decode step)."""
    if summary.n_tokens < 2:
        return "p90 TPOT and tokens/s n/a (one token: no decode step)"
    return f"p90 TPOT {summary.tpot_ms_p90:.2f} ms · {summary.tokens_per_s:.1f} tokens/s"


def run_body(summary: RunSummary, stream: RunStream) -> str:
    split = ", ".join(f"{k} {v}" for k, v in sorted(summary.miss_split.items()) if v) or "none"
    notes = "".join(f"\n- {n}" for n in summary.notes)
    label = POLICY_LABELS.get(summary.policy, summary.policy)      # the menu's name, then the API's
    return (f"Policy **{label}** (`{summary.policy}`) · {summary.timing} timing ({summary.profile}, "
            f"{summary.shape}) · TTFT {summary.ttft_ms:.1f} ms · {decode_words(summary)} · {copied_words(summary)} · "
            f"stall {summary.stall_ms_per_token:.2f} ms per token · misses: {split} · "
            f"finished: {summary.finish_reason or stream.cancel_reason or '?'}{notes}\n\n"
            f"[Open this run in the trace explorer](trace?run={summary.run_id})")


TIPS = {
    "tokens": "Tokens generated so far in this reply.",
    "TTFT": "Time to first token: the prompt's prefill, which gives the first token (no decode step in it).",
    "TPOT": "Time per output token: the median time of one decode step (every token after the first). "
            "Lower is faster.",
    "tokens/s": "1000 / TPOT in the run's timing mode; 'streamed' is what reached this page per second.",
    "hit rate": "Share of the experts the tokens routed to that were already on the GPU when their layer needed them "
                "(resident, or prefetched in time). A prefetch that arrived late is a stall, not a hit: it is "
                "counted apart, under the value. "
                "Green ≥ 80%, amber ≥ 50%.",
    "copied per token": "Bytes copied from host memory to the GPU per token (on demand and prefetch), at the shape "
                        "the times are for (modeled timing: the model shape chosen; measured: this model's own), as "
                        "the TPOT beside it; under the value, what this model copied at its own (native) sizes.",
    "stall": "Time per token the GPU waited for an expert: its copy to arrive, or its CPU lane result. Green below "
             "10% of the decode time, amber below 40%.",
    "lookahead": "How many layers ahead every confident prediction was prefetched in time (mean over layers and "
                 "tokens), and why the lookahead stopped there most often. The likeliest experts are still copied "
                 "beyond it, even late: a depth of 0 with prefetches issued means copies outlast a layer.",
    "prefetches": "Prefetch copies issued this reply, and how many no layer of it used (wasted copy bandwidth; "
                  "while it streams, copies for layers still to come count as unused until they are used).",
    "greedy agreement": "Greedy agreement with the exact run (τ_approx 0), as the benchmarks measure it: the share "
                        "of positions where this reply has the same token as the exact reply, over the longer of "
                        "the two. Green ≥ 90% (the project's bar for lossy settings), amber ≥ 80%.",
}
STOP_REASONS = {
    "confidence": "no expert reached τ_prefetch",
    "time": "copies could not arrive in time",
    "bound": "reached max lookahead",
    "cache": "no free cache slot",
    "cost": "planning costs more than it saves",
}
# The same in a card's line, which a narrow card cuts (the card's tooltip has the whole line).
STOP_WORDS = {"confidence": "not confident", "time": "copies too slow", "bound": "at max lookahead",
              "cache": "no free slot", "cost": "not worth it"}


def _level(value: float, good: float, warn: float, higher_is_better: bool = True) -> str:
    if not higher_is_better:
        value, good, warn = -value, -good, -warn
    return "good" if value >= good else "warn" if value >= warn else "bad"


# The settings each policy reads (beyond profile, shape, max new tokens and temperature), for the numbers row: a
# setting a policy ignores is not shown with it. Prefetching policies (those with a predictor) read τ_prefetch and the
# lookahead, lossy ones (LoRE) τ_approx and the rank; two facts the engine's exports do not say are named here, and
# tests/app/test_chat_header.py checks them against the engine's policy table.
NO_CACHE_POLICIES = ("resident", "on_demand")     # every expert on the GPU; or no expert kept after its copy
CPU_LANE_POLICIES = ("cpu_compute", "spice", "spice_no_lore")


def policy_knobs(policy: str) -> tuple[str, ...]:
    """The RunSettings fields among cache_frac, tau_prefetch, max_lookahead, tau_approx, lore_rank and cpu_lane that
    ``policy`` reads, in that order."""
    used = {"cache_frac": policy not in NO_CACHE_POLICIES,
            "tau_prefetch": policy not in BASELINE_POLICIES, "max_lookahead": policy not in BASELINE_POLICIES,
            "tau_approx": policy not in EXACT_POLICIES, "lore_rank": policy not in EXACT_POLICIES,
            "cpu_lane": policy in CPU_LANE_POLICIES}
    return tuple(name for name, on in used.items() if on)


def settings_line(settings: RunSettings, info: EngineInfo | None = None) -> str:
    """The policy as the menu names it, and only the settings it reads (`policy_knobs`), as they are: "spice_no_cpu
    · … CPU lane on" and a LoRE rank beside spice_no_lore said what the run did not do. τ_approx and the LoRE rank
    go where the model has no LoRE factors (nothing is approximated; the banner says so)."""
    used = set(policy_knobs(settings.policy))
    if not getattr(info, "has_lore", True):
        used -= {"tau_approx", "lore_rank"}
    parts = [f"<b>{html.escape(POLICY_LABELS.get(settings.policy, settings.policy))}</b>"]
    shown = {"cache_frac": f"cache {settings.cache_frac:.0%}",
             "tau_prefetch": f"τ<sub>prefetch</sub> {settings.tau_prefetch:g}",
             "max_lookahead": f"lookahead ≤ {settings.max_lookahead}",
             "tau_approx": f"τ<sub>approx</sub> {settings.tau_approx:g}",
             "lore_rank": _lore_words(settings.lore_rank, getattr(info, "lore_ranks", ())),
             "cpu_lane": f"CPU lane {'on' if settings.cpu_lane else 'off'}"}
    return " · ".join(parts + [words for name, words in shown.items() if name in used])


def _lore_words(asked: int, ranks) -> str:
    """The LoRE rank a run uses: the default asks for "up to" it, and factors that stop lower are used whole (the
    engine's rule), so the row names the rank used, not the one asked for."""
    top = max(ranks, default=0)
    if top and asked > top:
        return f"LoRE r{top} (r{asked} asked; the factors stop at {top})"
    return f"LoRE r{asked}"


def stats_html(live: LiveRun | None, settings: RunSettings, info: EngineInfo, *, state: str = "",
               stream: RunStream | None = None, summary=None, wall_tps: float = 0.0,
               agreement: tuple[str, str] | None = None, next_settings: RunSettings | None = None,
               note: str = "") -> str:
    """The row of numbers above the panels (HTML; styled by the app's CSS).

    ``settings`` are those the numbers were produced with; ``next_settings`` (when idle and different)
    are what the controls now say, shown as what the next message will use. ``stream`` is read for its
    ``run_id`` and ``changes`` only (a reload passes the reply's kept view, pages.chat_reload). ``note``: a line
    under the cards (why the last reply's numbers are missing).
    """
    timing = (live.timing if live is not None and live.timing else info.default_timing)
    shown = next_settings if next_settings is not None and (live is None or live.n_tokens == 0) else settings
    where = f"{shown.profile}, {shown.shape}" if timing == "modeled" else info.device
    head = f"{settings_line(shown, info)} · <span class='timing'>{html.escape(f'{timing} ({where})')}</span>"
    if next_settings is not None and shown is settings and next_settings != settings:
        nxt = settings_line(next_settings, info)
        if timing == "modeled" and (next_settings.profile, next_settings.shape) != (settings.profile, settings.shape):
            timed = f"modeled ({next_settings.profile}, {next_settings.shape})"
            nxt += f" · <span class='timing'>{html.escape(timed)}</span>"
        head = (f"<span class='next'>Next message: {nxt}</span><br>"
                f"Last reply ran with: {settings_line(settings, info)} · "
                f"<span class='timing'>{html.escape(f'{timing} ({where})')}</span>")
    if stream is not None:          # every setting the reply changed, not only the last request's (review):
        first: dict[str, int] = {}  # each once, from the token it first changed at (a dragged slider applies many)
        for change, _after in applied_changes(stream):
            for f in change.applied:
                first.setdefault(f, change.from_token)
        for f, token in first.items():
            head += f" · <span class='changed'>changed {html.escape(f)} from token {token}</span>"
    if live is None or live.n_tokens == 0:
        status = "starting…" if state == "starting" else "not available" if note else "no reply yet"
        cards = [("tokens", "0", status, "")]
    else:
        run_id = stream.run_id if stream is not None else ""
        status = "done" if summary is not None else "streaming"
        stall_share = live.stall_share
        decoded = live.n_tokens > 1         # TPOT, tokens/s and the stall share are of the decode steps
        reason, share = live.main_stop_reason()
        stop = (f"stop: {STOP_WORDS.get(reason, reason)} ({100 * share:.0f}%)", f"mean depth in layers; "
                f"{100 * share:.0f}% of the layers planned stopped: {STOP_REASONS.get(reason, reason)}") if reason \
            else "mean depth (layers)"
        cards = [
            ("tokens", f"{live.n_tokens}", f"{run_id} · {status}", ""),
            ("TTFT", f"{live.ttft_ms:.1f} ms", "incl. prefill", ""),
            ("TPOT", f"{live.tpot_ms:.2f} ms", f"median, {timing}", "") if decoded
            else ("TPOT", "–", "no decode step yet: the first token is the prefill's", ""),
            ("tokens/s", f"{live.tokens_per_s:.1f}" if decoded else "–", f"{timing}; streamed {wall_tps:.1f}/s", ""),
            ("hit rate", f"{100 * live.hit_rate:.0f}%",
             (f"{100 * live.late_rate:.0f}% late prefetches", f"in time; {100 * live.late_rate:.0f}% late prefetches")
             if live.late_rate >= 0.005 else "resident + prefetched in time",
             _level(live.hit_rate, 0.8, 0.5)),
            ("copied per token", *_copied_card(live), ""),
            ("stall", f"{live.stall_ms_per_token:.2f} ms", f"per token ({100 * stall_share:.0f}% of decode time)",
             _level(stall_share, 0.1, 0.4, higher_is_better=False)) if stall_share is not None
            else ("stall", f"{live.stall_ms_per_token:.2f} ms", "in the first token (the prefill)", ""),
        ]
        if "max_lookahead" in policy_knobs(settings.policy):      # a policy that never prefetches has no lookahead
            cards.append(("lookahead", f"{live.mean_lookahead:.1f} of {settings.max_lookahead}", stop, ""))
        if live.prefetches_issued:
            wasted = live.prefetches_wasted / live.prefetches_issued
            cards.append(("prefetches", f"{live.prefetches_issued}",
                          f"{live.prefetches_wasted} wasted ({100 * wasted:.0f}%), {live.prefetches_late} late",
                          _level(wasted, 0.25, 0.6, higher_is_better=False)))
        if agreement:
            value, detail = agreement
            level = ""
            if value.endswith("%"):
                level = _level(float(value[:-1]) / 100, AGREEMENT_GOOD, AGREEMENT_WARN)
            measured = detail.startswith("measured: ") if detail else False     # the line a phone's card shows
            cards.append(("greedy agreement", value, (detail[10:].split(" · ")[0], detail) if measured
                          else detail or "vs exact settings", level))
    why = [note] if note else []
    why += why_lines(live, settings) if live is not None and live.n_tokens else []
    notes = ("<ul class='notes spice-why'>" + "".join(f"<li>{html.escape(w)}</li>" for w in why) + "</ul>") if why else ""
    body = "".join(
        f"<div class='card {level}' title='{html.escape(TIPS.get(k, ''), quote=True)}'>"
        f"<div class='k'>{html.escape(k)}</div><div class='v'>{html.escape(v)}</div>"
        f"<div class='s' title='{html.escape(sub[-1] if isinstance(sub, tuple) else sub, quote=True)}'>"
        f"{html.escape(sub[0] if isinstance(sub, tuple) else sub)}</div></div>"
        for k, v, sub, level in cards)
    return f"<div class='spice-stats'><div class='head'>{head}</div><div class='cards'>{body}</div>{notes}</div>"


def _copied_card(live: LiveRun) -> tuple[str, str]:
    shown, native = timed_bytes(live.shape_bytes_per_token, live.bytes_per_token)
    return format_bytes(shown), "own sizes" if native is None else f"native {format_bytes(native)}"


def why_lines(live: LiveRun, settings: RunSettings) -> list[str]:
    """Plain words under the cards (read without hovering; touch has no hover) for settings that change little
    or surprise here: why, and what would change that."""
    out = []
    reason, share = live.main_stop_reason()
    if live.prefetches_issued and live.mean_lookahead < 0.5 and reason == "time":
        # The lookahead card's numbers, in words: its mean depth, and the share of layer plans its reason stopped
        # (not a share of layers at depth 0, which this note used to claim beside a card saying 0.1).
        link = f"on the {settings.profile} profile" if live.timing != "measured" else "on this machine's link"
        out.append(f"Max lookahead and τ_prefetch change little here: {link} an expert's copy outlasts a layer's "
                   f"compute, so prefetches were in time only {live.mean_lookahead:.1f} layers ahead on average (of "
                   f"{settings.max_lookahead} allowed): {100 * share:.0f}% of the layers planned stopped the "
                   "lookahead because copies could not arrive in time. The likeliest experts are copied anyway, late. "
                   "A faster link (the hardware profile menu) or a larger GPU cache gives them room.")
    elif reason == "bound" and share > 0.5:
        out.append(f"The lookahead stopped at its bound in {100 * share:.0f}% of the layers planned: raising max "
                   f"lookahead (now {settings.max_lookahead}) lets it prefetch further ahead.")
    if settings.tau_approx > 0 and live.counts is not None and live.counts[..., OUTCOME_INDEX["approx"]].sum():
        out.append("τ_approx above 0 replaces some experts by a low-rank surrogate, which computes less than the "
                   "expert itself: modeled times can fall below resident's, at a cost in quality (greedy agreement).")
    return out


def at_limit(reply: str, n_tokens: int, max_new_tokens: int, context_tokens: int) -> tuple[str, str]:
    """A reply that a token limit ended (finish "length"): (its text, ended at its last full sentence when that keeps
    most of it; the note that says which limit ended it). The note is there whatever the reply ends on: one that
    happened to end on a full stop said nothing, as if the model had finished."""
    trimmed = trim_to_sentence(reply)
    if n_tokens < max_new_tokens:           # the model's context, not "Max new tokens", ended it
        limit, room = (f"the model's context ({context_tokens:,} tokens)",
                       "a New chat or a shorter message leaves more room")
    else:
        limit, room = f"the {n_tokens}-token limit", "raise “Max new tokens” for longer stories"
    ending = "the reply ends at its last full sentence" if trimmed != reply else "the reply may be unfinished"
    return trimmed, f"ℹ Reached {limit}: {ending} ({room})"


SENTENCE_END = re.compile(r"[.!?][\"”’')\]]*(?=\s|$)")


def trim_to_sentence(reply: str, keep_at_least: float = 0.5) -> str:
    """A reply cut by the token limit, ended at its last full sentence (unchanged when that would drop
    more than half of it, or when it already ends on one)."""
    ends = [m.end() for m in SENTENCE_END.finditer(reply)]
    if not ends or ends[-1] >= len(reply.rstrip()) or ends[-1] < keep_at_least * len(reply):
        return reply
    return reply[:ends[-1]]
