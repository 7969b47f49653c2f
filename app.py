"""SPICE web app: chat with an offloaded MoE model, watch and tune the engine. Wiring only.

    python app.py [--model NAME|DIR] [--device cpu|cuda] [--threads N]     serves on 127.0.0.1:7860
    (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override host and port, as on Hugging Face Spaces; pages/serve_port.py)

Without --model the app serves every shipped model found in assets/ (spice-mini, spice-mini-qwen2):
the first at "/" and "/sweep", the others on pages of their own that a model picker opens
(pages/models.py); with one model there is no picker. Pages live in `pages/` (one module each); they
reach the engine only through `spice_core.api`. `build_demo(engine)` accepts any `EngineLike` (or a
list of them), so tests pass a fake. An address that is no page gets a small page linking the app's pages
(pages/links.py).
"""
from __future__ import annotations

import argparse
import atexit
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

from pages import serve_port

PORT_ENV_PROBLEM = serve_port.take_bad_port_env()     # before Gradio's import, which int()s the port (a traceback)

import gradio as gr  # noqa: E402

from pages import about, chat, guard, links, sweep, trace_explorer  # noqa: E402
from pages.chat_js import KEEP_STORE_JS  # noqa: E402
from pages.common import AppContext, quiet_page_loads  # noqa: E402
from pages.keyboard import KEYBOARD_JS  # noqa: E402
from pages.models import EngineSet, keep_nav, model_pages  # noqa: E402
from pages.owners import OWNER_JS  # noqa: E402
from pages.tuning import TuneBook  # noqa: E402
from spice_core.tools import args as cli_args  # noqa: E402

ROOT = Path(__file__).resolve().parent
CSS_PATH = ROOT / "assets" / "static" / "spice.css"
QUEUE_MAX_SIZE = 16       # waiting events across all sessions; beyond it the browser says the app is busy
DELETE_CACHE = (600, 3600)  # every 10 min, Gradio deletes files it cached (downloads, uploads) older than 1 h
MAX_FILE_SIZE = "2mb"     # uploads: the app takes none (pages/guard.py refuses the route); a second guard
STATUS_INTERVAL_S = 2.0   # how often a page says what the engine is busy with
# Gradio 6.31's status tracker announces a finished event to screen readers as i18n("common.complete"), a key its
# own translations lack (they have common.loading and common.error; "Complete" sits under chatbot.complete), so the
# live region read out "common.complete". The app's translation fills that key; other locales fall back to English.
I18N = gr.I18n(en={"common.complete": "Complete"})


def build_app(engine=None, *, max_queue: int = QUEUE_MAX_SIZE, orphan_after_s: float = 5.0,
              export_root: Path | None = None) -> tuple[gr.Blocks, AppContext]:
    """The Blocks app and its context (run registry, runner, exports). ``engine``: one `EngineLike`, a list of
    them (a chat and a sweep page each, behind a model picker; the first is the default), or None: every
    shipped model in assets/."""
    engines = list(engine) if isinstance(engine, (list, tuple)) else [engine] if engine is not None \
        else load_engines(None, None)
    from spice_core.trace.tensorboard import warm_profiler_template
    warm_profiler_template()      # torch.profiler is process-wide: record its template before any generation runs
    ctx = AppContext.create(engines[0] if len(engines) == 1 else EngineSet(engines), orphan_after_s=orphan_after_s,
                            export_root=export_root or default_export_root())
    atexit.register(ctx.exports.cleanup)
    pages = model_pages([e.info() for e in engines])
    if len(engines) > 1:
        ctx.models = pages
    contexts = [ctx] if len(engines) == 1 else [ctx.for_model(e, p, pages) for e, p in zip(engines, pages)]
    tunes = TuneBook()      # the tuner's picks and the sweep's hand-offs to the chat, for every page
    with gr.Blocks(title="SPICE · offloaded MoE chat", delete_cache=DELETE_CACHE) as demo:
        chats = [_chat_page(contexts[0], tunes)]
    for c, p in zip(contexts[1:], pages[1:]):
        with demo.route(f"Chat · {p.name}", "/" + p.chat_path, show_in_navbar=False):
            chats.append(_chat_page(c, tunes))
    with demo.route("Trace explorer", "/trace"):
        trace_explorer.build(ctx)
        keep_nav(ctx.models)          # every page's navigation opens the chosen model's chat and sweep
    sweeps = []
    for c, p in zip(contexts, pages):
        with demo.route("Sweep" if not c.key else f"Sweep · {p.name}", "/" + p.sweep_path, show_in_navbar=not c.key):
            sweeps.append(sweep.build(c, tunes))
            keep_nav(c.models, p.name)

    def on_unload(request: gr.Request) -> None:      # fires for whichever page's session went away
        for page in chats + sweeps:
            page.on_unload(request)

    demo.unload(on_unload)
    with demo.route("About", "/about"):
        about.build(ctx, ROOT / "docs" / "benchmarks", ROOT)
        keep_nav(ctx.models)
    quiet_page_loads(demo)          # a page load says nothing to screen readers (pages/common.py)
    demo.queue(default_concurrency_limit=1, max_size=max_queue)
    guard.install(demo)             # each visitor's share of that queue (pages/guard.py)
    return demo, ctx


