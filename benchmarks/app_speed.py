"""How fast the web app feels on this machine, with the shipped model.

    python benchmarks/app_speed.py [--tokens 96] [--repeats 3] [--out docs/benchmarks/app-cpu.md]

Measures, with `python app.py` started as a user would (its own process, GRADIO_SERVER_PORT set):
- startup: process start -> the server answers (includes loading the model);
- page interactive: navigation -> the message box is visible and enabled (Debian chromium through
  Playwright), first visit and a second one, counted from the moment the server is up;
- first token: Enter pressed in the browser -> first reply text on screen; and, through the API,
  submit -> first streamed reply text;
- tokens/s streamed through the API with every live panel on, and with panels off, next to the
  engine alone (the same generation without the app) for the app's overhead;
- tokens/s while a browser renders the stream with every panel on (browser and server share the
  machine's cores, the worst case for a 2-core box).

Wall-clock numbers; the engine's own times in the panels are modeled and are not used here.
Results go to a Markdown table (``--out``) with the machine, its load average and the date.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:          # run as a script from anywhere: import the repo's packages
    sys.path.insert(0, str(ROOT))

from spice_core.machine import cpu_model_name  # noqa: E402
CHROMIUM = "/usr/bin/chromium"
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"]
PROMPT = "Tell me a story about a cat and a ball."
SETTINGS = dict(policy="spice", cache_frac=0.25, tau_prefetch=0.2, tau_approx=0.0, max_lookahead=4, lore_rank=16,
                cpu_lane=True, profile="rtx4090-pcie4x16", shape="deepseek-v2-lite")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



def engine_alone(tokens: int, repeats: int) -> list[float]:
    """Tokens/s of the engine without the app (the same chat, settings and token count)."""
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))     # what app.py uses
    from spice_core.api import RunSettings
    from spice_core.engine import SpiceEngine

    engine = SpiceEngine.load(None, device="cpu")
    out = []
    for _ in range(repeats):
        gen = engine.start_chat([{"role": "user", "content": PROMPT}],
                                RunSettings(**SETTINGS, max_new_tokens=tokens, temperature=0.0))
        stamps = [time.perf_counter() for _ in gen]
        if len(stamps) > 1:
            out.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
    return out


def start_app(port: int) -> tuple[subprocess.Popen, float]:
    env = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port),
               GRADIO_ANALYTICS_ENABLED="False")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    while time.perf_counter() - t0 < 300:
        if proc.poll() is not None:
            raise SystemExit(f"app.py exited with code {proc.returncode}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return proc, time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("app.py did not answer within 300 s")


def api_stream(url: str, tokens: int, panels: bool) -> tuple[float, float, int]:
    """(first token s, tokens/s, tokens) for one /chat call through gradio_client."""
    from gradio_client import Client

    client = Client(url, verbose=False)
    inputs = [PROMPT, [], *SETTINGS.values(), tokens, 0.0, panels, False]
    t0 = time.perf_counter()
    job = client.submit(*inputs, api_name="/chat")
    first = last = None
    length = 0
    for update in job:
        history = update[1]
        if not isinstance(history, list) or not history:
            continue
        reply = [m for m in history if m["role"] == "assistant" and not (m.get("metadata") or {}).get("title")]
        text = "".join(p.get("text", "") for p in reply[-1]["content"]) if reply else ""
        text = text.rstrip(" ▍")
        if len(text) > length:
            now = time.perf_counter()
            first = first or now
            last, length = now, len(text)
    final = job.result()
    client.close()
    match = re.search(r"Run \S+ · (\d+) tokens", str(final[1]))
    n = int(match.group(1)) if match else 0
    rate = (n - 1) / (last - first) if first and last and last > first and n > 1 else 0.0
    return (first - t0 if first else float("nan")), rate, n


def browser_session(url: str, tokens: int) -> dict:
    from playwright.sync_api import sync_playwright

    out = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        for visit in ("first", "second"):
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            t0 = time.perf_counter()
            page.goto(url, wait_until="load")
            box = page.locator("#spice-msg textarea")
            box.wait_for(state="visible", timeout=60_000)
            page.wait_for_function("() => { const t = document.querySelector('#spice-msg textarea');"
                                   " return t && !t.disabled; }", timeout=60_000)
            out[f"interactive_{visit}_s"] = time.perf_counter() - t0
            if visit == "second":
                page.get_by_text("Timing model and generation").click()
                n = page.locator("#ctl-max-new input[type=number]")
                n.fill(str(tokens))
                n.press("Tab")
                page.wait_for_timeout(500)
                box.fill(PROMPT)
                t_send = time.perf_counter()
                box.press("Enter")
                page.wait_for_function("() => { const r = document.querySelectorAll('#spice-chat .bot-row');"
                                       " return r.length && r[r.length - 1].innerText.replace('▍', '').trim().length"
                                       " > 0; }", timeout=120_000, polling=10)
                out["first_token_browser_s"] = time.perf_counter() - t_send
                page.wait_for_function("() => document.querySelector('#spice-chat').innerText.includes('Run ')",
                                       timeout=600_000, polling=200)
                stats = page.locator("#spice-stats").inner_text()
                m = re.search(r"streamed ([\d.]+)/s", stats)
                out["tokens_per_s_with_browser"] = float(m.group(1)) if m else float("nan")
            page.close()
        browser.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown results here")
    args = ap.parse_args()

    load_before = os.getloadavg()
    alone = engine_alone(args.tokens, args.repeats)
    port = free_port()
    proc, startup_s = start_app(port)
    url = f"http://127.0.0.1:{port}/"
    try:
        time.sleep(1.0)
        browser = browser_session(url, args.tokens) if Path(CHROMIUM).exists() else {}
        runs = {True: [], False: []}
        for _ in range(args.repeats):
            for panels in (True, False):
                runs[panels].append(api_stream(url, args.tokens, panels))
    finally:
        proc.terminate()
        proc.wait(30)
    load_after = os.getloadavg()

    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    rows = [
        ("startup: process start → server answers (includes loading the model)", f"{startup_s:.1f} s", "—"),
        ("page interactive after the server is up, first visit", f"{browser.get('interactive_first_s', float('nan')):.2f} s",
         "≤ 3 s"),
        ("page interactive, second visit", f"{browser.get('interactive_second_s', float('nan')):.2f} s", "≤ 3 s"),
        ("first token on screen after Enter (browser)", f"{browser.get('first_token_browser_s', float('nan')):.2f} s",
         "≤ 1 s"),
        ("first token through the API, panels on (median)", f"{med([r[0] for r in runs[True]]):.2f} s", "≤ 1 s"),
        ("tokens/s streamed through the API, every panel on (median)", f"{med([r[1] for r in runs[True]]):.1f}", "≥ 20"),
        ("tokens/s streamed through the API, panels off (median)", f"{med([r[1] for r in runs[False]]):.1f}", "—"),
        ("tokens/s of the engine alone, no app (median)", f"{med(alone):.1f}", "—"),
        ("tokens/s while a browser on the same machine renders every panel",
         f"{browser.get('tokens_per_s_with_browser', float('nan')):.1f}", "—"),
    ]
    n_tokens = sorted({r[2] for rs in runs.values() for r in rs})
    today = dt.date.today().isoformat()
    text = "\n".join([
        "# Web app speed on CPU",
        "",
        f"Measured {today} with `python benchmarks/app_speed.py --tokens {args.tokens} --repeats {args.repeats}`: "
        f"the shipped model (`assets/spice-mini/`), policy `spice`, greedy, {args.tokens} new tokens per reply "
        f"(replies ended after {', '.join(map(str, n_tokens))} tokens), `python app.py` in its own process.",
        f"Machine: {os.cpu_count()} CPU cores ({cpu_model_name()}), Python {platform.python_version()}; "
        f"load average {load_before[0]:.1f} before and {load_after[0]:.1f} after (other work shared the cores, "
        "so these are upper bounds on what an idle machine shows).",
        "All times are wall clock as a user sees them; the engine's modeled times shown in the app are not used.",
        "",
        "| measurement | result | target (issue 5) |",
        "|---|---|---|",
        *[f"| {a} | {b} | {c} |" for a, b, c in rows],
        "",
        "Per repeat (first token s, tokens/s, tokens): panels on "
        + "; ".join(f"{a:.2f}, {b:.1f}, {c}" for a, b, c in runs[True])
        + " · panels off " + "; ".join(f"{a:.2f}, {b:.1f}, {c}" for a, b, c in runs[False])
        + " · engine alone " + ", ".join(f"{x:.1f}" for x in alone) + " tokens/s.",
        "",
    ])
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
