"""SPICE web app: chat with an offloaded MoE model, watch and tune the engine. Wiring only.

    python app.py [--model DIR] [--device cpu|cuda] [--threads N]     serves on 127.0.0.1:7860
    (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override host and port, as on Hugging Face Spaces)

Pages live in `pages/` (one module each); they reach the engine only through `spice_core.api`.
`build_demo(engine)` accepts any `EngineLike`, so tests pass a fake.
"""
from __future__ import annotations

import argparse
import atexit
import logging
import os
import signal
import sys
from pathlib import Path

import gradio as gr

from pages import about, chat, sweep, trace_explorer
from pages.common import AppContext
from pages.owners import OWNER_JS

ROOT = Path(__file__).resolve().parent
CSS_PATH = ROOT / "assets" / "static" / "spice.css"
QUEUE_MAX_SIZE = 16       # waiting events across all sessions; beyond it the browser says the app is busy
DELETE_CACHE = (600, 3600)  # every 10 min, Gradio deletes files it cached (downloads, uploads) older than 1 h
MAX_FILE_SIZE = "2mb"     # uploads: the app takes none, so any upload is refused beyond this
STATUS_INTERVAL_S = 2.0   # how often a page says what the engine is busy with


def build_app(engine=None, *, max_queue: int = QUEUE_MAX_SIZE, orphan_after_s: float = 5.0,
              export_root: Path | None = None) -> tuple[gr.Blocks, AppContext]:
    """The Blocks app and its context (engine, runner, exports). ``engine=None`` loads the shipped model."""
    if engine is None:
        from spice_core.engine import SpiceEngine
        engine = SpiceEngine.load()
    from spice_core.trace.tensorboard import warm_profiler_template
    warm_profiler_template()      # torch.profiler is process-wide: record its template before any generation runs
    ctx = AppContext.create(engine, orphan_after_s=orphan_after_s, export_root=export_root)
    atexit.register(ctx.exports.cleanup)
    with gr.Blocks(title="SPICE · offloaded MoE chat", delete_cache=DELETE_CACHE) as demo:
        page = chat.build(ctx)
        engine_status = gr.Markdown("", elem_id="engine-status", elem_classes=["spice-note"])
        gr.Timer(STATUS_INTERVAL_S).tick(lambda: busy_text(ctx), outputs=[engine_status], queue=False,
                                         api_name="engine_status", show_progress="hidden")
    with demo.route("Trace explorer", "/trace"):
        trace_explorer.build(ctx)
    with demo.route("Sweep", "/sweep"):
        sweep_page = sweep.build(ctx)

    def on_unload(request: gr.Request) -> None:      # fires for whichever page's session went away
        page.on_unload(request)
        sweep_page.on_unload(request)

    demo.unload(on_unload)
    with demo.route("About", "/about"):
        about.build(ctx, ROOT / "docs" / "benchmarks", ROOT)
    demo.queue(default_concurrency_limit=1, max_size=max_queue)
    return demo, ctx


def busy_text(ctx: AppContext) -> str:
    """What a visitor waits for while the one engine works for someone else ("" when idle)."""
    doing = ctx.runner.describe()
    if not doing:
        return ""
    return (f"⏳ **The engine is busy** with a {doing}. It serves one generation at a time for all "
            f"visitors; a message you send now waits for it (the queue shows your place).")


def install_sigterm_cleanup(ctx: AppContext) -> None:
    """On SIGTERM (how Spaces and containers stop an app) remove the exports, then exit normally."""
    def handler(signum, frame):
        ctx.exports.cleanup()
        sys.exit(0)

    signal.signal(signal.SIGTERM, handler)


def build_demo(engine=None, **kwargs) -> gr.Blocks:
    return build_app(engine, **kwargs)[0]


def launch_kwargs() -> dict:
    """Styling for `launch()` (Gradio 6 takes theme and CSS there, not in Blocks)."""
    return {"theme": gr.themes.Default(primary_hue="blue", neutral_hue="slate"), "css": CSS_PATH.read_text(),
            "head": OWNER_JS, "max_file_size": MAX_FILE_SIZE}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the shipped model)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                        help="torch CPU threads (default: all cores but one, which the web server keeps)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(max(1, args.threads))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)     # Gradio polls itself at start-up
    engine = None
    if args.model or args.device:
        from spice_core.engine import SpiceEngine
        engine = SpiceEngine.load(args.model, device=args.device)
    demo, ctx = build_app(engine)
    install_sigterm_cleanup(ctx)
    demo.launch(**launch_kwargs())


if __name__ == "__main__":
    main()