def _chat_page(ctx: AppContext, tunes: TuneBook) -> chat.ChatPage:
    """One model's chat page, with the line under its message box that says what the shared engine is busy with."""
    page = chat.build(ctx, tunes)
    keep_nav(ctx.models, ctx.info.model_name)

    def status(request: gr.Request) -> str:
        return busy_text(ctx, request)

    gr.Timer(STATUS_INTERVAL_S).tick(status, outputs=[page.engine_status], queue=False,
                                     api_name="engine_status" + ctx.key, show_progress="hidden")
    return page


def load_engines(model: str | None, device: str | None, artifacts: str | None = None) -> list:
    """``model`` (a shipped model's name or a folder) alone, or every shipped model present in assets/.
    ``artifacts``: the folder of ``model``'s calibration artifacts when not beside it (`calibrate --out`)."""
    from spice_core.engine import SpiceEngine
    from spice_core.errors import ConfigError, ModelLoadError
    from spice_core.model.shipped import NAMES, model_argument, present_models

    if model:
        engine = SpiceEngine.load(model_argument(model), device=device, artifacts=artifacts)
        if engine.lm.tokenizer is None:            # every message would be refused: say so now, once
            raise ModelLoadError(f"{model}: has no tokenizer files, and the app chats in text: copy the checkpoint's "
                                 "tokenizer (tokenizer.json, tokenizer_config.json) into its folder")
        return [engine]
    if artifacts:
        raise ConfigError("--artifacts belongs to one model: pass --model too")
    present = present_models()
    if not present:
        raise ModelLoadError(f"no shipped model is in assets/ ({', '.join(NAMES)}): pass --model DIR or restore "
                             "assets/")
    return [SpiceEngine.load(m.folder, device=device) for m in present]


def busy_text(ctx: AppContext, request: gr.Request | None = None) -> str:
    """What a visitor waits for while the one engine works for someone else ("" when idle or when it works
    for this page: its chat replies are owned by its session)."""
    doing = ctx.runner.describe(request.session_hash if request is not None else None)
    if not doing:
        return ""
    return (f"⏳ **The engine is busy** with a {doing}. It serves one generation at a time for all "
            f"visitors; a message you send now waits for it (the queue shows your place).")


def default_export_root() -> Path:
    """A fresh folder for the exports inside Gradio's own file folder: Gradio then serves them where they
    are instead of copying each download into a folder of its own (copies that no budget counted and no
    shutdown removed)."""
    from gradio.utils import get_upload_folder

    base = Path(get_upload_folder())
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="spice-exports-", dir=base))


def install_sigterm_cleanup(ctx: AppContext) -> None:
    """On SIGTERM (how Spaces and containers stop an app): stop the running generation between tokens, remove
    the exports, exit 0. The exit skips the interpreter's teardown, which killed a generation thread inside
    torch ("terminate called without an active exception", a C++ abort)."""
    def handler(signum, frame):
        stream = ctx.runner.active
        if stream is not None:
            stream.cancel("closed")
            stream.join(5.0)
        ctx.exports.cleanup()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    signal.signal(signal.SIGTERM, handler)


def build_demo(engine=None, **kwargs) -> gr.Blocks:
    return build_app(engine, **kwargs)[0]


def launch_kwargs() -> dict:
    """Styling, the scripts every page's head holds, the missing status word and the not-found page for `launch()`
    (Gradio 6 takes theme and CSS there, not in Blocks)."""
    from starlette.middleware import Middleware

    return {"theme": gr.themes.Default(primary_hue="blue", neutral_hue="slate"), "css": CSS_PATH.read_text(),
            "head": OWNER_JS + KEYBOARD_JS + KEEP_STORE_JS, "max_file_size": MAX_FILE_SIZE, "i18n": I18N,
            "app_kwargs": {"middleware": [Middleware(guard.RequestGuard)],     # size limit, no uploads, headers
                           "exception_handlers": {404: links.not_found}},     # a wrong address: the app's pages
            # Never server-side rendering (Spaces turn it on through GRADIO_SSR_MODE): its Node server answers the
            # pages itself, past the guard above (no security headers, no size limit, no not-found page).
            "ssr_mode": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a shipped model's name (spice-mini, spice-mini-qwen2) or a "
                                                      "checkpoint folder (default: every shipped model, with a picker)")
    parser.add_argument("--device", type=cli_args.device, default=None,
                        help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--artifacts", default=None, metavar="DIR",
                        help="--model's calibration artifacts when not beside it: the folder `calibrate --out DIR` "
                             "wrote (e.g. for a read-only checkpoint)")
    from spice_core.exec.cpu_lane import available_cores

    parser.add_argument("--threads", type=cli_args.threads, default=max(1, available_cores() - 1),
                        help="torch CPU threads (default: all cores this process may use, within its container's "
                             "CPU quota, but one, which the web server keeps)")
    args = parser.parse_args()
    try:
        if PORT_ENV_PROBLEM:
            raise ValueError(PORT_ENV_PROBLEM)
        host, port = serve_port.asked_address()
    except ValueError as e:                     # a bad or taken port: before minutes of loading
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    import torch

    torch.set_num_threads(max(1, args.threads))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)     # Gradio polls itself at start-up
    from spice_core.errors import SpiceError
    try:
        engines = load_engines(args.model, args.device, args.artifacts)
    except SpiceError as e:                     # a bad --model or --device: one line, no traceback
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)
    demo, ctx = build_app(engines)
    install_sigterm_cleanup(ctx)
    demo.launch(server_name=host, server_port=port, **launch_kwargs())


if __name__ == "__main__":
    main()
