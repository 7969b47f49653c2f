"""The trace explorer's HTML: a run's summary cards (beside its baselines) and two runs' headline numbers side by
side. Every interpolated value is escaped: a run's label is a visitor's prompt.

    RunSummary (+ label, baselines, time split) ──► summary_html ──► cards: tokens, TTFT, TPOT, tokens/s, hit rate,
                                                         copied, stall, where a token's time went (time_split_card),
                                                         then one card per baseline (baseline_cards)
    two RunSummary ──► compare_html ──► a table of both runs and how the second compares

Plain strings from a RunSummary's fields: no components, no events, and nothing of who may open a run (the page
checks that before it calls these).
"""
from __future__ import annotations

from spice_core.api import TIME_STATES, format_bytes
from pages.common import timed_bytes
from pages.owners import esc


def _late_text(s) -> str:
    """The share of selections served by a prefetch that came late (RunSummary.late_prefetch_rate)."""
    return f"{100 * s.late_prefetch_rate:.0f}%"


def _hit_rate_note(s) -> str:
    """Under the hit rate: the late prefetches' share when there is one (as the chat's card), then the misses."""
    split = " · ".join(f"{k} {v}" for k, v in sorted(s.miss_split.items()) if v) or "no misses"
    return f"in time; {_late_text(s)} late prefetches · {split}" if s.late_prefetch_rate >= 0.005 else split


def _timed_bytes_text(s) -> str:
    return format_bytes(timed_bytes(s.shape_bytes_per_token, s.bytes_per_token)[0])


def compare_html(a, b) -> str:
    """The two runs' headline numbers and how the second compares (every value escaped)."""
    def ratio(x, y, better_low=True):
        if not x or not y:
            return "—"
        r = x / y if better_low else y / x
        if not better_low:
            return f"{r:.2f}×"
        # r = first / second: above 1 the second is faster by r; below, slower by 1 / r ("0.73× slower" was wrong).
        return "same" if round(r, 2) == 1 else f"{r:.2f}× faster" if r > 1 else f"{1 / r:.2f}× slower"
    rows = [("policy", a.policy, b.policy, ""), ("timing", f"{a.timing} · {a.shape}", f"{b.timing} · {b.shape}", ""),
            ("TPOT median", f"{a.tpot_ms_median:.2f} ms", f"{b.tpot_ms_median:.2f} ms",
             ratio(a.tpot_ms_median, b.tpot_ms_median)),
            ("hit rate (in time)", f"{100 * a.hit_rate:.0f}%", f"{100 * b.hit_rate:.0f}%", ""),
            ("late prefetches (stalled)", _late_text(a), _late_text(b), ""),
            ("copied / token (timed shape)", _timed_bytes_text(a), _timed_bytes_text(b), ""),
            ("copied / token (native)", format_bytes(a.bytes_per_token), format_bytes(b.bytes_per_token), ""),
            ("stall / token", f"{a.stall_ms_per_token:.2f} ms", f"{b.stall_ms_per_token:.2f} ms", ""),
            ("tokens", f"{a.n_tokens}", f"{b.n_tokens}", "")]
    head = "<tr><th></th><th>first run</th><th>second run</th><th>second vs first</th></tr>"
    body = "".join(f"<tr><td>{esc(k)}</td><td>{esc(x)}</td><td>{esc(y)}</td><td>{esc(r)}</td></tr>"
                   for k, x, y, r in rows)
    note = "" if a.timing == b.timing else "<p>⚠ one run is measured and the other modeled: compare with care.</p>"
    return f"<table class='spice-compare'>{head}{body}</table>{note}"


def baseline_cards(s, baselines: dict) -> list[tuple[str, str, str]]:
    """The run beside its baselines: ``baselines`` are modeled ms per token of resident, on_demand and lru
    over the run's own routing (engine.baselines). Ratios only when the run is modeled too (same clock)."""
    out = []
    for name, label in (("lru", "vs lru"), ("on_demand", "vs on_demand"), ("resident", "vs resident floor")):
        ms = baselines.get(name)
        if not ms or s.policy == name:
            continue
        if s.timing == "modeled" and s.tpot_ms_median > 0:
            r = ms / s.tpot_ms_median
            verdict = f"{r:.2f}× faster" if r >= 1 else f"{1 / r:.2f}× slower"
            out.append((label, verdict, f"{name} {ms:.2f} ms · modeled, same routing"))
        else:
            out.append((label, f"{ms:.2f} ms", f"{name}, modeled for this routing (this run is {s.timing})"))
    return out


def _copied_card(s) -> tuple[str, str]:
    """Bytes per token at the shape the run's times are for (as the per-layer table and the chart), native under."""
    shown, native = timed_bytes(s.shape_bytes_per_token, s.bytes_per_token)
    return format_bytes(shown), "per token (own sizes)" if native is None else \
        f"per token at {s.shape} · native {format_bytes(native)}"


def time_split_card(split) -> list[tuple[str, str, str]]:
    """Where a decode token's time went (spice_core.api.time_split of the run's events): what bounds it, and each
    state's share of the token; none for a run without decode tokens."""
    if split is None or not split.tokens or split.wall_ms <= 0:
        return []
    shares = " · ".join(f"{state} {100 * split.share(state):.0f}%" for state in TIME_STATES
                        if split.share(state) >= 0.005)
    return [("time per token", split.bound(), f"{shares} (gpu: computing; link, lane: waiting for a copy, "
                                              "the CPU lane; host: nothing waited for)")]


def summary_html(s, label: str = "", baselines: dict | None = None, split=None) -> str:
    """The summary cards; every interpolated value is escaped (labels are visitors' prompts). ``split``: the run's
    `time_split`, for the card saying where a token's time went."""
    cards = [
        ("tokens", f"{s.n_tokens}", s.finish_reason or "—"),
        ("TTFT", f"{s.ttft_ms:.1f} ms", "incl. prefill"),
        ("TPOT", f"{s.tpot_ms_median:.2f} ms", f"median · p90 {s.tpot_ms_p90:.2f}"),
        ("tokens/s", f"{s.tokens_per_s:.1f}", s.timing),
        ("hit rate", f"{100 * s.hit_rate:.0f}%", _hit_rate_note(s)),
        ("copied", *_copied_card(s)),
        ("stall", f"{s.stall_ms_per_token:.2f} ms", "per token"),
        *time_split_card(split),
        *baseline_cards(s, baselines or {}),
    ]
    body = "".join(f"<div class='card'><div class='k'>{esc(k)}</div><div class='v'>{esc(v)}</div>"
                   f"<div class='s'>{esc(t)}</div></div>" for k, v, t in cards)
    notes = "".join(f"<li>{esc(n)}</li>" for n in s.notes)
    where = f" ({esc(s.profile)}, {esc(s.shape)})" if s.timing == "modeled" else ""
    head = (f"<b>{esc(s.run_id)}</b> · {esc(s.policy)} · {esc(s.timing)} timing{where}"
            f"{f' · {esc(label)}' if label else ''}")
    return (f"<div class='spice-stats'><div class='head'>{head}</div><div class='cards'>{body}</div>"
            f"{f'<ul class=notes>{notes}</ul>' if notes else ''}</div>")

