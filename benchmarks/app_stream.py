"""How the chat page streams in a real browser, with the live panels on and off.

    python benchmarks/app_stream.py [--tokens 96] [--repeats 2] [--out docs/benchmarks/app/README.md]

Serves the app in-process with the shipped model (one torch thread, the rest of the machine for the
browser and the web server) and drives Debian's chromium through Playwright at 1400x1000, the way a
visitor does: type a story prompt, press Enter, watch the reply stream. For each reply:
- first token: Enter -> the first reply text on screen;
- streamed rate: tokens per second between the first token on screen and the end of the reply;
- input lag while streaming: a key typed into the message box -> the character in the box (max and median
  over probes every 0.5 s), the delay a visitor feels when typing;
- Stop: a click on Stop (it replaces Send while a reply streams) -> the "Stopped" note in the chat.

Wall-clock numbers on this machine; the engine's own times in the panels are modeled and are not used.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHROMIUM = "/usr/bin/chromium"
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"]
PROMPT = "Tell me a story about a dog and a kite."


def serve(engine=None):
    import app
    demo, ctx = app.build_app(engine)
    demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True,
                **app.launch_kwargs())
    return demo, ctx


def chat_text(page) -> str:
    return page.evaluate("() => (document.querySelector('#spice-chat') || {}).innerText || ''")


# Gradio's "Loading response" bubble (class pending, its text "Loading content" for screen readers) shows while the
# server has not answered yet: it is no reply.
BOT_MESSAGES = ("document.querySelectorAll('#spice-chat .bot-row:not(.pending), "
                "#spice-chat .message.bot:not(.pending)')")


def bot_messages(page) -> int:
    return page.evaluate(f"() => {BOT_MESSAGES}.length")


def reply_text(page) -> str:
    return page.evaluate(f"""() => {{ const b = {BOT_MESSAGES};
        return b.length ? b[b.length - 1].innerText.replace('▍', '').trim() : ''; }}""")


def tokens_shown(page) -> int:
    text = page.evaluate("() => { const c = document.querySelector('#spice-stats .card .v'); return c ? c.innerText : '0'; }")
    try:
        return int(text.strip())
    except ValueError:
        return 0


def set_panels(page, on: bool) -> None:
    box = page.locator("#ctl-live input[type=checkbox]")
    if not box.is_visible():
        page.get_by_text("Timing model and generation").click()
    if box.is_checked() != on:
        box.click()


def set_max_tokens(page, n: int) -> None:
    field = page.locator("#ctl-max-new input[type=number]")
    if not field.is_visible():
        page.get_by_text("Timing model and generation").click()
    field.fill(str(n))
    field.press("Tab")


def one_reply(page, *, panels: bool, stop_after_s: float | None = None, timeout_s: float = 180) -> dict:
    """Send PROMPT and measure; with ``stop_after_s``, press Stop that long after the first token."""
    set_panels(page, panels)
    page.fill("#spice-msg textarea", "")
    page.fill("#spice-msg textarea", PROMPT)
    notes_before = chat_text(page).count("tokens · TPOT")
    stopped_before = chat_text(page).count("Stopped after")
    bots_before = bot_messages(page)
    t0 = time.perf_counter()
    page.press("#spice-msg textarea", "Enter")
    first = None
    # The first token is on screen when this reply's own message has text: the previous reply's text is
    # still there when no "New chat" came between, Stop shows before the server has taken the message, and
    # until then the chat shows Gradio's pending bubble.
    while time.perf_counter() - t0 < timeout_s:
        if page.locator("#spice-stop").is_visible() and bot_messages(page) > bots_before and reply_text(page):
            first = time.perf_counter()
            break
        time.sleep(0.02)
    if first is None:
        raise RuntimeError("no reply text appeared")
    lags, stop_s, probe = [], None, 0
    done = lambda: chat_text(page).count("tokens · TPOT") > notes_before   # noqa: E731
    while not done() and time.perf_counter() - first < timeout_s:
        if stop_after_s is not None and time.perf_counter() - first >= stop_after_s:
            stop_s = press_stop(page, stopped_before, notes_before, timeout_s)
            break
        ch = "abcdefghij"[probe % 10]
        probe += 1
        t = time.perf_counter()
        page.locator("#spice-msg textarea").press(ch)      # a real key press, queued behind whatever the page does
        page.wait_for_function(f"() => document.querySelector('#spice-msg textarea').value.endsWith('{ch}')",
                               timeout=30_000, polling=10)
        lags.append(time.perf_counter() - t)
        time.sleep(0.5)
    end = time.perf_counter()
    n = tokens_shown(page)
    return {"first_token_s": first - t0, "tokens": n, "streamed_tps": (n - 1) / (end - first) if n > 1 else 0.0,
            "streamed_s": end - first, "probes": len(lags),
            "lag_max_s": max(lags) if lags else 0.0, "lag_median_s": statistics.median(lags) if lags else 0.0,
            "stop_s": stop_s}


def press_stop(page, stopped_before: int, notes_before: int, timeout_s: float) -> float | None:
    """Click Stop and wait for the "Stopped" note: seconds from the click, or None when the reply ended first."""
    def outcome() -> str | None:          # one reading of the chat: a stop adds both notes in the same update
        chat = chat_text(page)
        if chat.count("Stopped after") > stopped_before:
            return "stopped"
        return "ended" if chat.count("tokens · TPOT") > notes_before else None

    t = time.perf_counter()
    stop = page.locator("#spice-stop")
    if outcome() or not stop.is_visible():
        return None
    try:
        stop.click(timeout=5_000)
    except Exception:                   # Stop went away between the check and the click: the reply ended
        if outcome():
            return None
        raise
    while (seen := outcome()) is None:
        if time.perf_counter() - t > timeout_s:
            raise RuntimeError(f"no \"Stopped\" note {timeout_s:.0f} s after Stop was pressed")
        time.sleep(0.02)
    return time.perf_counter() - t if seen == "stopped" else None


def run(tokens: int, repeats: int) -> dict:
    import torch
    from playwright.sync_api import sync_playwright
    from spice_core.engine import SpiceEngine

    torch.set_num_threads(1)
    demo, ctx = serve(SpiceEngine.load(None, device="cpu"))
    results: dict[str, list[dict]] = {"off": [], "on": [], "stop": []}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(demo.local_url, wait_until="load")
            page.wait_for_selector("#spice-msg textarea")
            set_max_tokens(page, tokens)
            print("warm-up reply", file=sys.stderr, flush=True)
            one_reply(page, panels=True)                      # warm-up: caches, Plotly loaded
            for i in range(repeats):
                for mode in ("off", "on"):
                    print(f"reply {i + 1}/{repeats}, panels {mode}", file=sys.stderr, flush=True)
                    results[mode].append(one_reply(page, panels=mode == "on"))
                    print(f"  {results[mode][-1]}", file=sys.stderr, flush=True)
                    page.click("#spice-new")
                    time.sleep(0.5)
            results["stop"].append(one_reply(page, panels=True, stop_after_s=3.0))
            browser.close()
    finally:
        demo.close()
    return results


def table(results: dict, tokens: int, repeats: int, command: str) -> str:
    def med(mode, key):
        vals = [r[key] for r in results[mode] if r[key] is not None]
        return statistics.median(vals) if vals else float("nan")

    off, on = med("off", "streamed_tps"), med("on", "streamed_tps")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        "# The chat page in a browser: first token, streamed rate, input lag",
        "",
        f"Measured {dt.date.today().isoformat()} on {platform.node() and 'this machine'} "
        f"({os.cpu_count()} CPU cores, load average {load:.1f} at the end), shipped model on CPU with one torch "
        f"thread, Debian chromium at 1400×1000 on the same machine; {tokens}-token replies, median of {repeats}.",
        "",
        "```",
        command,
        "```",
        "",
        "| live panels | first token (s) | streamed tokens/s | input lag, median (s) | input lag, max (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for mode in ("off", "on"):
        lines.append(f"| {mode} | {med(mode, 'first_token_s'):.2f} | {med(mode, 'streamed_tps'):.1f} | "
                     f"{med(mode, 'lag_median_s'):.3f} | {max(r['lag_max_s'] for r in results[mode]):.3f} |")
    stop = results["stop"][0]["stop_s"] if results["stop"] else None
    lines += ["", f"- Streamed rate with panels on: **{100 * on / off:.0f}%** of the rate with them off.",
              f"- Stop (panels on, pressed 3 s into a reply) → “Stopped” note in the chat: **{stop:.2f} s**."
              if stop is not None else "- Stop: not measured.",
              "- Input lag: a key pressed in the message box while the reply streams → the character in the box.",
              ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write the Markdown table here")
    args = parser.parse_args()
    results = run(args.tokens, args.repeats)
    command = "python benchmarks/app_stream.py " + " ".join(sys.argv[1:])
    md = table(results, args.tokens, args.repeats, command.strip())
    print(md)
    for mode, rows in results.items():
        for r in rows:
            print(mode, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(md)


if __name__ == "__main__":
    main()
