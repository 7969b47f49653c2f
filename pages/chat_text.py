"""What the main page writes: the numbers row, the run note after each reply, settings notes.

Plain functions from plain values (RunSettings, RunSummary, the live numbers) to Markdown or
HTML; the chat page decides when to show them. Styled by ``assets/static/spice.css``.
"""
from __future__ import annotations

import time

from spice_core.api import EngineInfo, RunSettings, RunSummary
from pages.common import SETTING_FIELDS, fmt_bytes
from pages.live import LiveRun
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


def agreement_line(settings: RunSettings, check_exact: bool) -> str | None:
    """The agreement text when no re-run is needed; None when one should be made."""
    if settings.exact:
        return "100% (exact settings: identical by design)"
    if settings.temperature > 0:
        return "n/a (sampling: set temperature to 0)"
    if not check_exact:
        return "not measured (tick “measure greedy agreement”)"
    return None


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
    return (f"Run {summary.run_id} · {summary.n_tokens} tokens · TPOT {summary.tpot_ms_median:.2f} ms "
            f"({summary.timing}) · hit rate {100 * summary.hit_rate:.0f}%")


def run_body(summary: RunSummary, stream: RunStream) -> str:
    split = ", ".join(f"{k} {v}" for k, v in sorted(summary.miss_split.items()) if v) or "none"
    notes = "".join(f"\n- {n}" for n in summary.notes)
    return (f"Policy **{summary.policy}** · {summary.timing} timing ({summary.profile}, {summary.shape}) · "
            f"TTFT {summary.ttft_ms:.1f} ms · p90 TPOT {summary.tpot_ms_p90:.2f} ms · "
            f"{summary.tokens_per_s:.1f} tokens/s · {fmt_bytes(summary.bytes_per_token)} copied per token · "
            f"stall {summary.stall_ms_per_token:.2f} ms per token · misses: {split} · "
            f"finished: {summary.finish_reason or stream.cancel_reason or '?'}{notes}\n\n"
            f"[Open this run in the trace explorer](trace?run={summary.run_id})")


def stats_html(live: LiveRun | None, settings: RunSettings, info: EngineInfo, *, state: str = "", stream: RunStream | None = None,
               summary=None, wall_tps: float = 0.0, agreement: str = "") -> str:
    """The row of numbers above the panels (HTML; styled by the app's CSS)."""
    timing = (live.timing if live is not None and live.timing else info.default_timing)
    where = f"{settings.profile}, {settings.shape}" if timing == "modeled" else info.device
    head = (f"<b>{settings.policy}</b> · cache {settings.cache_frac:.0%} · τ<sub>prefetch</sub> {settings.tau_prefetch:g}"
            f" · τ<sub>approx</sub> {settings.tau_approx:g} · lookahead ≤ {settings.max_lookahead} · "
            f"LoRE r{settings.lore_rank} · CPU lane {'on' if settings.cpu_lane else 'off'} · "
            f"<span class='timing'>{timing} ({where})</span>")
    if stream is not None and stream.changes:
        last = stream.changes[-1]
        if last.applied:
            head += f" · <span class='changed'>changed {', '.join(last.applied)} from token {last.from_token}</span>"
    if live is None or live.n_tokens == 0:
        status = "starting…" if state == "starting" else "no reply yet"
        cards = [("tokens", "0", status)]
    else:
        run_id = stream.run_id if stream is not None else ""
        status = "done" if summary is not None else "streaming"
        cards = [
            ("tokens", f"{live.n_tokens}", f"{run_id} · {status}"),
            ("TTFT", f"{live.ttft_ms:.1f} ms", "incl. prefill"),
            ("TPOT", f"{live.tpot_ms:.2f} ms", f"median, {timing}"),
            ("tokens/s", f"{live.tokens_per_s:.1f}", f"{timing}; streamed {wall_tps:.1f}/s"),
            ("hit rate", f"{100 * live.hit_rate:.0f}%", "resident + prefetched"),
            ("copied", fmt_bytes(live.bytes_per_token), "per token"),
            ("stall", f"{live.stall_ms_per_token:.2f} ms", "per token"),
            ("lookahead", f"{(sum(live.lookahead) / len(live.lookahead)) if live.lookahead else 0:.1f}",
             "mean depth (layers)"),
        ]
        if agreement:
            value, _, rest = agreement.partition(" ")
            cards.append(("greedy agreement", value, rest.strip("()") or "vs exact settings"))
    body = "".join(f"<div class='card'><div class='k'>{k}</div><div class='v'>{v}</div><div class='s'>{s}</div></div>"
                   for k, v, s in cards)
    return f"<div class='spice-stats'><div class='head'>{head}</div><div class='cards'>{body}</div></div>"
