"""More than one model in one app: a chat and a sweep page per model, a picker between them, and one
run registry over all of them for the trace explorer and the exports.

    engines ─► ModelPage per engine: "/" and "/sweep" for the first (the default), hidden routes
               "/<name>" and "/sweep-<name>" for the others, each page built on its own AppContext
               (its engine and info) sharing the runner, the run book, the sweeps and the exports
            ─► EngineSet: list_runs / get_summary / get_events / baselines / export_* of whichever engine
               holds the run (run ids are unique across engines), for the trace explorer and About
    picker  ─► a dropdown atop the chat and sweep pages, shown only with more than one model: picking
               opens that model's page (a page is built for one model: its controls, panels and
               limits come from that model's info); the chat's picker first hands the visitor's settings
               to the other model's chat (SwitchBook; pages.chat_switch applies them there)
    nav_js  ─► on every page, the navigation bar's chat and sweep links open the chosen model's pages (the
               last model page this browser opened), not always the default model's

Why pages per model rather than one page that swaps its engine: every visitor shares the engines, so a
switch must be per visitor, and a page's components (layers in the panels, LoRE ranks, context length)
are sized from one model's info when the page is built. Knows the engine only through `spice_core.api`.
"""
from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from spice_core.api import EngineInfo, EngineLike, RunSettings, RunSummary, own_shape
from spice_core.errors import SpiceError


@dataclass(frozen=True)
class ModelPage:
    """Where one model's pages live and how the picker names it."""

    info: EngineInfo
    chat_path: str          # "" for the default model's main page, else its name
    sweep_path: str         # "sweep", or "sweep-<name>"
    key: str                # "" for the default model, "_<name>" otherwise: API names and browser storage

    @property
    def name(self) -> str:
        return self.info.model_name

    @property
    def label(self) -> str:
        shape = own_shape(self.info)
        return f"{self.name} · {shape} routing" if shape else self.name


def model_pages(infos: list[EngineInfo]) -> tuple[ModelPage, ...]:
    """One ModelPage per engine, the first at the app's own paths; names must differ (they are paths)."""
    names = [i.model_name for i in infos]
    if len(set(names)) != len(names):
        raise SpiceError(f"two models share a name ({', '.join(names)}): the app tells models apart by folder name")
    out = []
    for n, info in enumerate(infos):
        slug = re.sub(r"[^A-Za-z0-9_-]+", "-", info.model_name).strip("-") or f"model{n}"
        out.append(ModelPage(info, "" if n == 0 else slug, "sweep" if n == 0 else f"sweep-{slug}",
                             "" if n == 0 else "_" + slug.replace("-", "_")))
    return tuple(out)


def go_js(pages: tuple[ModelPage, ...], page: str) -> str:
    """A js function of the picked model's name that opens its ``page`` ("chat" or "sweep")."""
    paths = {p.name: "./" + (p.chat_path if page == "chat" else p.sweep_path) for p in pages}
    return f"(m) => {{ const to = {json.dumps(paths)}[m]; if (to) window.location.assign(to); return []; }}"


def picker(pages: tuple[ModelPage, ...], current: str, page: str, *, navigate: bool = True) -> gr.Dropdown | None:
    """The model picker atop a chat (``page`` "chat") or sweep page: opens the picked model's same page
    (``navigate=False``: the caller wires that, after what must happen first). None (nothing drawn) with a
    single model."""
    if len(pages) < 2:
        return None
    box = gr.Dropdown([(p.label, p.name) for p in pages], value=current, label="Model", elem_id=f"{page}-model",
                      info="each model has its own page: picking one opens it")
    if navigate:
        box.change(None, inputs=[box], js=go_js(pages, page), queue=False, api_visibility="private",
                   show_progress="hidden")
    return box


NAV_STORAGE_KEY = "spice-model"      # the model whose pages the navigation bar opens, in this browser


def nav_js(pages: tuple[ModelPage, ...], current: str | None) -> str:
    """A page-load js function: on a model's page (``current``, its name) remember that model; on any page, point
    the navigation bar's links to the default model's chat and sweep at the remembered model's. The bar is
    Gradio's (links to the app's root and to "sweep"); it may be drawn after the load event or again later,
    so the links are fixed as it appears and whenever it changes."""
    paths = {p.name: {"chat": p.chat_path, "sweep": p.sweep_path} for p in pages}
    default = {"chat": pages[0].chat_path, "sweep": pages[0].sweep_path} if pages else {}
    return r"""() => {
  const PATHS = %s, DEFAULT = %s, HERE = %s, KEY = %s;
  let chosen = HERE;
  try {
    if (HERE) localStorage.setItem(KEY, HERE); else chosen = localStorage.getItem(KEY);
  } catch (e) { /* storage blocked: the bar keeps its links */ }
  const to = PATHS[chosen];
  if (!to) return [];
  const root = ((window.gradio_config && window.gradio_config.root) || location.origin).replace(/\/+$/, '');
  const rootPath = new URL(root + '/').pathname;
  const fix = (nav) => {
    for (const a of nav.querySelectorAll('a[href]')) {
      const url = new URL(a.href, location.href);
      if (url.origin !== location.origin || !url.pathname.startsWith(rootPath)) continue;
      const rest = url.pathname.slice(rootPath.length).replace(/\/+$/, '');
      const page = rest === DEFAULT.chat ? 'chat' : rest === DEFAULT.sweep ? 'sweep' : null;
      const want = page && root + '/' + to[page];
      if (want && a.href !== want) a.href = want;
    }
  };
  let tries = 0;
  const find = () => {
    const nav = document.querySelector('nav');
    if (!nav) { if (++tries < 100) setTimeout(find, 50); return; }
    fix(nav);
    new MutationObserver(() => fix(nav)).observe(nav, {subtree: true, childList: true, attributes: true,
                                                     attributeFilter: ['href']});
  };
  find();
  return [];
}""" % (json.dumps(paths), json.dumps(default), json.dumps(current), json.dumps(NAV_STORAGE_KEY))


def keep_nav(pages: tuple[ModelPage, ...], current: str | None = None) -> None:
    """On the page being built (inside its route), run `nav_js` at load; nothing with a single model."""
    root = gr.context.Context.root_block
    if len(pages) > 1 and root is not None:
        root.load(None, js=nav_js(pages, current), queue=False, api_visibility="private", show_progress="hidden")


MAX_SWITCHES = 256      # hand-offs kept at once (a visitor who never arrives must not grow the book)


class SwitchBook:
    """Settings on their way from one model's chat page to another's (pages.chat_switch), per visitor and the
    target page's key, until that page takes them; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, str], object] = OrderedDict()

    def keep(self, owner: str, key: str, value) -> None:
        with self._lock:
            self._kept.pop((owner, key), None)
            self._kept[(owner, key)] = value
            while len(self._kept) > MAX_SWITCHES:
                self._kept.popitem(last=False)

    def take(self, owner: str, key: str):
        with self._lock:
            return self._kept.pop((owner, key), None) if owner else None


class EngineSet:
    """The run registry of several engines as one `EngineLike` (what the trace explorer and the exports read).
    Generation goes to one engine through its own page; here ``start_*`` and ``info`` are the first's."""

    def __init__(self, engines: list[EngineLike]) -> None:
        self.engines = list(engines)

    def info(self) -> EngineInfo:
        return self.engines[0].info()

    def infos(self) -> list[EngineInfo]:
        return [e.info() for e in self.engines]

    def start_chat(self, messages: list[dict], settings: RunSettings, *, min_reply_tokens: int = 1):
        return self.engines[0].start_chat(messages, settings, min_reply_tokens=min_reply_tokens)

    def start_prompt(self, prompt: str, settings: RunSettings):
        return self.engines[0].start_prompt(prompt, settings)

    def list_runs(self) -> list[RunSummary]:
        return [s for e in self.engines for s in e.list_runs()]

    def _holder(self, run_id: str) -> EngineLike:
        for e in self.engines:
            if any(s.run_id == run_id for s in e.list_runs()):
                return e
        return self.engines[0]           # it raises the engine's own "unknown or expired" error

    def get_summary(self, run_id: str) -> RunSummary:
        return self._holder(run_id).get_summary(run_id)

    def get_events(self, run_id: str) -> list:
        return self._holder(run_id).get_events(run_id)

    def get_steps(self, run_id: str) -> list:
        return self._holder(run_id).get_steps(run_id)

    def baselines(self, run_id: str) -> dict:
        return self._holder(run_id).baselines(run_id)

    def export_chrome_trace(self, run_id: str, out_dir: Path) -> Path:
        return self._holder(run_id).export_chrome_trace(run_id, out_dir)

    def export_chrome_trace_gz(self, run_id: str, out_dir: Path) -> Path:
        return self._holder(run_id).export_chrome_trace_gz(run_id, out_dir)

    def export_tensorboard_zip(self, run_id: str, out_dir: Path) -> Path:
        return self._holder(run_id).export_tensorboard_zip(run_id, out_dir)

    def export_csv(self, run_id: str, out_dir: Path) -> Path:
        return self._holder(run_id).export_csv(run_id, out_dir)
